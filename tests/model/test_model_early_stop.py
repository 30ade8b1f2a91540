"""simgrid.model.early_stop through block_cost: what a full recompute reruns under each ``checkpoint_impl``.

Shapes and bytes are written out from the Llama block (not read back from the code under test): the MLP's
second matrix is ``(T, h, f)``, the fused gate/up matrix ``(T, 2f, h)``, the closing residual add reads two and
writes one ``T x h`` bf16 tensor (``3 T h 2`` bytes) and a fused norm reads and writes one (``2 T h 2``).
"""

from __future__ import annotations

import dataclasses

import pytest

from simgrid.layout import Layout
from simgrid.model import block_cost, get_model
from simgrid.simulation import simulate

LLAMA = get_model("llama3-8b")
T, H, F = 2 * LLAMA.seq_length, LLAMA.hidden_size, LLAMA.ffn_size
ATTN, MLP = 1, 2


def _layout(impl: str = "reentrant", recompute: str = "full", **kw: object) -> Layout:
    return Layout(dp=8, zero=3, micro_batch_size=2, global_batch_size=16, recompute=recompute,  # type: ignore[arg-type]
                  flash_attention=True, checkpoint_impl=impl, **kw)  # type: ignore[arg-type]


def test_reentrant_full_recompute_reruns_the_whole_forward() -> None:
    """Megatron-LM's reentrant checkpoint (the default) reruns every GEMM, kernel and byte of both sub-blocks."""
    assert Layout().checkpoint_impl == "reentrant"
    for block in (ATTN, MLP):
        c = block_cost(LLAMA, _layout(), block)
        assert c.recompute_gemms == c.fwd_gemms
        assert (c.recompute_flops, c.recompute_hbm_bytes, c.recompute_kernels) == (c.fwd_flops, c.fwd_hbm_bytes,
                                                                                   c.fwd_kernels)


def test_non_reentrant_full_recompute_stops_before_w2() -> None:
    """torchtitan's non-reentrant block checkpoint: the attention reruns whole; the MLP reruns the gate/up GEMM,
    its norm and SwiGLU but neither w2 (its input is the last saved tensor) nor the closing residual add. In
    torchtitan's separate linears that is 6 of the block's 7 GEMMs (wq wk wv wo w1 w3 rerun, w2 not)."""
    attn, mlp = block_cost(LLAMA, _layout("non-reentrant"), ATTN), block_cost(LLAMA, _layout("non-reentrant"), MLP)
    assert attn.recompute_gemms == attn.fwd_gemms and attn.recompute_hbm_bytes == attn.fwd_hbm_bytes
    assert mlp.fwd_gemms == ((T, 2 * F, H, 1), (T, H, F, 1))
    assert mlp.recompute_gemms == ((T, 2 * F, H, 1),)
    assert mlp.recompute_flops == pytest.approx(mlp.fwd_flops - 2 * T * H * F)
    assert mlp.recompute_hbm_bytes == mlp.fwd_hbm_bytes - 3 * T * H * 2
    assert mlp.recompute_kernels == mlp.fwd_kernels - 2  # w2 and the residual add
    linears = {"wq": H * H, "wk": H * 1024, "wv": H * 1024, "wo": H * H, "w1": H * F, "w3": H * F, "w2": F * H}
    rerun = attn.recompute_flops - attn.fused_attention_recompute_flops + mlp.recompute_flops
    assert rerun == pytest.approx(2 * T * sum(v for k, v in linears.items() if k != "w2"))


def test_non_reentrant_modules_skip_norms_residuals_and_output_projections() -> None:
    """NeMo AutoModel's per-module wrappers: the attention reruns QKV and the core but not its norm, o_proj or
    residual add; the MLP reruns gate/up and SwiGLU only."""
    lay = _layout("non-reentrant-modules")
    attn, mlp = block_cost(LLAMA, lay, ATTN), block_cost(LLAMA, lay, MLP)
    assert attn.recompute_gemms == attn.fwd_gemms[:1] and attn.fwd_gemms[-1] == (T, H, H, 1)
    assert attn.recompute_flops == pytest.approx(attn.fwd_flops - 2 * T * H * H)
    assert attn.fused_attention_recompute_flops == attn.fused_attention_fwd_flops  # the core reruns
    assert attn.recompute_hbm_bytes == attn.fwd_hbm_bytes - (2 + 3) * T * H * 2
    assert attn.recompute_kernels == attn.fwd_kernels - 3
    assert mlp.recompute_gemms == ((T, 2 * F, H, 1),)
    assert mlp.recompute_hbm_bytes == mlp.fwd_hbm_bytes - (2 + 3) * T * H * 2
    assert mlp.recompute_kernels == mlp.fwd_kernels - 3
    # each sub-block keeps its norm's input and its module's input
    assert attn.activation_bytes == mlp.activation_bytes == 2 * T * H * 2


def test_eager_rmsnorm_is_skipped_with_its_extra_passes() -> None:
    """With eager RMSNorm (36 bytes per element over 8 launches: x.float(), pow, mean, + eps, rsqrt, multiply,
    type_as, weight multiply; torchtitan models/norms.py) the per-module recompute leaves all of it out."""
    lay = _layout("non-reentrant-modules", kernel_fusion="eager")
    mlp = block_cost(LLAMA, lay, MLP)
    assert mlp.fwd_hbm_bytes - mlp.recompute_hbm_bytes == 36 * T * H + 3 * T * H * 2
    assert mlp.fwd_kernels - mlp.recompute_kernels == 8 + 1 + 1


def test_early_stop_leaves_memory_and_other_policies_unchanged() -> None:
    """What early stop skips is never saved: activations equal the reentrant ones; per-op checkpointing (always
    non-reentrant, early stop already modelled) and no recompute do not depend on the setting."""
    for block in (0, ATTN, MLP, 2 * LLAMA.num_layers + 1):
        assert (block_cost(LLAMA, _layout("non-reentrant"), block).activation_bytes
                == block_cost(LLAMA, _layout(), block).activation_bytes)
        for policy in ("none", "selective-op"):
            assert (block_cost(LLAMA, _layout("non-reentrant", policy), block)
                    == block_cost(LLAMA, _layout("reentrant", policy), block))


def test_executed_flops_follow_what_is_rerun() -> None:
    """HFU counts executed FLOPs: a non-reentrant step executes one w2 forward less per layer and micro-batch."""
    model = dataclasses.replace(get_model("tiny-gpt"), gated_mlp=False)
    base = Layout(dp=2, micro_batch_size=2, global_batch_size=8, recompute="full")
    lay = dataclasses.replace(base, checkpoint_impl="non-reentrant")
    before, after = (simulate(model, "dgx-h100-ndr", x).metrics for x in (base, lay))
    tokens, w2 = 2 * model.seq_length, model.ffn_size * model.hidden_size
    dropped = 2 * tokens * w2 * model.num_layers * base.num_microbatches
    step = (before.step_time_s, after.step_time_s)
    executed = before.hw_tflops_per_gpu * 1e12 * step[0], after.hw_tflops_per_gpu * 1e12 * step[1]
    assert executed[0] - executed[1] == pytest.approx(dropped, rel=1e-9)
    assert after.step_time_s < before.step_time_s
    assert after.tflops_per_gpu * step[1] == pytest.approx(before.tflops_per_gpu * step[0])  # MFU numerator
