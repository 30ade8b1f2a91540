"""Megatron 1-D tensor-parallel collectives each sub-block needs.

Shoeybi et al. 2019 (Megatron-LM), section 3, Fig. 3: each attention and MLP sub-block has an identity
``f`` before it (all-reduce of the input gradient in backward) and an all-reduce ``g`` after it in forward.
Korthikanti et al. 2022, section 4.2.2: with sequence parallelism ``g`` becomes a reduce-scatter and ``f``
an all-gather, and their backwards are the conjugates (all-gather of the output gradient, reduce-scatter of
the input gradient). Megatron-LM stores only the sequence shard of the all-gathered input, so the backward
all-gathers it again for the weight gradient (``LinearWithGradAccumulationAndAsyncCommunication``; this is
what makes the ``34 sbh/t`` activations of Table 2 possible).

Embedding (``VocabParallelEmbedding``): each rank looks up its vocabulary slice and the partial results are
all-reduced in forward (reduce-scattered under sequence parallelism, whose backward all-gathers the
gradient). Head: the output layer is column-parallel over the vocabulary with ``gather_output=False``, so
its input-gradient is all-reduced in backward (sequence parallel: all-gather before, reduce-scatter after);
the vocabulary-parallel cross entropy all-reduces three fp32 per-token tensors in forward: the logit max,
the target logit and the sum of exponentials (Megatron-LM ``tensor_parallel/cross_entropy.py``). A MoE
sub-block has the dense MLP's collectives only for its shared expert (split like the dense MLP); its routed
experts' all-to-alls are :func:`simgrid.model.moe.moe_collectives`.

Sizes follow :class:`simgrid.ir.ops.Collective`: the larger of the input and output buffers, i.e. the full
``b s h`` tensor in the working dtype for all-gather and reduce-scatter too (``s`` is the rank's
``s / cp`` tokens under context parallelism).

Context parallelism (Llama 3's all-gather variant; Dubey et al. 2024, "The Llama 3 Herd of Models",
section 3.3.2): after the QKV projection each rank all-gathers the keys and values of its context-parallel
group and computes attention for its own queries. Llama 3 prefers this to ring attention because with GQA
the K and V tensors are much smaller than Q, so the exposed all-gather is cheap against the attention it
feeds. The gathered K and V are not kept for the backward: the backward all-gathers them again, and the
full-sequence ``dK, dV`` each rank computes are reduce-scattered back to their owners. The message is the
gathered K and V: ``2 b s kv_local head_dim`` elements.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from simgrid.layout.spec import Layout
from simgrid.model.blocks import block_kind, local_kv_heads, local_seq_length
from simgrid.model.moe import is_moe_block
from simgrid.model.spec import ModelSpec

TPCollectiveKind = Literal["all_reduce", "all_gather", "reduce_scatter"]
Phase = Literal["fwd", "bwd"]
Position = Literal["before", "after"]

#: The cross-entropy all-reduces carry fp32 per-token values.
LOSS_REDUCTION_BYTES = 4


@dataclass(frozen=True, kw_only=True)
class TPCollective:
    """One tensor-parallel collective of a sub-block, relative to the block's compute in one phase."""

    kind: TPCollectiveKind
    """all_reduce, all_gather or reduce_scatter over the tensor-parallel group."""
    phase: Phase
    """fwd: during the forward; bwd: during the backward."""
    position: Position
    """before or after the block's compute in that phase (backward runs the block in reverse)."""
    bytes: int
    """Message size, nccl-tests convention (larger of input and output buffers)."""
    label: str = ""
    """What it carries: output, input-grad, output-grad, input-regather, embed-out, loss-max, ..."""


def block_tp_collectives(model: ModelSpec, layout: Layout, block: int) -> tuple[TPCollective, ...]:
    """Tensor-parallel collectives of one sub-block for one micro-batch, in issue order per phase."""
    if layout.tp == 1:
        return ()
    kind, _ = block_kind(model, block)
    tokens = layout.micro_batch_size * local_seq_length(model, layout.cp)
    activation = tokens * model.hidden_size * layout.param_bytes
    sp = layout.sequence_parallel

    def c(kind_: TPCollectiveKind, phase: Phase, position: Position, label: str, size: int = activation
          ) -> TPCollective:
        return TPCollective(kind=kind_, phase=phase, position=position, bytes=size, label=label)

    if kind == "embed":
        if sp:
            return (c("reduce_scatter", "fwd", "after", "embed-out"), c("all_gather", "bwd", "before", "output-grad"))
        return (c("all_reduce", "fwd", "after", "embed-out"),)
    if kind == "head":
        loss_bytes = tokens * LOSS_REDUCTION_BYTES
        loss = (c("all_reduce", "fwd", "after", "loss-max", loss_bytes),
                c("all_reduce", "fwd", "after", "loss-target-logit", loss_bytes),
                c("all_reduce", "fwd", "after", "loss-sum-exp", loss_bytes))
        if sp:
            return (c("all_gather", "fwd", "before", "input"), *loss,
                    c("all_gather", "bwd", "before", "input-regather"),
                    c("reduce_scatter", "bwd", "after", "input-grad"))
        return (*loss, c("all_reduce", "bwd", "after", "input-grad"))
    if is_moe_block(model, block) and not (model.moe and model.moe.shared_expert_ffn_hidden_size):
        # The routed experts move tokens over the expert-parallel groups (simgrid.model.moe); only a shared
        # expert, split like the dense MLP, talks over the tensor-parallel group.
        return ()
    if sp:
        # Under fp8 the gathered tensors are Transformer Engine's fp8 ones (1 byte): LayerNormLinear gathers its
        # fp8 ln_out forward and again for the weight gradient (layernorm_linear.py lines 164 and 457 at v1.11),
        # Linear casts the output gradient to fp8 before gathering it (module/base.py lines 775-797); the
        # reduce-scatters carry 16-bit GEMM outputs.
        gathered = activation // layout.param_bytes if layout.fp8_recipe != "none" and not is_moe_block(model, block) \
            else activation
        return (c("all_gather", "fwd", "before", "input", gathered), c("reduce_scatter", "fwd", "after", "output"),
                c("all_gather", "bwd", "before", "output-grad", gathered),
                c("all_gather", "bwd", "before", "input-regather", gathered),
                c("reduce_scatter", "bwd", "after", "input-grad"))
    return (c("all_reduce", "fwd", "after", "output"), c("all_reduce", "bwd", "after", "input-grad"))


def block_cp_collectives(model: ModelSpec, layout: Layout, block: int) -> tuple[TPCollective, ...]:
    """Context-parallel collectives of one sub-block for one micro-batch (attention only; module docstring).

    Forward: all-gather K and V before the core. Backward: all-gather K and V again before the core's
    backward, reduce-scatter ``dK, dV`` after it. Synchronous, like the tensor-parallel ones: the core
    cannot start without the keys.
    """
    if layout.cp == 1 or block_kind(model, block)[0] != "attn":
        return ()
    kv = (2 * layout.micro_batch_size * model.seq_length * local_kv_heads(model, layout.tp) * model.head_dim
          * layout.param_bytes)
    return (
        TPCollective(kind="all_gather", phase="fwd", position="before", bytes=kv, label="kv"),
        TPCollective(kind="all_gather", phase="bwd", position="before", bytes=kv, label="kv-regather"),
        TPCollective(kind="reduce_scatter", phase="bwd", position="after", bytes=kv, label="kv-grad"),
    )

