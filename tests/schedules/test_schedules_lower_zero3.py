"""ZeRO-3 lowering as DeepSpeed and FSDP2 implement it: gather counts, prefetch depth, re-gathers under
recompute, reduce-scatter buckets, stage granularity (simgrid.schedules.lower.zero3).

Expected counts are worked out by hand in each test from the implementation's documented rule and the
model's tensor shapes, not read back from the pass."""

from __future__ import annotations

import re
from collections import Counter

import pytest
from schedule_helpers import TINY

from simgrid.errors import LayoutError
from simgrid.ir.ops import Alloc, Collective, Compute, Free, Op, Wait
from simgrid.layout.spec import Layout
from simgrid.model.spec import ModelSpec
from simgrid.schedules.build import build_program

WIDE = ModelSpec(name="wide-test", num_layers=4, hidden_size=8192, num_heads=64, vocab_size=51200,
                 seq_length=2048)
"""h = 8192: every weight is >= DeepSpeed's 5e7-element prefetch bucket (QKV 3h^2 = 201M, out h^2 = 67M,
fc1 and fc2 4h^2 = 268M, word embedding 51200 h = 419M, positions 2048 h = 16.8M), so each prefetch
is exactly one module; biases (<= 4h = 32768) and norms (2h) are under the 1e5 persistence threshold.
Blocks: 0 embedding, 1+2i attention and 2+2i MLP of layer i, 9 head (tied)."""


def _ops(model: ModelSpec, granularity: str = "block", **layout: object) -> tuple[Op, ...]:
    lay = Layout(**{"dp": 2, "zero": 3, "global_batch_size": 2, **layout})  # type: ignore[arg-type]
    return build_program(model, lay, granularity=granularity).ranks[0]  # type: ignore[arg-type]


def _gathers(ops: tuple[Op, ...]) -> list[Collective]:
    return [op for op in ops if isinstance(op, Collective) and op.purpose == "zero-param"]


def _blocks(label: str) -> list[int]:
    return [int(b) for b in re.findall(r"b(\d+)", label.split(":")[0])]


def test_deepspeed_gathers_every_module_once_per_use_it_does_not_keep() -> None:
    """No recompute: the forward gathers the 18 partitioned modules (word, positions, 4 per layer) and
    the head's tied word embedding again (its reuse lies 4 layers ahead, far beyond 1e9 elements): 19.
    The backward gathers all but the two modules reused within DeepSpeed's 1e9-element reuse distance
    across the forward/backward turn: the head's word embedding (reused at once) and the last layer's
    fc2 (only the 2 x 419M word-embedding uses lie between): 17. The position embedding (16.8M) is
    under the 5e7-element prefetch bucket, so the prefetch that takes it takes the next module too (QKV of
    layer 0 in the forward, the word embedding in the backward): 36 uses, 34 calls."""
    gathers = _gathers(_ops(WIDE))
    assert sum(op.count for op in gathers) == 19 + 17 - 2
    assert all(op.kind == "all_gather" for op in gathers)


def test_deepspeed_regathers_large_attention_weights_under_full_recompute() -> None:
    """A checkpointed layer recomputes its forward, then runs its backward. Between the recompute and
    the backward use of QKV lie 18 h^2 = 1.21e9 elements (out, fc1, fc2 recomputed, fc2, fc1, out
    backward), of the out projection 16 h^2 = 1.07e9: both beyond the 1e9 reuse distance, so released
    and gathered again; fc1 (8 h^2 = 0.54e9) and fc2 (0) stay. Per layer away from the edges: the
    attention block's 2 modules are gathered in the forward, for the recompute and again for the
    backward (6 calls), the MLP's in the forward and for the recompute (4); without recompute 4 and 4."""
    def per_block(recompute: str) -> Counter[int]:
        counts: Counter[int] = Counter()
        for op in _gathers(_ops(WIDE, recompute=recompute)):
            for block in _blocks(op.label):
                counts[block] += op.count
        return counts

    full, none = per_block("full"), per_block("none")
    for layer in range(3):  # the last layer sits next to the forward/backward turn
        attn, mlp = 1 + 2 * layer, 2 + 2 * layer
        assert (full[attn], full[mlp]) == (6, 4)
        assert (none[attn], none[mlp]) == (4, 4)


