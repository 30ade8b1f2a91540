"""Pass: Transformer Engine delayed scaling's amax all-reduce (``fp8_recipe = "delayed"``, ``Layout.fp8_amax_reduction``).

Under ``DelayedScaling(reduce_amax=True)`` (TE's default, recipe.py line 142 at v1.8; Megatron-Core's
``TEDelayedScaling`` does not change it) every fp8 module records the amax of its fp8 tensors, and TE all-reduces
them with ``ReduceOp.MAX`` over the autocast's ``fp8_group`` at two places per autocast region:

* forward: when the outermost ``fp8_autocast`` exits (``fp8_autocast_exit``, fp8.py line 426 at v1.8, 417 at v1.6rc1,
  435 at v1.11; 401 at 09ba842). Megatron-Core wraps each model chunk's ``TransformerBlock`` layers in one autocast
  (transformer_block.py lines 365-369 at 3c0f3ef, 386-391 at 338af514, 409-413 at dd18205), NeMo's legacy
  ``ParallelTransformer`` likewise (transformer.py lines 1474-1481 at NeMo bd0b818): the final norm and the head
  run after it, so the reduction sits right after the chunk's last layer;
* backward: after the backward of the region's first fp8 module (linear.py line 613, layernorm_linear.py 722,
  layernorm_mlp.py 1098 at v1.8; module/base.py lines 96-104 at 09ba842), i.e. after the backward of the chunk's
  first layer, before the embedding's.

So a rank reduces ``2 x m x vpp`` times per step. What each reduction moves and where it runs changed with TE:

* TE v1.6rc1 on (``stage`` and ``tp``): ``reduce_and_update_fp8_tensors`` (fp8.py lines 313-368 at v1.6rc1,
  316-376 at v1.8) walks global buffers holding every fp8 module that ran on the rank, all chunks, keyed by
  direction, "has fp8 weights" and autocast: per key one ``torch.cat``, one synchronous all-reduce
  (``async_op=False``, fp8.py line 309 / 312: the compute stream waits for it) and one
  ``fused_amax_and_scale_update_after_reduction`` kernel. Megatron-Core passes the tensor-parallel group at
  core_v0.7.0.beta (3c0f3ef, transformer_block.py line 367: ``tp``) and the amax reduction group, the tensor-,
  data- and context-parallel ranks of one pipeline stage, from 338af514 on (line 389,
  ``get_amax_reduction_group(with_context_parallel=True)``, parallel_state.py line 843: ``stage``);
* TE 09ba842 (``tp-async-region``): ``global_amax_reduction`` (fp8.py lines 314-369) concatenates the region's
  amaxes only (the buffer is keyed by autocast id), and with ``NVTE_DP_AMAX_REDUCE_INTERVAL=0`` reduces over the
  module's tensor-parallel group (lines 329-356), ``async_op`` from ``NVTE_ASYNC_AMAX_REDUCTION`` (module/base.py
  lines 275-277); the handle is waited for by the next forward's first module (base.py lines 612-616) and by the
  next module backward (lines 74-77). The split after it makes views, no kernel.

Amaxes per layer: a TE linear keeps ``num_gemms x 3`` forward and ``x 2`` backward fp32 amaxes (module/base.py
line 360 at v1.8, 308-309 at v1.6rc1); a layer has 4 GEMMs (QKV, projection, FC1, FC2) and, from TE v1.8,
``DotProductAttention`` (a ``TransformerEngineBaseModule``, attention.py line 4267) registers 3 more through
``prepare_forward(num_gemms=3)`` (line 4701) even without fp8 attention (``Layout.fp8_attention_amax``). Its
module has no fp8 weights, so under ``fp8_params`` its amaxes form their own buffer key: a second reduction.

In the IR each reduction is a :class:`Collective` (``all_reduce``, purpose ``amax``) with its :class:`Wait` right
after it (synchronous) or before the next forward / backward layer compute (``tp-async-region``); the ``cat`` (a
read and a write of the amaxes) and the update kernel are folded into the compute op they follow, as
:mod:`.grad_scaling` folds its kernel (the update kernel runs after the all-reduce in truth: a kernel launch
placed ~the all-reduce's 10-90 us early). The amax history the update kernel rolls (``amax_history_len`` x the
amaxes, about 1 MB for 12 GPT-3 layers at 1024) is not counted. Not modelled: the one more forward reduction per
step that ``fp8_params`` adds after the optimizer (float8_tensor.py lines 71-93 at v1.6rc1), and recompute
(the dev rows that use this run none).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from simgrid.ir.ops import Collective, Compute, Op, Wait
from simgrid.layout.mesh import Mesh
from simgrid.layout.spec import Layout
from simgrid.model.blocks import stage_layer_counts
from simgrid.schedules.lower.context import LoweringContext, Role

AMAX_BYTES = 4
"""TE keeps amaxes in fp32 (``amax_history`` is float32, module/base.py ``set_meta_tensor``)."""
LINEAR_GEMMS_PER_LAYER = 4
"""QKV, attention projection, FC1 and FC2: one fp8 GEMM each (a gated FC1 is one GEMM of twice the width)."""
ATTENTION_GEMMS_PER_LAYER = 3
"""``DotProductAttention.forward`` calls ``prepare_forward(..., num_gemms=3)`` (attention.py line 4701 at TE v1.8)."""
FORWARD_AMAXES_PER_GEMM = 3
"""Input, weight and output (``num_gemms * 3``, module/base.py line 360 at TE v1.8)."""
BACKWARD_AMAXES_PER_GEMM = 2
"""Output gradient and input gradient (``num_gemms * 2``)."""
CAT_READS_WRITES = 2
"""``torch.cat`` reads each amax once and writes it once."""


@dataclass(frozen=True, kw_only=True)
class AmaxKey:
    """One buffer key TE reduces on its own: one ``cat``, one all-reduce, one update kernel."""

    label: str
    """``linear`` or ``attention``, or ``all`` when one key holds both."""
    forward_bytes_per_layer: int
    """fp32 amaxes of the key's modules in one layer, forward."""
    backward_bytes_per_layer: int
    """The same, backward."""


