"""Costs of a MoE layer's MLP sub-block: parameters, FLOPs, saved activations, memory traffic, collectives.

One MoE sub-block (the block ``2 + 2*i`` of a MoE layer ``i``, :mod:`simgrid.model.blocks`) is, in Megatron-
Core's order with its all-to-all token dispatcher (``MoEAlltoAllTokenDispatcher``; Liu et al. 2025, "MoE
Parallel Folding", arXiv:2504.14960, section 4, Fig. 4):

norm -> router (an ``h x E`` GEMM, softmax, top-k) -> permute (tokens grouped by destination)
-> all-to-all over the EP group (dispatch) -> all-gather over the ETP group (etp > 1)
-> grouped GEMMs of the rank's ``E / ep`` experts (each split ``1/etp``) -> reduce-scatter over ETP
-> all-to-all back (combine) -> unpermute, weighted by the router probabilities -> residual add,
plus the shared expert, a dense MLP split like the model's MLP over ``tp`` (Megatron: "the parallelism
patterns of the shared experts follow the settings of the dense part").

Tokens. The MoE layer routes each rank's *sequence shard*: ``T_r = b * s / (cp * tp)`` tokens (Megatron
requires sequence parallelism with tp > 1, :func:`simgrid.layout.check_layout`). Each token goes to ``k``
experts, so a rank sends ``k * T_r`` token copies and, with balanced routing, receives as many for its
experts; the ETP all-gather multiplies that by ``etp``. With ``MoESpec.load_imbalance`` the busiest rank
receives that many times the mean (capped by a capacity factor, which drops the excess):
``T_e = k * T_r * etp * routed_factor`` tokens pass through this rank's experts, ``T_e * ep / E`` per
local expert: the ``m`` of the grouped GEMM, whose efficiency the GPU profile gives by shape (small ``m``
hurts, :meth:`simgrid.hardware.MatmulEfficiency.efficiency`). Every rank is costed as the busiest one:
the combine all-to-all ends when its slowest member does.

FLOPs (2mnk per product; backward input and weight gradients each equal the forward, as for any linear
layer): router ``2 T_r h E``; routed experts ``2 T_e h (g f_e + f_e) / etp`` with ``g`` = 2 for a gated
MLP, else 1; shared expert ``2 T h (g + 1) f_s / tp`` on the gathered ``T = b s / cp`` tokens; shared gate
``2 T_r h``. The model-FLOPs count (MFU) uses balanced routing (``routed_factor`` = 1).

Saved activations: norm input and output (the router's input) ``T_r h d`` each, router probabilities
``T_r E d``, the experts' input ``T_e h d``, their first GEMM's outputs ``g T_e f_e/etp d`` and second GEMM's
input ``T_e f_e/etp d``, the expert outputs the weighted sum reads ``k T_r routed h d``, the shared expert's
inner tensors ``(g + 1) T f_s/tp d``, and a residual-dropout mask when the model uses dropout. Memory-bound
traffic follows :mod:`simgrid.model.kernels` (read + write of every element-wise kernel): norm, router
softmax/top-k, permute and unpermute gathers of the ``k T_r`` token copies, the local sort by expert of the
``T_e`` received tokens, the experts' activation, the weighted sum and the residual.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from simgrid.errors import ModelError
from simgrid.layout.spec import Layout, RecomputePolicy
from simgrid.model.blocks import block_kind, local_seq_length, norm_params
from simgrid.model.moe_spec import MoESpec
from simgrid.model.spec import ModelSpec

EPGroupKind = Literal["ep", "etp"]
EPCollectiveKind = Literal["all_to_all", "all_gather", "reduce_scatter"]


def moe_spec(model: ModelSpec) -> MoESpec:
    """The model's MoE part; an error for a dense model."""
    if model.moe is None:
        raise ModelError(f"model {model.name!r} has no MoE layers")
    return model.moe


def is_moe_layer(model: ModelSpec, layer: int) -> bool:
    """Whether transformer layer ``layer`` has experts (every layer after ``first_dense_layers``)."""
    return model.moe is not None and layer >= model.moe.first_dense_layers


