"""Activation memory per schedule, the whole estimate, the fit verdict and "what would fit" suggestions."""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import pytest

from simgrid.errors import LayoutError
from simgrid.layout import Layout
from simgrid.memory import (
    activation_memory_bytes,
    comm_buffer_bytes,
    estimate_memory,
    inflight_microbatches,
    suggest_layouts,
)
from simgrid.model import get_model, param_count


@dataclass(frozen=True)
class FakeGPU:
    """Stands in for simgrid.hardware.GPUSpec: a name and a capacity."""

    name: str
    memory_bytes: int


RTX_4090 = FakeGPU("rtx-4090", 24 * 2**30)  # 24 GiB GDDR6X (NVIDIA datasheet)
A100_80 = FakeGPU("a100-80gb", 80 * 2**30)


def _gpt_layer_bytes(s: int, b: int, h: int, a: int) -> int:
    return 34 * s * b * h + 5 * a * s * s * b  # Korthikanti Table 2, no parallelism


def test_1f1b_first_stage_holds_pp_microbatches() -> None:
    """1F1B: rank r holds min(pp - r, m) micro-batches of its L/pp layers (+ embedding on rank 0)."""
    m = get_model("korthikanti-22b")  # 48 layers, h 6144, a 64, s 2048
    s, h, a = 2048, 6144, 64
    layout = Layout(pp=4, global_batch_size=16, schedule="1f1b")
    per_mb_layers = 12 * _gpt_layer_bytes(s, 1, h, a)
    embedding = 8 * s + s * h  # token ids + embedding dropout mask
    got = activation_memory_bytes(m, layout)
    assert got[0] == 4 * (per_mb_layers + embedding)
    assert got[1] == 3 * per_mb_layers and got[2] == 2 * per_mb_layers
    few = Layout(pp=4, global_batch_size=2, schedule="1f1b")
    assert activation_memory_bytes(m, few)[0] == 2 * (per_mb_layers + embedding)


def test_gpipe_holds_all_microbatches_and_no_pipeline_holds_one() -> None:
    """GPipe keeps all m micro-batches; without a pipeline only one is alive at a time."""
    m = get_model("gpt2-small")
    gpipe = Layout(pp=2, global_batch_size=6, schedule="gpipe")
    assert inflight_microbatches(gpipe, 0) == {0: 6}
    assert inflight_microbatches(Layout(global_batch_size=6), 0) == {0: 1}
    one = activation_memory_bytes(m, Layout(global_batch_size=1))[0]
    assert activation_memory_bytes(m, Layout(global_batch_size=8))[0] == one


def test_zb_h1_keeps_the_1f1b_peak() -> None:
    """ZB-H1 holds the same micro-batches as 1F1B (Qi et al. 2024)."""
    a = Layout(pp=4, global_batch_size=16, schedule="zb-h1")
    b = Layout(pp=4, global_batch_size=16, schedule="1f1b")
    assert [inflight_microbatches(a, r) for r in range(4)] == [inflight_microbatches(b, r) for r in range(4)]


@pytest.mark.parametrize(("pp", "vpp"), [(2, 2), (4, 2), (4, 3), (8, 4)])
def test_interleaved_first_rank_matches_korthikanti_factor(pp: int, vpp: int) -> None:
    """Rank 0 holds L (1 + (p-1)/(p*v)) layers' worth of activations (Korthikanti 2022, section 4.2.3)."""
    layers = pp * vpp * 2
    layout = Layout(pp=pp, vpp=vpp, schedule="interleaved-1f1b", global_batch_size=4 * pp)
    held = inflight_microbatches(layout, 0)
    layers_per_chunk = layers // (pp * vpp)
    held_layers = sum(count * layers_per_chunk for count in held.values())
    assert held_layers == layers * (1 + Fraction(pp - 1, pp * vpp))


