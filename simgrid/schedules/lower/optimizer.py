"""Passes: model-state memory, and the end of the step (grad sync completion, tied embeddings, optimizer).

Model states: the prologue ALLOCs each local stage's weights, gradients and optimizer states with the
sizes of :func:`simgrid.memory.states.block_state_bytes` summed over the stage's blocks (ZeRO sharding
and offload included), so the replayed peak of model states equals the analytic memory model; the
epilogue FREEs them. Gradients are allocated once per step and accumulate over the micro-batches.
With a parameter server only the server (the data-parallel group's first rank) holds optimizer states.

Step end, in this order (Megatron-LM ``finalize_model_grads`` then ``optimizer.step``):

1. WAIT every outstanding gradient collective (DDP all-reduce, ZeRO reduce-scatter, PS reduce); with
   sequence parallelism then an ALL_REDUCE per stage over the TP group of the norm, row-parallel bias and
   position-embedding gradients (:func:`~.tensor_parallel.sp_grad_sync`);
2. tied embeddings with pp > 1: ALL_REDUCE of the word-embedding gradient between the first and the last
   stage (Shoeybi et al. 2019; Megatron-LM ``_allreduce_embedding_grads``), group ``embed/dp<d>-tp<t>``;
3. the optimizer step, one OPT op per local stage over the parameters this rank updates (its ZeRO shard;
   ``optimizer_impl = "foreach"``: torch's foreach passes, and on FSDP2 DTensors host issue time per
   parameter tensor, :data:`FOREACH_DTENSOR_HOST_S_PER_TENSOR`);
   with offload (Ren et al. 2021, ZeRO-Offload, section 4): TRANSFER d2h of the gradients, OPT on the
   host CPU, TRANSFER h2d of the updated working weights, each waited;
4. ZeRO-1/2: ALL_GATHER of the updated parameters per bucket (none with ``overlap_param_gather``: the
   next step's forward gathers them, :mod:`~.param_gather`); parameter server: BROADCAST of them per
   bucket from the server; then their WAITs;
5. FREE of the model states.
"""

from __future__ import annotations

import math

from simgrid.ir.ops import Alloc, Collective, Compute, Free, Op, Transfer, Wait
from simgrid.layout.mesh import Mesh
from simgrid.layout.spec import FP32_BYTES, Layout
from simgrid.schedules.lower.context import LoweringContext, Role
from simgrid.schedules.lower.moe import expert_param_sync
from simgrid.schedules.lower.param_gather import (
    FP8_PARAM_BYTES,
    bucket_param_bytes,
    fp8_shard_cast,
    gather_collective,
    gathers_overlapped,
)
from simgrid.schedules.lower.tensor_parallel import sp_grad_sync

OPTIMIZER_FLOPS_PER_PARAM: dict[str, int] = {
    # Adam (Kingma & Ba 2015, Algorithm 1) per parameter: m <- b1 m + (1-b1) g (3), v <- b2 v + (1-b2) g^2
    # (4), two bias corrections (2), p <- p - lr m_hat / (sqrt(v_hat) + eps) (5): 14 FLOPs.
    "adam": 14,
    # 8-bit Adam (Dettmers et al. 2022): Adam plus dequantising and requantising both moments (~2 each).
    "adam-8bit": 18,
    # SGD with momentum: v <- mu v + g (2), p <- p - lr v (2).
    "sgd": 4,
}
"""Floating-point operations of one optimizer update per parameter."""