def test_deepspeed_small_modules_need_no_regather() -> None:
    """tiny-gpt (h 64): a layer is far below 1e9 elements, so nothing is released between the recompute
    and the backward; the whole model fits in one 5e7-element prefetch, so a handful of calls suffice."""
    full = sum(op.count for op in _gathers(_ops(TINY, recompute="full")))
    none = sum(op.count for op in _gathers(_ops(TINY)))
    assert full == none
    assert full < 10


def test_fsdp2_gathers_each_layer_in_forward_and_backward_and_the_root_once() -> None:
    """FSDP2 (fully_shard per layer plus the root): the root (embedding, final norm, tied output) once,
    each of the 4 layers in the forward and again in the backward (reshard_after_forward); recompute adds
    nothing (the backward's gather covers the recomputed forward)."""
    expected = Counter({"b0+b9:param": 1, **{f"b{1 + 2 * i}+b{2 + 2 * i}:param": 2 for i in range(4)}})
    for recompute in ("none", "full"):
        gathers = _gathers(_ops(TINY, zero_impl="fsdp2", recompute=recompute))
        assert Counter(op.label for op in gathers) == expected
        assert {op.count for op in gathers} == {1}


@pytest.mark.parametrize("depth", [1, 2])
def test_fsdp2_prefetches_depth_units_while_one_computes(depth: int) -> None:
    """Forward: when the root's gather has been waited, min(depth, 4) layer gathers are in flight; when
    layer i's has been waited, min(depth, 3 - i) more (the forward ends after layer 3)."""
    ops = _ops(TINY, zero_impl="fsdp2", zero3_prefetch_depth=depth)
    first_backward = next(i for i, op in enumerate(ops) if isinstance(op, Compute) and op.kind == "B")
    issued: list[str] = []
    waited: list[str] = []
    outstanding_after_wait: list[int] = []
    for op in ops[:first_backward]:
        if isinstance(op, Collective) and op.purpose == "zero-param":
            issued.append(op.handle)
        elif isinstance(op, Wait) and op.handle.startswith("zero3-param"):
            waited.append(op.handle)
            outstanding_after_wait.append(len([h for h in issued if h not in waited]))
    assert outstanding_after_wait == [min(depth, 4)] + [min(depth, 3 - i) for i in range(4)]


def test_fsdp2_reduce_scatters_each_unit_after_its_backward() -> None:
    """One reduce-scatter per layer as its backward ends (last layer first) and the root's last, after
    the embedding's backward; each right after the unit's final backward op."""
    ops = _ops(TINY, zero_impl="fsdp2")
    scatters = [(i, op) for i, op in enumerate(ops) if isinstance(op, Collective) and op.purpose == "zero-grad"]
    assert [op.label for _, op in scatters] == ["b7+b8:grad", "b5+b6:grad", "b3+b4:grad", "b1+b2:grad", "b0+b9:grad"]
    for index, op in scatters:
        producer = next(o for o in reversed(ops[:index]) if isinstance(o, Compute))
        assert producer.kind == "B" and producer.block_start == min(_blocks(op.label))


def test_deepspeed_reduce_scatters_per_bucket_of_5e8_elements() -> None:
    """Gradients enter the 5e8-element bucket in backward order (bias before weight, modules reversed).
    Per layer the bucket overflows twice: at fc1's weight (268M joining fc2's 268M) and at QKV's weight
    (201M joining fc1's 268M plus out's 67M); the embedding overflows at the word matrix (419M joining QKV
    201M + positions 17M) and the last bucket is flushed at the end: 4 x 2 + 2 = 10 calls per backward."""
    scatters = [op for op in _ops(WIDE) if isinstance(op, Collective) and op.purpose == "zero-grad"]
    assert sum(op.count for op in scatters) == 10
    covered = [b for op in scatters for b in _blocks(op.label)]
    assert sorted(covered) == list(range(10))  # every block's gradient reduced exactly once


