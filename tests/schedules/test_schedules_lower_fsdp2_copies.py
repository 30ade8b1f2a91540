"""FSDP2's memory-bound copies (simgrid.schedules.lower.fsdp2_copies) and where the ZeRO-3 lowering charges them.

Byte counts are worked out by hand from torch's FSDP2 code as the module docstring cites it: copy-in = cast of
the fp32 shard to bf16 (read 4, write 2) + foreach copy into the send slice (read 2, write 2); copy-out = read
and write of the whole gathered unit; after the reduce-scatter: cast of the shard back to fp32 when reducing in
bf16, ``grad += new`` (read 4 + 4, write 4) from the second micro-batch, fp16's pre- and post-division."""

from __future__ import annotations

from simgrid.ir.ops import Collective, Compute, Op
from simgrid.layout.spec import Layout
from simgrid.model.params import layer_params, param_count
from simgrid.model.spec import ModelSpec
from simgrid.schedules.build import build_program
from simgrid.schedules.lower.fsdp2_copies import CopyCost, copy_in, copy_out, fp16_divide_factors, post_reduce

MODEL = ModelSpec(name="fsdp2-copies-test", num_layers=2, hidden_size=256, num_heads=4, vocab_size=1024,
                  seq_length=128, tied_embeddings=False)
"""Blocks: 0 embedding, 1-2 layer 0, 3-4 layer 1, 5 head; FSDP2 units: root (0, 5), (1, 2), (3, 4)."""


def _layout(**kw: object) -> Layout:
    return Layout(**{"dp": 2, "zero": 3, "zero_impl": "fsdp2", "global_batch_size": 2, **kw})  # type: ignore[arg-type]


def _compute(layout: Layout) -> list[Compute]:
    ops: tuple[Op, ...] = build_program(MODEL, layout, granularity="block").ranks[0]  # type: ignore[assignment]
    return [op for op in ops if isinstance(op, Compute)]


def test_copy_in_casts_then_copies_the_local_shard() -> None:
    """1000 parameters over 4 ranks: a 250-element shard; bf16 with fp32 master: 250 x (4 + 2) cast + 250 x 2 x 2
    copy; fp32 training has no cast."""
    assert copy_in(1000, _layout(dp=4, global_batch_size=4)) == CopyCost(hbm_bytes=250 * 6 + 250 * 4, kernels=2)
    assert copy_in(1000, _layout(dp=4, global_batch_size=4, precision="fp32")) == CopyCost(hbm_bytes=2000, kernels=1)
    assert copy_out(1000, _layout(dp=4, global_batch_size=4)) == CopyCost(hbm_bytes=4000, kernels=1)


def test_fp16_divide_factors_follow_torch_loop() -> None:
    """The pre-divide factor doubles while it divides N and N / factor > factor: 2 -> (2, 1), 8 -> (4, 2),
    64 -> (8, 8)."""
    assert fp16_divide_factors(2) == (2, 1.0)
    assert fp16_divide_factors(8) == (4, 2.0)
    assert fp16_divide_factors(64) == (8, 8.0)


def test_post_reduce_work_by_reduce_dtype_and_micro_batch() -> None:
    """fp32 reduce (NCCL AVG, no cast): nothing on the first micro-batch, 12 bytes per shard element and one
    kernel per parameter tensor (layer 0: 2 norm + 4 weight + 4 bias tensors here) on later ones. bf16 reduce
    (AVG since pytorch#123362): the cast back to fp32, 2 + 4 bytes per shard element. fp16 over 8 ranks:
    pre-divide of the whole input by 4 (read + write 2 bytes) and post-divide of the shard by 2."""
    blocks = (1, 2)
    numel = 1000
    fp32 = _layout(reduce_dtype="fp32")
    assert post_reduce(MODEL, fp32, blocks, numel, accumulate=False) == CopyCost()
    assert post_reduce(MODEL, fp32, blocks, numel, accumulate=True) == CopyCost(hbm_bytes=12 * 500, kernels=10)
    assert post_reduce(MODEL, _layout(), blocks, numel, accumulate=False) == CopyCost(hbm_bytes=6 * 500, kernels=1)
    fp16 = _layout(dp=8, global_batch_size=8, precision="fp16")
    assert post_reduce(MODEL, fp16, blocks, numel, accumulate=False) == CopyCost(
        hbm_bytes=2 * 2 * 1000 + 2 * 2 * 125 + 6 * 125, kernels=3)