# -- foreach optimizer step (Layout.optimizer_impl = "foreach") ---------------------------------------------
# torch.optim.AdamW(foreach=True) (torch/optim/adam.py ``_multi_tensor_adam``, capturable=False) runs eight
# ``_foreach_*`` ops on the GPU, each a full pass over its lists with fp32 parameter, gradient and moments:
# mul_ (decoupled weight decay: r/w p, 8 bytes), lerp_ (r m, g, w m: 12), mul_ (r/w v: 8), addcmul_ (r v, g,
# w v: 12), sqrt (r v, w tmp: 8), div_ (8), add_ (eps: 8), addcdiv_ (r p, m, tmp, w p: 16) = 80 bytes per
# parameter, where the fused kernel (``_fused_adamw_``) reads p, g, m, v and writes p, m, v once: 28 bytes.
FOREACH_ADAM_UPDATE_BYTES_PER_PARAM = 8 + 12 + 8 + 12 + 8 + 8 + 8 + 16
"""GPU bytes of torch's foreach Adam(W) update per parameter with fp32 parameter, gradient and moments."""
FUSED_ADAM_UPDATE_BYTES_PER_PARAM = 3 * FP32_BYTES + 2 * 2 * FP32_BYTES
"""GPU bytes of a fused Adam update per parameter (read p, g, m, v; write p, m, v; fp32)."""

# Host time of the foreach step on FSDP2's DTensors, per parameter tensor. Each ``_foreach_*`` op on a list
# of DTensors goes through DTensor's ``__torch_dispatch__`` (sharding propagation over every list element)
# before the local multi-tensor kernel; the step is host-bound (pytorch/pytorch issue 134191: AdamW 2.5% of
# step time under FSDP1, 33% under FSDP2; awgu there: DTensor dispatch and the foreach ops' own CPU cost).
# Measured in torchtitan PR 355 (commit 7cf41bb, 2024-06-06): Llama 3 8B, FSDP on 8 A100, local batch 1,
# seq 8192, same loss and memory: 2,627 wps with foreach (steps 930-990) and 2,717 with fused (steps
# 920-1000), i.e. 8192/2627 - 8192/2717 = 103 ms more per step. The fused step itself still ran its kernel:
# 28 bytes x 8,030,261,248 / 8 parameters at A100's 2,039 GB/s datasheet bandwidth >= 13.8 ms. The foreach
# step therefore held the host >= 117 ms for the 291 parameter tensors torchtitan's Llama 3 8B holds (32
# layers x (attention norm, wq, wk, wv, wo, ffn norm, w1, w2, w3) + embedding, final norm, output), i.e.
# 0.40 ms per tensor. (Its GPU passes, 80 bytes x 1.0e9 / 2,039 GB/s = 39 ms, cannot explain 117 ms: the
# host is the bound.) Host speed and torch version dependent: torch of mid 2024 on an A100 host.
_PR355_TOKENS_PER_STEP = 8192
_PR355_DELTA_STEP_S = _PR355_TOKENS_PER_STEP / 2627 - _PR355_TOKENS_PER_STEP / 2717
_PR355_FUSED_KERNEL_S = FUSED_ADAM_UPDATE_BYTES_PER_PARAM * 8_030_261_248 / 8 / 2039e9
_PR355_PARAM_TENSORS = 32 * 9 + 3
FOREACH_DTENSOR_HOST_S_PER_TENSOR = (_PR355_DELTA_STEP_S + _PR355_FUSED_KERNEL_S) / _PR355_PARAM_TENSORS
"""Host seconds of one foreach Adam(W) step per FSDP2 (DTensor) parameter tensor (about 0.40 ms)."""


def param_tensors(ctx: LoweringContext, block: int) -> int:
    """Parameter tensors of a sub-block as a PyTorch-native model holds them (torchtitan's Llama: separate
    q, k, v, o and gate / up / down weights, one tensor per norm weight and bias; MoE: torchtitan's router
    and three grouped expert tensors, plus a shared expert's three and its gate). Tensor parallelism and
    FSDP shard tensors but keep their number, so every rank steps this many."""
    from simgrid.model.blocks import block_kind
    from simgrid.model.moe import is_moe_block

    model = ctx.model
    kind, _ = block_kind(model, block)
    norm = 2 if model.norm == "layernorm" else 1
    bias = 1 if model.bias else 0
    if kind == "embed":
        return 1 + (model.position == "learned")
    if kind == "head":
        return norm + (not model.tied_embeddings or ctx.layout.pp > 1)
    if kind == "attn":
        return norm + 4 * (1 + bias)
    if is_moe_block(model, block):
        assert model.moe is not None
        shared = model.moe.shared_expert_ffn_hidden_size > 0
        return norm + 1 + 3 + shared * (3 + model.moe.shared_expert_gate)
    return norm + (3 if model.gated_mlp else 2) * (1 + bias)