def test_estimate_totals_and_breakdown() -> None:
    """Total = states + activations + buffers of the worst pipeline rank; breakdown adds up to the total."""
    m = get_model("gpt3-175b")
    layout = Layout(tp=8, pp=8, global_batch_size=64, recompute="selective", sequence_parallel=True)
    est = estimate_memory(m, layout, A100_80)
    assert est.total_bytes == est.model_states_bytes + est.activations_bytes + est.buffers_bytes
    assert sum(est.breakdown.values()) == est.total_bytes
    assert est.total_bytes == max(s.total_bytes for s in est.per_stage)
    assert len(est.per_stage) == 8 and est.capacity_bytes == 80 * 2**30
    assert est.fits is True
    assert estimate_memory(m, layout).fits is None and estimate_memory(m, layout).capacity_bytes is None
    data = est.to_dict()
    assert {"model_states_bytes", "activations_bytes", "total_bytes", "breakdown", "fits"} <= set(data)


def test_llama2_7b_full_finetune_does_not_fit_one_rtx_4090() -> None:
    """Adam full fine-tune of llama2-7b needs ~108 GB of model states alone: no fit on a 24 GiB card."""
    m = get_model("llama2-7b")
    est = estimate_memory(m, Layout(), RTX_4090)
    assert est.fits is False
    assert est.model_states_bytes == 16 * param_count(m)
    assert est.model_states_bytes > 100e9


def test_suggestions_for_llama2_7b_on_rtx_4090_fit() -> None:
    """There is a layout within 8 GPUs that fits, and every suggestion really does fit."""
    m = get_model("llama2-7b")
    suggestions = suggest_layouts(m, Layout(), RTX_4090, max_gpus=8)
    assert suggestions
    for text, layout, total in suggestions:
        assert estimate_memory(m, layout, RTX_4090).fits and total <= RTX_4090.memory_bytes
        assert "GPU" in text
    assert any(layout.zero == 3 for _, layout, _ in suggest_layouts(m, Layout(), RTX_4090, max_gpus=8, limit=20))


def test_suggestions_offer_flash_attention_when_scores_dominate() -> None:
    """llama2-7b at s = 4096, micro-batch 2, Adam offloaded, on one 80 GiB GPU: the unfused core's
    5 a s^2 b score bytes per layer push it past the capacity; a suggested recipe turns on flash
    attention alone and fits."""
    m = get_model("llama2-7b")
    a100 = FakeGPU("a100-80gb", 80 * 2**30)
    base = Layout(offload_optimizer=True, micro_batch_size=2, global_batch_size=2)
    assert not estimate_memory(m, base, a100).fits
    found = [(text, lay) for text, lay, _ in suggest_layouts(m, base, a100, max_gpus=1, limit=20)
             if lay.flash_attention]
    assert any(text == "1 GPU: flash attention" for text, _ in found)
    assert all(estimate_memory(m, lay, a100).fits for _, lay in found)


def test_no_suggestion_when_nothing_fits() -> None:
    """A 1T model on a single 24 GiB GPU has no fitting layout."""
    assert suggest_layouts(get_model("megatron-1t"), Layout(), RTX_4090, max_gpus=1) == []


def test_buffers() -> None:
    """DDP: two 25 MiB buckets; pipeline: act + grad in transit; ZeRO-3 by implementation (gpt2-small,
    h 768, 12 layers, vocab 50257, 1024 learned positions, tied, bf16):

    * DeepSpeed: the whole model's partitioned tensors fit in its 1e9-element reuse window, so every
      tensor of >= 1e5 elements is gathered at once (word and position embeddings; per layer QKV
      768 x 2304, out 768 x 768, fc1 and fc2 768 x 3072; norms and biases stay whole), and the two
      5e8-element reduce buckets exceed its 124,439,808 gradients, so all of them. The tied head's final
      norm (2 x 768) is gathered whole as well: the head has no partitioned tensor of its own, and the
      executor, which shards every tensor, must gather the block it runs.
    * FSDP2: the root (embeddings, final norm) plus two layers gathered; gradients likewise.
    """
    m = get_model("gpt2-small")
    assert comm_buffer_bytes(m, Layout()) == {}
    assert comm_buffer_bytes(m, Layout(dp=2)) == {"dp-buckets": 2 * 25 * 2**20}
    assert comm_buffer_bytes(m, Layout(pp=2, global_batch_size=2)) == {"pp-p2p": 2 * 1024 * 768 * 2}
    partitioned = 50257 * 768 + 1024 * 768 + 12 * (768 * 2304 + 768 * 768 + 2 * 768 * 3072)
    assert comm_buffer_bytes(m, Layout(dp=2, zero=3)) == {"zero3-gather": 2 * (partitioned + 2 * 768),
                                                          "zero3-grads": 2 * 124_439_808}
    root = 50257 * 768 + 1024 * 768 + 2 * 768
    layer = 2 * 2 * 768 + 768 * 2304 + 2304 + 768 * 768 + 768 + 2 * 768 * 3072 + 3072 + 768
    assert comm_buffer_bytes(m, Layout(dp=2, zero=3, zero_impl="fsdp2")) == {
        "zero3-gather": 2 * (root + 2 * layer), "zero3-grads": 2 * (root + 2 * layer)}