@pytest.mark.parametrize(("model", "impl"), [(TINY, "deepspeed"), (TINY, "fsdp2"), (WIDE, "deepspeed"), (WIDE, "fsdp2")])
def test_every_compute_op_reads_gathered_parameters(model: ModelSpec, impl: str) -> None:
    """ALLOCs and FREEs pair up, and every compute op of a block runs while some gather covering that
    block has been waited and not yet freed (two micro-batches, full recompute, re-gathers included)."""
    ops = _ops(model, zero_impl=impl, recompute="full", global_batch_size=4)
    assert {op.name for op in ops if isinstance(op, Alloc)} == {op.name for op in ops if isinstance(op, Free)}
    covers: dict[str, list[int]] = {}
    resident: set[str] = set()
    for op in ops:
        if isinstance(op, Collective) and op.purpose == "zero-param":
            covers[op.handle] = _blocks(op.label)
        elif isinstance(op, Wait) and op.handle in covers:
            resident.add(op.handle)
        elif isinstance(op, Free):
            resident.discard(op.name)
        elif isinstance(op, Compute) and op.kind != "OPT":
            for block in range(op.block_start, op.block_end):
                assert any(block in covers[h] for h in resident), (op, block)


def test_stage_granularity_computes_per_gather_unit() -> None:
    """Above 64 ranks programs fold a stage into one op, but ZeRO-3 overlaps per unit: DeepSpeed's
    program is then the block-granularity one, FSDP2's has one compute op per layer and per root block."""
    assert _ops(TINY, "stage") == _ops(TINY, "block")
    forward = [op for op in _ops(TINY, "stage", zero_impl="fsdp2") if isinstance(op, Compute) and op.kind == "F"]
    assert [(op.block_start, op.block_end) for op in forward] == [(0, 1), (1, 3), (3, 5), (5, 7), (7, 9), (9, 10)]


def test_zero_impl_is_validated() -> None:
    """An unknown implementation is a LayoutError naming the field, the value and the choices."""
    with pytest.raises(LayoutError, match=r"zero_impl = 'megatron' is not one of deepspeed, fsdp2"):
        Layout(zero_impl="megatron")  # type: ignore[arg-type]


def test_fsdp2_fp32_reduce_dtype_doubles_every_bf16_reduce_scatter_and_its_buffer() -> None:
    """torchtitan's reduce_dtype = float32: the same reduce-scatters as reduce_dtype 'param', each moving and
    buffering (its reduce-scatter input) 4 bytes per gradient element instead of bf16's 2; the gathers and the
    unsharded gradients autograd writes (bf16 either way) are unchanged."""
    def scatters(ops: tuple[Op, ...]) -> list[Collective]:
        return [op for op in ops if isinstance(op, Collective) and op.purpose == "zero-grad"]

    plain = _ops(TINY, zero_impl="fsdp2")
    fp32 = _ops(TINY, zero_impl="fsdp2", reduce_dtype="fp32")
    assert [op.label for op in scatters(fp32)] == [op.label for op in scatters(plain)]
    assert [op.bytes for op in scatters(fp32)] == [2 * op.bytes for op in scatters(plain)]
    assert [op.bytes for op in _gathers(fp32)] == [op.bytes for op in _gathers(plain)]
    def grads(ops: tuple[Op, ...], unsharded: bool) -> dict[str, int]:
        return {op.name: op.bytes for op in ops if isinstance(op, Alloc) and op.name.startswith("zero3-grad")
                and (":unsharded" in op.name) == unsharded}

    assert grads(fp32, False) == {name: 2 * size for name, size in grads(plain, False).items()}
    assert grads(fp32, True) == grads(plain, True) and grads(plain, True)


def _compute_bytes(ops: tuple[Op, ...]) -> tuple[float, int]:
    """HBM bytes and launches of the forward and backward compute ops (the optimizer step left out)."""
    comp = [op for op in ops if isinstance(op, Compute) and op.kind != "OPT"]
    return sum(op.hbm_bytes for op in comp), sum(op.kernels for op in comp)