def _dtensor_params(layout: Layout) -> bool:
    """Whether the optimizer steps DTensors: FSDP2 (``fully_shard``) shards every parameter as one."""
    return layout.zero == 3 and layout.zero_impl == "fsdp2"


GRAD_SYNC_PURPOSES = ("dp-grad", "zero-grad", "ps-reduce")
EMBED_GROUP_PREFIX = "embed/"


def embed_group_name(dp: int, tp: int, cp: int | None = None) -> str:
    """Group that all-reduces the tied word-embedding gradient between the first and last stage
    (``cp``: the context-parallel index, ``None`` without context parallelism)."""
    return f"{EMBED_GROUP_PREFIX}dp{dp}-tp{tp}" + (f"-cp{cp}" if cp is not None else "")


def embed_sync_ranks(ctx: LoweringContext) -> tuple[int, int] | None:
    """Pipeline ranks holding the embedding and the tied output layer, or None if no sync is needed."""
    if not ctx.model.tied_embeddings or ctx.layout.pp == 1:
        return None
    first, last = ctx.stage_rank(0), ctx.stage_rank(ctx.layout.num_stages - 1)
    return None if first == last else (first, last)


def is_ps_server(ctx: LoweringContext, dp: int) -> bool:
    """True for the parameter server of a data-parallel group (its first rank) in PS mode."""
    return ctx.layout.dp_mode == "parameter-server" and dp == 0


def _holds_optimizer(ctx: LoweringContext, dp: int) -> bool:
    return ctx.layout.dp_mode != "parameter-server" or ctx.layout.dp == 1 or dp == 0


def add_model_states(ctx: LoweringContext, role: Role, pp_rank: int, dp: int = 0) -> Role:
    """ALLOC weights, gradients and optimizer states per local stage in the prologue; FREE them last."""
    allocs: list[Op] = []
    frees: list[Op] = []
    for stage in ctx.stages_of(pp_rank):
        sizes = {"weights": 0, "grads": 0, "optimizer": 0}
        for block in ctx.blocks(stage):
            states = ctx.states(block)
            sizes["weights"] += states.weights_bytes
            sizes["grads"] += states.grads_bytes
            sizes["optimizer"] += states.optimizer_bytes
        if not _holds_optimizer(ctx, dp):
            sizes["optimizer"] = 0
        for category, size in sizes.items():
            if size:
                name = f"{category}:s{stage}"
                allocs.append(Alloc(name=name, bytes=size, category=category))  # type: ignore[arg-type]
                frees.append(Free(name=name))
    role[0].ops = allocs + role[0].ops
    role[-1].ops = role[-1].ops + frees
    return role


def _outstanding_grad_syncs(role: Role) -> list[Op]:
    issued: list[str] = []
    waited: set[str] = set()
    for step in role:
        for op in step.ops:
            if isinstance(op, Collective) and op.purpose in GRAD_SYNC_PURPOSES:
                issued.append(op.handle)
            elif isinstance(op, Wait):
                waited.add(op.handle)
    return [Wait(handle=h) for h in issued if h not in waited]