def reduces_amax(layout: Layout) -> bool:
    """True when the layout runs TE delayed scaling with an amax reduction that crosses ranks."""
    mode = layout.fp8_amax_reduction
    if layout.fp8_recipe != "delayed" or mode == "none":
        return False
    if mode == "stage":
        return layout.tp * layout.dp * layout.cp > 1  # TE skips a group of one (fp8.py line 343 at v1.8)
    return layout.tp > 1  # 09ba842 returns before the cat without TP (fp8.py lines 354-356); v1.6+ as above


def amax_keys(layout: Layout) -> tuple[AmaxKey, ...]:
    """The buffer keys one reduction walks (module docstring)."""
    def key(label: str, gemms: int) -> AmaxKey:
        return AmaxKey(label=label, forward_bytes_per_layer=gemms * FORWARD_AMAXES_PER_GEMM * AMAX_BYTES,
                       backward_bytes_per_layer=gemms * BACKWARD_AMAXES_PER_GEMM * AMAX_BYTES)

    attention = layout.fp8_attention_amax and layout.fp8_amax_reduction != "tp-async-region"
    if not attention:
        return (key("linear", LINEAR_GEMMS_PER_LAYER),)
    if layout.fp8_params:  # fp8-weight modules and the weightless attention sit under different keys
        return key("linear", LINEAR_GEMMS_PER_LAYER), key("attention", ATTENTION_GEMMS_PER_LAYER)
    return (key("all", LINEAR_GEMMS_PER_LAYER + ATTENTION_GEMMS_PER_LAYER),)


def amax_group_name(pp_rank: int) -> str:
    """Megatron-Core's amax reduction group of a pipeline rank (tensor-, data- and context-parallel ranks)."""
    return f"amax/pp{pp_rank}"


def amax_groups(layout: Layout) -> dict[str, tuple[int, ...]]:
    """The ``stage`` groups: the mesh orders ranks tp fastest, then cp, then dp, then pp, so a stage's ranks are
    one contiguous range (:func:`simgrid.schedules.build.mesh_groups`)."""
    if not reduces_amax(layout) or layout.fp8_amax_reduction != "stage":
        return {}
    size = layout.tp * layout.cp * layout.dp
    return {amax_group_name(p): tuple(range(p * size, (p + 1) * size)) for p in range(layout.pp)}


def _is_layer_op(op: Op, kinds: tuple[str, ...], last_block: int) -> bool:
    return isinstance(op, Compute) and op.kind in kinds and op.block_start <= last_block and op.block_end > 1


def add_amax_reduction(ctx: LoweringContext, role: Role, pp_rank: int) -> Role:
    """Insert the amax all-reduces of each forward and backward layer run (module docstring)."""
    lay = ctx.layout
    if not reduces_amax(lay):
        return role
    keys = amax_keys(lay)
    mode = lay.fp8_amax_reduction
    group = amax_group_name(pp_rank) if mode == "stage" else Mesh.tp_group_name(ctx.coord(pp_rank))
    last_block = 2 * ctx.model.num_layers
    stage_layers = stage_layer_counts(ctx.model, lay)
    rank_layers = sum(stage_layers[s] for s in ctx.stages_of(pp_rank))
    pending: dict[str, list[Wait]] = {"F": [], "B": []}  # tp-async-region: handles the next run waits for
    for step in role:
        action = step.action
        if action is None:
            continue
        ops: list[Op] = list(step.ops)
        for direction, kinds in (("F", ("F",)), ("B", ("B", "I"))):
            at = [i for i, op in enumerate(ops) if _is_layer_op(op, kinds, last_block)]
            if not at:
                continue
            if pending[direction]:  # the first fp8 module of this run waits for the previous run's reduction
                ops[at[0]:at[0]] = pending[direction]
                at = [i + len(pending[direction]) for i in at]
                pending[direction] = []
            anchor = ops[at[-1]]
            assert isinstance(anchor, Compute)
            layers = stage_layers[anchor.stage] if mode == "tp-async-region" else rank_layers
            inserted: list[Op] = []
            folded_bytes = 0
            for key in keys:
                size = layers * (key.forward_bytes_per_layer if direction == "F" else key.backward_bytes_per_layer)
                folded_bytes += CAT_READS_WRITES * size
                handle = f"amax:s{anchor.stage}:m{anchor.microbatch}:{direction}:{key.label}"
                inserted.append(Collective(kind="all_reduce", group=group, bytes=size, purpose="amax", handle=handle,
                                           label=f"s{anchor.stage}:{direction}:amax-{key.label}"))
                if mode == "tp-async-region":
                    pending[direction].append(Wait(handle=handle))
                else:
                    inserted.append(Wait(handle=handle))
            kernels = len(keys) * (1 if mode == "tp-async-region" else 2)  # cat (+ fused update from v1.6rc1)
            ops[at[-1]] = replace(anchor, hbm_bytes=anchor.hbm_bytes + folded_bytes, kernels=anchor.kernels + kernels)
            after = next((i for i in range(at[-1] + 1, len(ops)) if isinstance(ops[i], Compute)), len(ops))
            ops[after:after] = inserted
        step.ops = ops
    leftover = pending["F"] + pending["B"]
    if leftover:  # the next step's first forward / backward would wait; here the step's last action does
        last = next(step for step in reversed(role) if step.action is not None)
        last.ops = [*last.ops, *leftover]
    return role