def is_moe_block(model: ModelSpec, block: int) -> bool:
    """Whether sub-block ``block`` is the MLP sub-block of a MoE layer."""
    if model.moe is None:
        return False
    kind, layer = block_kind(model, block)
    return kind == "mlp" and is_moe_layer(model, layer)


def num_moe_layers(model: ModelSpec) -> int:
    """MoE layers of the model."""
    return 0 if model.moe is None else model.num_layers - model.moe.first_dense_layers


def fc1_width(model: ModelSpec, width: int) -> int:
    """Output width of an MLP's first GEMM: ``2 * width`` (gate and up) for a gated MLP."""
    return (2 if model.gated_mlp else 1) * width


def expert_params(model: ModelSpec, etp: int = 1) -> int:
    """One routed expert's parameters on one expert tensor-parallel rank (column/row split like Megatron's
    MLP: first GEMM and its bias split, second GEMM split, its bias replicated)."""
    moe, h = moe_spec(model), model.hidden_size
    inner = fc1_width(model, moe.expert_ffn_hidden_size) // etp
    biases = inner + h if model.bias else 0
    return h * inner + (moe.expert_ffn_hidden_size // etp) * h + biases


def moe_dense_params(model: ModelSpec, tp: int = 1) -> int:
    """Parameters of a MoE sub-block outside the routed experts on one tensor-parallel rank: the norm, the
    router (``h x E``, replicated over tp), the shared expert (split over tp) and its gate."""
    moe, h = moe_spec(model), model.hidden_size
    shared = 0
    if moe.shared_expert_ffn_hidden_size:
        inner = fc1_width(model, moe.shared_expert_ffn_hidden_size) // tp
        shared = h * inner + (moe.shared_expert_ffn_hidden_size // tp) * h + (inner + h if model.bias else 0)
    gate = h if moe.shared_expert_gate else 0
    return norm_params(model) + h * moe.num_experts + shared + gate


def moe_expert_params(model: ModelSpec, ep: int = 1, etp: int = 1) -> int:
    """Routed-expert parameters of a MoE sub-block on one rank: ``E / ep`` experts, each split ``1/etp``."""
    return moe_spec(model).num_experts // ep * expert_params(model, etp)


def moe_active_params(model: ModelSpec) -> int:
    """Parameters of a MoE sub-block one token goes through: everything but the ``E - k`` unchosen experts."""
    moe = moe_spec(model)
    return moe_dense_params(model) + moe.top_k * expert_params(model)


# -- tokens -------------------------------------------------------------------------------------------------
def routed_tokens(model: ModelSpec, micro_batch_size: int, tp: int, cp: int) -> int:
    """Tokens entering one rank's MoE layer per micro-batch: its sequence shard ``b * s / (cp * tp)``."""
    return micro_batch_size * local_seq_length(model, cp) // tp


def expert_tokens(model: ModelSpec, micro_batch_size: int, tp: int, cp: int, etp: int,
                  routed_factor: float | None = None) -> float:
    """Token copies this rank's experts compute per micro-batch on the busiest rank: ``k T_r etp routed``."""
    moe = moe_spec(model)
    factor = moe.routed_factor if routed_factor is None else routed_factor
    return moe.top_k * routed_tokens(model, micro_batch_size, tp, cp) * etp * factor


def tokens_per_local_expert(model: ModelSpec, layout: Layout) -> int:
    """The ``m`` of the experts' grouped GEMM: tokens one local expert computes (at least 1)."""
    moe = moe_spec(model)
    t_e = expert_tokens(model, layout.micro_batch_size, layout.tp, layout.cp, layout.expert_tp)
    return max(1, round(t_e * layout.ep / moe.num_experts))


FP8_TOKEN_ALIGN = 16
"""Under fp8, Megatron-Core's ``TEGroupedMLP`` pads every local expert's token count up to a multiple of 16
before fc1 and strips the padding after fc2 (``Fp8Padding`` / ``Fp8Unpadding``: experts.py lines 636-639, 655-658
and 707-708 at core_r0.10.0; TE v1.11 fp8_padding.py line 106, ``(m + 15) // 16 * 16``), so the grouped GEMMs
run on the padded rows."""


def padded_tokens_per_local_expert(model: ModelSpec, layout: Layout) -> int:
    """The ``m`` of the experts' grouped GEMMs as they run: :func:`tokens_per_local_expert`, rounded up to a
    multiple of :data:`FP8_TOKEN_ALIGN` under fp8 (``Layout.fp8_recipe``), unchanged otherwise."""
    m = tokens_per_local_expert(model, layout)
    if layout.fp8_recipe == "none":
        return m
    return -(-m // FP8_TOKEN_ALIGN) * FP8_TOKEN_ALIGN


# -- FLOPs --------------------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class MoEFlops:
    """Matmul FLOPs of one MoE sub-block for one micro-batch on one rank."""

    fwd: float
    """Forward."""
    bwd_input: float
    """Backward, input gradients."""
    bwd_weight: float
    """Backward, weight gradients."""


def moe_block_flops(model: ModelSpec, *, micro_batch_size: int = 1, tp: int = 1, cp: int = 1, etp: int = 1,
                    routed_factor: float | None = None) -> MoEFlops:
    """FLOPs of a MoE sub-block (module docstring); ``routed_factor=1.0`` gives balanced routing."""
    moe, h = moe_spec(model), model.hidden_size
    t_r = routed_tokens(model, micro_batch_size, tp, cp)
    t_e = expert_tokens(model, micro_batch_size, tp, cp, etp, routed_factor)
    f_e = moe.expert_ffn_hidden_size
    fwd = 2.0 * t_r * h * moe.num_experts
    fwd += 2.0 * t_e * h * (fc1_width(model, f_e) + f_e) / etp
    if moe.shared_expert_ffn_hidden_size:
        tokens = micro_batch_size * local_seq_length(model, cp)
        f_s = moe.shared_expert_ffn_hidden_size
        fwd += 2.0 * tokens * h * (fc1_width(model, f_s) + f_s) / tp
    if moe.shared_expert_gate:
        fwd += 2.0 * t_r * h
    return MoEFlops(fwd=fwd, bwd_input=fwd, bwd_weight=fwd)


# -- activations and memory traffic -------------------------------------------------------------------------
def moe_activation_bytes(model: ModelSpec, *, micro_batch_size: int = 1, tp: int = 1, cp: int = 1, etp: int = 1,
                         dtype_bytes: int = 2, recompute: RecomputePolicy = "none", dropout_mask_bytes: int = 0,
                         fp8: bool = False) -> int:
    """Bytes a MoE sub-block saves for its backward, one micro-batch, one rank (module docstring).

    Full recompute keeps only the layer input, which belongs to the attention sub-block, so 0 here; selective
    recompute reruns the attention core only. ``dropout_mask_bytes``: bytes per element of the residual-dropout
    mask (0 without dropout). ``fp8`` (``Layout.fp8_recipe``): Transformer Engine's linears save their fp8 input
    (GroupedLinear its fp8 transposes, grouped_linear.py lines 212-219 at v1.11; Linear its fp8 input): the
    experts' fc1 and fc2 inputs and the shared expert's fc2 input take 1 byte, and the shared expert's fc1
    saves an fp8 copy of its (sequence-shard) input beside the 16-bit norm output the router keeps.
    """
    if recompute == "full":
        return 0
    moe, h, d = moe_spec(model), model.hidden_size, dtype_bytes
    t_r = routed_tokens(model, micro_batch_size, tp, cp)
    t_e = expert_tokens(model, micro_batch_size, tp, cp, etp)
    f_local = moe.expert_ffn_hidden_size // etp
    total: float = 2 * t_r * h * d + t_r * moe.num_experts * d  # norm input, router input, router probabilities
    total += t_e * h * d + t_e * (fc1_width(model, f_local) + f_local) * d  # experts' GEMM inputs / outputs
    total += moe.top_k * t_r * moe.routed_factor * h * d  # expert outputs read by the weighted sum
    total += t_r * h * dropout_mask_bytes
    low = d - 1 if fp8 else 0  # bytes saved per element a TE linear keeps in fp8 instead
    total -= low * t_e * (h + f_local)
    if moe.shared_expert_ffn_hidden_size:
        tokens = micro_batch_size * local_seq_length(model, cp)
        inner = moe.shared_expert_ffn_hidden_size // tp
        total += tokens * (fc1_width(model, inner) + inner) * d - low * tokens * inner + (t_r * h if fp8 else 0)
    return int(total)


@dataclass(frozen=True, kw_only=True)
class MoETraffic:
    """Memory-bound bytes and kernel launches of a MoE sub-block, and its dominant GEMM's shape."""

    fwd_hbm_bytes: int
    """Forward element-wise traffic."""
    bwd_hbm_bytes: int
    """Backward element-wise traffic."""
    fwd_kernels: int
    """Forward launches, GEMMs included."""
    bwd_kernels: int
    """Backward launches, GEMMs included."""
    gemm_mnk: tuple[int, int, int]
    """(M, N, K) of the experts' grouped GEMM as one GEMM: the rows of every local expert stacked
    (``E / ep`` times the tokens per local expert), first GEMM's width, hidden. A grouped kernel (Megatron's
    GroupedMLP, Transformer Engine's GroupedLinear) schedules the tiles of all its experts together, so its
    waves on the SMs are those of the stacked GEMM, not of one expert's small GEMM."""


def moe_traffic(model: ModelSpec, layout: Layout, *, dropout_mask_bytes: int = 0) -> MoETraffic:
    """Element-wise HBM traffic of a MoE sub-block for one micro-batch on one rank (module docstring)."""
    moe, h, d = moe_spec(model), model.hidden_size, layout.param_bytes
    t_r = routed_tokens(model, layout.micro_batch_size, layout.tp, layout.cp)
    t_e = expert_tokens(model, layout.micro_batch_size, layout.tp, layout.cp, layout.expert_tp)
    hidden = t_r * h * d  # the rank's sequence shard of the residual stream
    copies = moe.top_k * t_r * moe.routed_factor * h * d  # the k routed copies of each token
    received = t_e * h * d
    inner = t_e * (moe.expert_ffn_hidden_size // layout.expert_tp) * d
    act_fwd, act_bwd = (3 * inner, 5 * inner) if model.gated_mlp else (2 * inner, 3 * inner)
    router = 2 * t_r * moe.num_experts * d  # softmax + top-k: read the logits, write the probabilities
    mask = t_r * h * dropout_mask_bytes
    # norm 2E; router; permute 2C; sort by expert 2R; activation; sort back 2R; unpermute + weighted sum
    # (read C, write E); residual 3E + mask.
    fwd = 2 * hidden + router + 2 * copies + 2 * received + act_fwd + 2 * received + copies + hidden + 3 * hidden + mask
    # norm 3E; router 3 x; both gathers and sorts again; activation backward; residual 2E + mask and the
    # residual-branch gradient sum 3E.
    bwd = 3 * hidden + 3 * router // 2 + 3 * copies + 4 * received + act_bwd + hidden + 2 * hidden + mask + 3 * hidden
    fwd_k, bwd_k = 11, 19  # norm, router GEMM, softmax/top-k, permute, sort, fc1, act, fc2, sort, unpermute, add
    if moe.shared_expert_ffn_hidden_size:
        tokens = layout.micro_batch_size * local_seq_length(model, layout.cp)
        shared = tokens * (moe.shared_expert_ffn_hidden_size // layout.tp) * d
        fwd += 3 * shared if model.gated_mlp else 2 * shared
        bwd += 5 * shared if model.gated_mlp else 3 * shared
        fwd_k, bwd_k = fwd_k + 3 + int(moe.shared_expert_gate), bwd_k + 5 + 2 * int(moe.shared_expert_gate)
    m = tokens_per_local_expert(model, layout) * (moe.num_experts // layout.ep)
    n = fc1_width(model, moe.expert_ffn_hidden_size) // layout.expert_tp
    return MoETraffic(fwd_hbm_bytes=int(fwd), bwd_hbm_bytes=int(bwd), fwd_kernels=fwd_k, bwd_kernels=bwd_k,
                      gemm_mnk=(m, n, h))


# -- collectives --------------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class EPCollective:
    """One expert-parallel collective of a MoE sub-block, relative to its compute in one phase."""

    kind: EPCollectiveKind
    """all_to_all over the EP group; all_gather or reduce_scatter over the ETP group."""
    group: EPGroupKind
    """``ep`` (the all-to-all group) or ``etp`` (the expert tensor-parallel group)."""
    phase: Literal["fwd", "bwd"]
    """fwd: during the forward; bwd: during the backward."""
    position: Literal["before", "after"]
    """before or after the block's compute in that phase (the backward runs the block in reverse)."""
    bytes: int
    """Message size per rank, nccl-tests convention (all-to-all: the whole send buffer of a rank)."""
    label: str
    """dispatch, combine, dispatch-grad, combine-grad, gather, scatter, ..."""


def moe_collectives(model: ModelSpec, layout: Layout, block: int) -> tuple[EPCollective, ...]:
    """Expert-parallel collectives of a MoE sub-block for one micro-batch, in issue order per phase.

    Forward: dispatch all-to-all (ep > 1) and ETP all-gather (etp > 1) before the experts, ETP reduce-scatter
    and combine all-to-all after. Backward, the conjugates in reverse: the combine's all-to-all of the output
    gradients and the reduce-scatter's all-gather before, the all-gather's reduce-scatter and the dispatch's
    all-to-all of the input gradients after. Synchronous, as Megatron-Core's dispatcher waits on each.
    Sizes use the busiest rank's tokens (``routed_factor``; module docstring).
    """
    if not is_moe_block(model, block) or (layout.ep == 1 and layout.expert_tp == 1):
        return ()
    moe, h, d = moe_spec(model), model.hidden_size, layout.param_bytes
    t_r = routed_tokens(model, layout.micro_batch_size, layout.tp, layout.cp)
    copies = int(moe.top_k * t_r * moe.routed_factor * h * d)
    gathered = copies * layout.expert_tp

    def c(kind: EPCollectiveKind, group: EPGroupKind, phase: Literal["fwd", "bwd"],
          position: Literal["before", "after"], size: int, label: str) -> EPCollective:
        return EPCollective(kind=kind, group=group, phase=phase, position=position, bytes=size, label=label)

    ep, etp = layout.ep > 1, layout.expert_tp > 1
    fwd_before = ([c("all_to_all", "ep", "fwd", "before", copies, "dispatch")] if ep else []) + (
        [c("all_gather", "etp", "fwd", "before", gathered, "gather")] if etp else [])
    fwd_after = ([c("reduce_scatter", "etp", "fwd", "after", gathered, "scatter")] if etp else []) + (
        [c("all_to_all", "ep", "fwd", "after", copies, "combine")] if ep else [])
    bwd_before = ([c("all_to_all", "ep", "bwd", "before", copies, "combine-grad")] if ep else []) + (
        [c("all_gather", "etp", "bwd", "before", gathered, "scatter-grad")] if etp else [])
    bwd_after = ([c("reduce_scatter", "etp", "bwd", "after", gathered, "gather-grad")] if etp else []) + (
        [c("all_to_all", "ep", "bwd", "after", copies, "dispatch-grad")] if ep else [])
    return (*fwd_before, *fwd_after, *bwd_before, *bwd_after)


def dispatcher_buffer_bytes(model: ModelSpec, layout: Layout) -> int:
    """Bytes the all-to-all dispatcher holds during one MoE sub-block's forward or backward: the permuted send
    buffer of the ``k T_r`` token copies and the received (and ETP-gathered) tokens, in the working dtype."""
    if model.moe is None or (layout.ep == 1 and layout.expert_tp == 1):
        return 0
    moe, h, d = moe_spec(model), model.hidden_size, layout.param_bytes
    t_r = routed_tokens(model, layout.micro_batch_size, layout.tp, layout.cp)
    t_e = expert_tokens(model, layout.micro_batch_size, layout.tp, layout.cp, layout.expert_tp)
    return int(moe.top_k * t_r * moe.routed_factor * h * d + t_e * h * d)