def _embed_sync(ctx: LoweringContext, pp_rank: int) -> list[Op]:
    pair = embed_sync_ranks(ctx)
    if pair is None or pp_rank not in pair:
        return []
    from simgrid.memory.states import state_bytes_per_param
    from simgrid.model import params

    # Megatron-LM all-reduces the embedding's main_grad (fp32 under reduce_dtype "fp32"; finalize_model_grads).
    size = params.word_embedding_params(ctx.model, ctx.layout.tp) * state_bytes_per_param(ctx.layout).grads
    handle = "embed-grad"
    group = embed_group_name(0, 0, ctx.coord(pp_rank).cp)
    return [Collective(kind="all_reduce", group=group, bytes=size, purpose="embed-grad", handle=handle,
                       label="embed-grad"), Wait(handle=handle)]


FP8_PARAM_BOOKKEEPING_KERNELS = 5
"""Launches of NeMo's fp8-weight bookkeeping after the last bucket's cast (``_check_params_shard_dtypes``,
nemo/core/optim/distributed_adam.py lines 616-664 at b2eccd2): pack the scales, reciprocal, unpack into the
scale-inverses, pack the amaxes, unpack them after their all-reduce (that MAX all-reduce of 4 bytes per fp8
weight over the data-parallel group is latency-bound and not priced)."""


def optimizer_traffic_bytes_per_param(layout: Layout) -> int:
    """Memory traffic of one optimizer step per updated parameter, bytes.

    Mixed precision follows Megatron-LM's ``Float16OptimizerWithFloat16Params.step`` (megatron/optimizer/
    optimizer.py, 2021), one pass per kernel: copy the 16-bit gradient into the fp32 main gradient (read
    d + write 4), unscale and check for inf/nan (read 4 + write 4), gradient norm for clipping (read 4),
    the fused update (read master 4, gradient 4 and the moments; write master 4 and the moments), copy the
    fp32 master back into the working weights (read 4 + write d): 52 bytes for Adam with d = 2. With fp32
    gradients (``reduce_dtype = "fp32"``, Megatron-Core's fp32 ``main_grad``) the first copy is skipped: the
    optimizer's ``main_grad.float()`` is the buffer itself (46 bytes for Adam with d = 2).
    Full precision: gradient norm (read 4) and the update (read weight 4, gradient 4, moments; write
    weight 4, moments). With offload the update runs on the host from the fp32 copies there: read
    weights, gradients and states, write weights and states.
    """
    from simgrid.memory.states import state_bytes_per_param

    per = state_bytes_per_param(layout)
    if layout.offload_optimizer:
        return 2 * (per.weights + per.host) + per.grads
    if layout.mixed_precision:
        moments = per.optimizer - FP32_BYTES  # the optimizer bytes hold the fp32 master copy too
        to_main_grad = 0 if per.grads == FP32_BYTES else per.grads + FP32_BYTES
        return to_main_grad + 2 * FP32_BYTES + FP32_BYTES + (3 * FP32_BYTES + 2 * moments) + (
            FP32_BYTES + per.weights
        )
    return FP32_BYTES + 3 * FP32_BYTES + 2 * per.optimizer