def test_gpu_without_capacity_is_rejected() -> None:
    """A GPU object with a non-positive memory_bytes is a LayoutError naming it."""
    with pytest.raises(LayoutError, match="memory_bytes = 0"):
        estimate_memory(get_model("tiny-gpt"), Layout(), FakeGPU("broken", 0))


def test_recompute_adds_one_layer_of_recomputed_activations() -> None:
    """Full recompute: checkpoints of held micro-batches + one layer rebuilt (34sbh + 5as^2b - 2sbh)."""
    m = get_model("korthikanti-22b")
    s, h, a = 2048, 6144, 64
    layout = Layout(global_batch_size=1, recompute="full")
    layers = 48 * 2 * s * h
    embed, head = 8 * s + s * h, 2 * s * h * 2 + 4 * s * 51200
    rebuilt = _gpt_layer_bytes(s, 1, h, a) - 2 * s * h
    assert activation_memory_bytes(m, layout) == [layers + embed + head + rebuilt]
    selective = Layout(global_batch_size=1, recompute="selective")
    stored = 48 * 34 * s * h + embed + head
    assert activation_memory_bytes(m, selective) == [stored + 5 * a * s * s]


def test_selective_op_activation_memory_sits_between_full_and_none_with_its_rerun_working_set() -> None:
    """Per-op checkpointing keeps more than full recompute and less than none; the recompute working set is
    one layer's none-minus-selective-op bytes (what the rerun rebuilds at once)."""
    model = get_model("llama3-8b")

    def peak(recompute: str) -> int:
        lay = Layout(dp=8, zero=3, zero_impl="fsdp2", micro_batch_size=1, global_batch_size=8, flash_attention=True,
                     recompute=recompute)  # type: ignore[arg-type]
        return activation_memory_bytes(model, lay)[0]

    full, op, none = peak("full"), peak("selective-op"), peak("none")
    assert full < op < none
    from simgrid.memory.activations import recompute_working_bytes
    from simgrid.model import block_cost

    lay = Layout(dp=8, zero=3, zero_impl="fsdp2", micro_batch_size=1, global_batch_size=8, flash_attention=True,
                 recompute="selective-op")
    plain = Layout(dp=8, zero=3, zero_impl="fsdp2", micro_batch_size=1, global_batch_size=8, flash_attention=True)
    layer = sum(block_cost(model, plain, b).activation_bytes - block_cost(model, lay, b).activation_bytes for b in (1, 2))
    assert recompute_working_bytes(model, lay) == layer


def test_fsdp2_fp32_reduce_dtype_doubles_the_gradient_buffers() -> None:
    """FSDP2 casts gradients to fp32 before reducing: its reduce-scatter buffers hold 4 bytes per element."""
    model = get_model("llama3-8b")
    base = Layout(dp=8, zero=3, zero_impl="fsdp2", micro_batch_size=1, global_batch_size=8, flash_attention=True)
    fp32 = Layout(dp=8, zero=3, zero_impl="fsdp2", micro_batch_size=1, global_batch_size=8, flash_attention=True,
                  reduce_dtype="fp32")
    assert comm_buffer_bytes(model, fp32)["zero3-grads"] == 2 * comm_buffer_bytes(model, base)["zero3-grads"]