def test_fsdp2_copy_out_is_paid_on_the_compute_stream_once_per_gather() -> None:
    """FSDP2 copies each all-gather's output into the unsharded parameters on the compute stream (read + write
    2 bytes per bf16 element, one launch per gather), and its copy-in before it (cast + copy of the dp = 2 shard:
    (4 + 2 + 2 x 2) / 2 = 5 bytes per gathered parameter, two launches; simgrid.schedules.lower.fsdp2_copies).
    Without recompute the forward gathers the root (embedding, final norm, head: every parameter not in a layer)
    and each of the L layers, the backward each layer again (the root is kept): (4 + 5) x (all parameters + L x
    layer parameters) bytes and 3 x (1 + 2L) launches more than the same layout without ZeRO-3, plus, reducing
    in bf16, each unit's cast back to fp32 after its reduce-scatter (2 + 4 bytes per shard element, one launch).
    DeepSpeed gathers into the buffer its parameters view: no extra traffic."""
    from simgrid.model.params import layer_params, param_count

    model = ModelSpec(name="copy-out-test", num_layers=3, hidden_size=256, num_heads=4, vocab_size=1024,
                      seq_length=128, tied_embeddings=False)
    base = _compute_bytes(_ops(model, zero=0))
    fsdp2 = _compute_bytes(_ops(model, zero_impl="fsdp2"))
    deepspeed = _compute_bytes(_ops(model, zero_impl="deepspeed"))
    L = model.num_layers
    gathered = param_count(model) + L * layer_params(model)
    assert fsdp2[0] - base[0] == (2 * 2 + 5) * gathered + 3 * param_count(model)
    assert fsdp2[1] - base[1] == 3 * (1 + 2 * L) + (L + 1)
    assert deepspeed == base


def test_fsdp2_root_reduce_scatter_input_is_allocated_in_the_final_post_backward() -> None:
    """FSDP2 runs the root unit's post_backward from its final backward callback (its input, the token ids, needs
    no gradient), so the root's reduce-scatter input (fp32 here: embedding and output layer, 3.9 GiB for Llama 3
    8B) is allocated after the last backward op, the embedding's, not before the head's backward. Before it only
    autograd's bf16 gradients exist: the output layer's from the head's backward on, the embedding's from its
    own; they are freed once copied into the input, right as the reduce-scatter is issued."""
    model = ModelSpec(name="root-test", num_layers=2, hidden_size=256, num_heads=4, vocab_size=1024,
                      seq_length=128, tied_embeddings=False)  # blocks: 0 embedding, 1-4 layers, 5 head
    ops = _ops(model, zero_impl="fsdp2", reduce_dtype="fp32")
    backward = [i for i, op in enumerate(ops) if isinstance(op, Compute) and op.kind in ("B", "I", "W")]
    head, embedding = backward[0], backward[-1]
    assert ops[head].block_start == 5 and ops[embedding].block_start == 0  # type: ignore[union-attr]
    scatter = next(i for i, op in enumerate(ops) if isinstance(op, Collective) and op.label == "b0+b5:grad")
    handle = ops[scatter].handle  # type: ignore[union-attr]
    allocs = {op.name: i for i, op in enumerate(ops) if isinstance(op, Alloc)}
    assert embedding < allocs[handle] < scatter
    assert not any(isinstance(op, Compute) for op in ops[embedding + 1:scatter])
    unsharded = sorted((i, ops[i]) for name, i in allocs.items() if name.startswith(f"{handle}:unsharded"))
    assert [i for i, _ in unsharded] == [head - 1, embedding - 1]  # just before the ops that write them
    # The output layer's bf16 gradient is at least V x h x 2 bytes; the fp32 input is twice all the bf16 ones.
    assert unsharded[0][1].bytes >= 1024 * 256 * 2  # type: ignore[union-attr]
    assert ops[allocs[handle]].bytes == 2 * sum(op.bytes for _, op in unsharded)  # type: ignore[union-attr]
    frees = {op.name: i for i, op in enumerate(ops) if isinstance(op, Free)}
    assert all(scatter < frees[op.name] for _, op in unsharded)  # type: ignore[union-attr]