def test_lowering_charges_each_copy_to_the_compute_op_it_runs_beside() -> None:
    """Per compute op, FSDP2 minus the same layout without ZeRO-3 (bf16 reduce, dp 2): R = root parameters,
    P = one layer's; copy-in 5 bytes per unit parameter, copy-out 4, post-reduce cast 3.
    Forward: the embedding op issues and waits the root's gather and prefetches layer 0's (copy-in R, copy-out R,
    copy-in P); layer 0's first op copies out and prefetches layer 1; layer 1's copies out. Backward (head first,
    root resident): the head prefetches layer 1; layer 1's first op copies out and prefetches layer 0; layer 0's
    first op copies out and runs the post-reduce of layer 1's reduce-scatter; the embedding the post-reduce of
    layer 0's and, as no compute op follows before the optimizer step (finalize_backward waits for it), the
    root's own."""
    R = param_count(MODEL) - MODEL.num_layers * layer_params(MODEL)
    P = layer_params(MODEL)
    base = _compute(_layout(zero=0))
    fsdp2 = _compute(_layout())
    assert [(op.kind, op.block_start) for op in base] == [(op.kind, op.block_start) for op in fsdp2]
    deltas = {(op.kind, op.block_start): (op.hbm_bytes - b.hbm_bytes, op.kernels - b.kernels)
              for op, b in zip(fsdp2, base, strict=True) if op.kind != "OPT"}
    assert deltas == {
        ("F", 0): (5 * R + 4 * R + 5 * P, 5), ("F", 1): (4 * P + 5 * P, 3), ("F", 2): (0, 0),
        ("F", 3): (4 * P, 1), ("F", 4): (0, 0), ("F", 5): (0, 0),
        ("B", 5): (5 * P, 2), ("B", 4): (4 * P + 5 * P, 3), ("B", 3): (0, 0),
        ("B", 2): (4 * P + 3 * P, 2), ("B", 1): (0, 0), ("B", 0): (3 * P + 3 * R, 2),
    }


def test_collectives_are_unchanged_and_fp32_reduce_adds_no_post_reduce_on_one_micro_batch() -> None:
    """The copies add compute-stream work only: every all-gather and reduce-scatter keeps its bytes. With the
    fp32 reduce dtype and one micro-batch nothing follows a reduce-scatter (AVG divides, no cast, no
    accumulation), so the backward ops carry only copy-ins and copy-outs."""
    ops = build_program(MODEL, _layout(reduce_dtype="fp32"), granularity="block").ranks[0]
    colls = [(op.kind, op.label, op.bytes) for op in ops if isinstance(op, Collective)]
    R = param_count(MODEL) - MODEL.num_layers * layer_params(MODEL)
    P = layer_params(MODEL)
    assert ("all_gather", "b0+b5:param", 2 * R) in colls and ("reduce_scatter", "b1+b2:grad", 4 * P) in colls
    base = {(op.kind, op.block_start): op.hbm_bytes for op in _compute(_layout(zero=0, reduce_dtype="fp32"))}
    fsdp2 = {(op.kind, op.block_start): op.hbm_bytes for op in _compute(_layout(reduce_dtype="fp32"))}
    assert fsdp2[("B", 2)] - base[("B", 2)] == 4 * P and fsdp2[("B", 0)] == base[("B", 0)]


def test_later_micro_batches_accumulate_into_the_sharded_gradient() -> None:
    """Two micro-batches, fp32 reduce: the first micro-batch's reduce-scatters are followed by nothing, the
    second's by ``grad += new`` on each unit's shard (12 bytes per shard element): layer 1's lands on layer 0's
    first backward op of micro-batch 1, beside that op's copy-out (4 P)."""
    P = layer_params(MODEL)
    lay = _layout(reduce_dtype="fp32", global_batch_size=4)
    base = _layout(zero=0, reduce_dtype="fp32", global_batch_size=4)
    delta = {(op.kind, op.microbatch, op.block_start): op.hbm_bytes - b.hbm_bytes
             for op, b in zip(_compute(lay), _compute(base), strict=True) if op.kind == "B"}
    assert delta[("B", 0, 2)] == 4 * P
    assert delta[("B", 1, 2)] == 4 * P + 12 * (P // 2)
