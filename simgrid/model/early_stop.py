"""What a full activation checkpoint does not rerun, by implementation (``Layout.checkpoint_impl``).

``reentrant`` (Megatron-LM's ``tensor_parallel.checkpoint``, a ``torch.autograd.Function`` whose backward
reruns the checkpointed function whole): the recompute is the layer's whole forward; nothing is skipped.

``non-reentrant`` (``torch.utils.checkpoint(use_reentrant=False)``, which torchtitan applies to each whole
TransformerBlock through ``ptd_checkpoint_wrapper(..., checkpoint_impl=CheckpointImpl.NO_REENTRANT)``:
``torchtitan/parallelisms/parallelize_llama.py`` lines 73-80 and 226-229 at 528cab9; at 9dec370 and 820504e
``_apply_ac_to_transformer_block`` calls ``ptd_checkpoint_wrapper(module, preserve_rng_state=False)``, lines 234
and 238, whose ``checkpoint_impl`` defaults to ``NO_REENTRANT``: torch 2.13.0
``torch/distributed/algorithms/_checkpoint/checkpoint_wrapper.py`` lines 133 and 198): the recompute runs under a saved-tensor pack
hook that counts the tensors it saves again and raises ``_StopRecomputationError`` once the count equals the
number the forward saved, if ``early_stop`` is on, which it is by default (torch 2.13.0
``torch/utils/checkpoint.py``: ``early_stop: bool = True`` in ``checkpoint``, line 362; ``_recomputation_hook``
lines 1088-1131; ``set_checkpoint_early_stop`` lines 777-804 turns it off, and neither framework calls it). An
autograd node packs its saved inputs when it is built, before its kernel runs, so the last GEMM of the block,
the MLP's second matrix (``w2``), whose input is the last tensor the forward saved, is not rerun, and neither
is anything after it: the closing residual add (with its bias and dropout in a GPT layer) and, under tensor
parallelism, the reduce-scatter (or all-reduce) of the layer output. The attention sub-block reruns whole
(the MLP's norm saves its input, the attention's residual sum). Counted, not only read: for torchtitan's
Llama block on torch 2.13 the recompute runs 6 of the block's 7 ``mm`` (``benchmarks/dtensor_ac_collectives.py``,
docs/design.md session 9). Under torch.compile the checkpoint becomes a ``tag_activation_checkpoint`` region
whose nodes the min-cut partitioner recomputes only where the backward needs them
(``torch/_functorch/partitioners.py``), and no gradient needs ``w2``'s output: the same 6 of 7, as the
benchmark also counts with the aot_eager backend.

``non-reentrant-modules`` (NeMo AutoModel with ``enable_compile``: each layer's ``self_attn`` and ``mlp`` in
its own ``checkpoint_wrapper(..., checkpoint_impl=CheckpointImpl.NO_REENTRANT)``,
``nemo_automodel/components/distributed/parallelizer.py`` lines 230-239 at 2013a4d): the norms and the residual
adds sit outside the checkpointed modules (``LlamaDecoderLayer``, ``components/models/llama/model.py``), so they
are never rerun, and the same early stop leaves out each module's last GEMM, ``o_proj`` (line 151) and
``down_proj`` (line 170), with any collective after it.

The memory a layer keeps is unchanged by early stop (the skipped outputs are not saved tensors), and so is
the peak of the recompute; only the per-module wrapping keeps more (both norms' inputs and both modules'
inputs, :mod:`simgrid.model.activations`). A MoE MLP sub-block's recompute stays whole under every
implementation: its GEMMs are listed since session 14 (:func:`simgrid.model.gemms.moe_gemms`), but which of its
outputs a non-reentrant checkpoint may skip (combine, unpermute, shared expert) is not worked out here.
"""

from __future__ import annotations

from typing import NamedTuple

from simgrid.layout.spec import Layout
from simgrid.model.blocks import block_kind
from simgrid.model.kernels import BlockKernels
from simgrid.model.moe import is_moe_block
from simgrid.model.spec import ModelSpec


class Skipped(NamedTuple):
    """What a sub-block's full recompute leaves out of its forward."""

    last_gemm: bool
    """The sub-block's last forward GEMM (attention output projection or MLP second matrix) and the
    tensor-parallel collective of its output are not rerun."""
    hbm_bytes: int
    """Bytes of the memory-bound kernels not rerun."""
    kernels: int
    """Launches not rerun, the GEMM's included."""


NOTHING = Skipped(False, 0, 0)


def skips_last_gemm(model: ModelSpec, layout: Layout, block: int) -> bool:
    """Whether ``layout.checkpoint_impl``'s early stop leaves sub-block ``block``'s last forward GEMM (and the
    tensor-parallel collective of its output) out of its full recompute: the MLP under a whole-block
    non-reentrant checkpoint, both sub-blocks when the modules are checkpointed apart; never for a reentrant
    checkpoint, another recompute policy, the embedding, the head and MoE sub-blocks."""
    kind, _ = block_kind(model, block)
    if (layout.recompute != "full" or layout.checkpoint_impl == "reentrant" or kind not in ("attn", "mlp")
            or is_moe_block(model, block)):
        return False
    return kind == "mlp" or layout.checkpoint_impl == "non-reentrant-modules"


def skipped_by_early_stop(model: ModelSpec, layout: Layout, block: int, kernels: BlockKernels) -> Skipped:
    """What ``layout.checkpoint_impl`` leaves out of sub-block ``block``'s full recompute (``kernels``: its
    :func:`simgrid.model.kernels.block_kernels`); :data:`NOTHING` where :func:`skips_last_gemm` is false."""
    if not skips_last_gemm(model, layout, block):
        return NOTHING
    residual = (kernels.residual_fwd_hbm_bytes, 1)
    if layout.checkpoint_impl == "non-reentrant":
        return Skipped(True, residual[0], residual[1] + 1)
    return Skipped(True, residual[0] + kernels.norm_fwd_hbm_bytes, residual[1] + kernels.norm_fwd_kernels + 1)