def _optimizer_ops(ctx: LoweringContext, pp_rank: int) -> list[Op]:
    from simgrid.memory.states import state_bytes_per_param

    lay = ctx.layout
    per = state_bytes_per_param(lay)
    shard = lay.grad_sync_size if lay.zero >= 1 else 1
    expert_shard = lay.edp if lay.zero >= 1 else 1  # routed experts shard over the expert data-parallel group
    device = "cpu" if lay.offload_optimizer else "gpu"
    before: list[Op] = []
    steps: list[Op] = []
    after: list[Op] = []
    for stage in ctx.stages_of(pp_rank):
        blocks = ctx.blocks(stage)
        experts = sum(ctx.cost(b).expert_param_count for b in blocks)
        params = (math.ceil((sum(ctx.cost(b).param_count for b in blocks) - experts) / shard)
                  + math.ceil(experts / expert_shard))
        traffic = params * optimizer_traffic_bytes_per_param(lay)
        kernels = 1
        if lay.fp8_params:
            # The fp8 weights' copy back from the fp32 master is NeMo's cast_to_fp8 of the shard (read 4, write 1
            # byte instead of the 16-bit width), launched per state bucket; then the scale-inverse refresh and the
            # amax reduction's packing copies (distributed_adam.py lines 616-664 at b2eccd2) once per step.
            fp8_shard, launches = fp8_shard_cast(ctx, stage)
            traffic -= fp8_shard * (per.weights - FP8_PARAM_BYTES)
            kernels += launches + (FP8_PARAM_BOOKKEEPING_KERNELS if stage == ctx.stages_of(pp_rank)[0] else 0)
        host_s = 0.0
        if lay.optimizer_impl == "foreach" and not lay.offload_optimizer:
            if lay.optimizer == "adam":  # other optimizers' foreach passes are not counted
                traffic += params * (FOREACH_ADAM_UPDATE_BYTES_PER_PARAM - FUSED_ADAM_UPDATE_BYTES_PER_PARAM)
            if _dtensor_params(lay):  # plain tensors: one dispatch per foreach op, not host-bound
                host_s = sum(param_tensors(ctx, b) for b in blocks) * FOREACH_DTENSOR_HOST_S_PER_TENSOR
        steps.append(Compute(kind="OPT", stage=-1, microbatch=-1, chunk=ctx.chunk_of(stage),
                             block_start=blocks.start, block_end=blocks.stop,
                             flops=float(params * OPTIMIZER_FLOPS_PER_PARAM[lay.optimizer]),
                             hbm_bytes=float(traffic), kernels=kernels, device=device,  # type: ignore[arg-type]
                             host_s=host_s))
        if lay.offload_optimizer:
            down, up = f"offload-grads:s{stage}", f"offload-params:s{stage}"
            before += [Transfer(direction="d2h", bytes=params * per.grads, handle=down, label=f"s{stage}:grads"),
                       Wait(handle=down)]
            after += [Transfer(direction="h2d", bytes=params * per.weights, handle=up, label=f"s{stage}:params"),
                      Wait(handle=up)]
    return before + steps + after


def _param_sync(ctx: LoweringContext, pp_rank: int) -> list[Op]:
    lay = ctx.layout
    if lay.grad_sync_size == 1 or lay.zero == 3 or (lay.zero == 0 and lay.dp_mode != "parameter-server"):
        return []
    if gathers_overlapped(ctx):  # deferred to the next step's forward (simgrid.schedules.lower.param_gather)
        return []
    group = Mesh.dp_group_name(ctx.coord(pp_rank))
    issues: list[Op] = []
    waits: list[Op] = []
    for stage in ctx.stages_of(pp_rank):
        for bucket in ctx.buckets(stage):
            if lay.zero >= 1:
                coll = gather_collective(ctx, pp_rank, stage, bucket)
            else:
                label = f"s{stage}:bucket{bucket.index}"
                coll = Collective(kind="broadcast", group=group, bytes=bucket_param_bytes(ctx, bucket),
                                  purpose="ps-broadcast", handle=f"ps-broadcast:{label}",
                                  root=ctx.mesh.rank(pp=pp_rank, dp=0, tp=0), label=label)
            issues.append(coll)
            waits.append(Wait(handle=coll.handle))
    return issues + waits


def add_step_end(ctx: LoweringContext, role: Role, pp_rank: int, dp: int = 0) -> Role:
    """Grad-sync waits, tied-embedding sync, optimizer step and parameter sync, in the epilogue."""
    ops = _outstanding_grad_syncs(role) + sp_grad_sync(ctx, pp_rank) + _embed_sync(ctx, pp_rank)
    if _holds_optimizer(ctx, dp):
        ops += _optimizer_ops(ctx, pp_rank)
    ops += _param_sync(ctx, pp_rank) + expert_param_sync(ctx, pp_rank)
    role[-1].ops = role[-1].ops + ops
    return role
