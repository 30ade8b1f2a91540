"""Every valid parallel layout for a model, a GPU count and a global batch.

The search walks the degrees first (the context-parallel degrees asked for, default 1; tp, pp, and
dp = gpus / (tp * pp * cp)) and then, for each valid degree combination, the recipe (schedule and virtual stages, ZeRO stage, micro-batch size, recompute). Validity is
not re-implemented here: each candidate is built as a :class:`~simgrid.layout.Layout` and passed to
:func:`~simgrid.layout.check_layout` (and the schedule generator's own rule check); a ``LayoutError`` drops
the candidate and its message, with numbers blanked out, is counted as the reason. A degree triple that
is invalid is counted once, not once per recipe it would have had.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from simgrid.errors import LayoutError
from simgrid.layout import Layout, check_fp8_gpu, check_layout
from simgrid.model.spec import ModelSpec
from simgrid.sweep.constraints import SweepConstraints


@dataclass(frozen=True, kw_only=True)
class LayoutSpace:
    """The outcome of an enumeration: valid layouts and why the other candidates were dropped."""

    layouts: tuple[Layout, ...]
    """Valid layouts in enumeration order (tp, pp, schedule, vpp, zero, mbs, recompute)."""
    tried: int
    """Candidates built (valid + invalid)."""
    invalid_reasons: Counter[str] = field(default_factory=Counter)
    """Count of dropped candidates per reason (the LayoutError message with numbers blanked)."""
    invalid_examples: dict[str, str] = field(default_factory=dict)
    """Per reason, the first candidate's own message (with its numbers), to show what the reason means."""

    @property
    def invalid(self) -> int:
        """Candidates dropped as invalid."""
        return sum(self.invalid_reasons.values())


def enumerate_layouts(
    model: ModelSpec,
    cluster: Any = None,
    *,
    gpus: int,
    global_batch: int,
    constraints: SweepConstraints | None = None,
) -> list[Layout]:
    """Every valid layout of ``model`` on ``gpus`` GPUs with ``global_batch`` sequences per step.

    ``cluster`` is a :class:`simgrid.hardware` cluster (its ``gpus_per_node`` bounds tp), an integer
    GPUs-per-node, or ``None`` (tp bounded only by the GPU count).
    """
    return list(enumerate_layout_space(model, cluster, gpus=gpus, global_batch=global_batch,
                                       constraints=constraints).layouts)


def enumerate_layout_space(
    model: ModelSpec,
    cluster: Any = None,
    *,
    gpus: int,
    global_batch: int,
    constraints: SweepConstraints | None = None,
) -> LayoutSpace:
    """Like :func:`enumerate_layouts`, also counting the invalid candidates by reason."""
    c = constraints or SweepConstraints()
    _check_positive("gpus", gpus)
    _check_positive("global_batch", global_batch)
    # A recipe no layout can run (fp8 on a GPU without fp8) is the user's one error, not a
    # reason counted against every layout.
    fp8_recipe = str(dict(c.recipe).get("fp8_recipe", "none"))
    check_fp8_gpu(fp8_recipe, getattr(cluster, "gpu", None))
    gpus_per_node = _gpus_per_node(cluster, gpus)
    reasons: Counter[str] = Counter()
    examples: dict[str, str] = {}

    def drop(message: str) -> None:
        key = _reason_key(message)
        reasons[key] += 1
        examples.setdefault(key, message)

    layouts: list[Layout] = []
    tried = 0
    for cp in c.context_parallel:
        if gpus % cp:
            tried += 1
            drop(f"sweep: context_parallel {cp} does not divide the {gpus} GPUs; pick a divisor of {gpus}")
            continue
        for tp in _tp_degrees(gpus // cp, gpus_per_node, c):
            for pp in _pp_degrees(gpus // (tp * cp), model.num_layers, c):
                dp = gpus // (tp * pp * cp)
                if (c.dp is not None and dp not in _values(c.dp)) or (c.max_dp is not None and dp > c.max_dp):
                    continue
                degree_error = _degree_error(model, dp=dp, tp=tp, pp=pp, cp=cp, global_batch=global_batch)
                if degree_error is not None:
                    tried += 1
                    drop(degree_error)
                    continue
                for experts in _expert_degrees(model, tp * cp * dp, tp, c):
                    for kwargs in _recipes(dp=dp, tp=tp, pp=pp, cp=cp, layers=model.num_layers,
                                           global_batch=global_batch, c=c):
                        tried += 1
                        try:
                            layout = Layout(dp=dp, tp=tp, pp=pp, cp=cp, global_batch_size=global_batch,
                                            **dict(c.recipe), **experts, **kwargs)
                            check_layout(model, layout)
                            _check_schedule(layout)
                        except LayoutError as exc:
                            drop(str(exc))
                            continue
                        layouts.append(layout)
    return LayoutSpace(layouts=tuple(layouts), tried=tried, invalid_reasons=reasons, invalid_examples=examples)


def _degree_error(model: ModelSpec, *, dp: int, tp: int, pp: int, cp: int, global_batch: int) -> str | None:
    """The reason a (dp, tp, pp, cp) combination can never be valid, or ``None``."""
    try:
        # A MoE model with tp > 1 needs sequence parallelism; the recipes decide it, so the probe turns it on.
        probe = Layout(dp=dp, tp=tp, pp=pp, cp=cp, global_batch_size=global_batch, micro_batch_size=1,
                       sequence_parallel=model.moe is not None and tp > 1)
        check_layout(model, probe)
    except LayoutError as exc:
        return str(exc)
    return None


def _recipes(*, dp: int, tp: int, pp: int, cp: int, layers: int, global_batch: int, c: SweepConstraints) -> Any:
    """Keyword sets (schedule, vpp, zero, micro-batch, recompute, sequence parallel, TP comm overlap, flash
    attention, param-gather overlap) for one triple."""
    if pp == 1:
        schedule_vpps = [("none", 1)]
    else:
        schedule_vpps = []
        for schedule in c.schedules:
            if schedule in ("interleaved-1f1b", "interleaved-zb", "looped-bfs"):
                first = 1 if schedule == "looped-bfs" else 2
                schedule_vpps += [
                    (schedule, v) for v in (c.vpps or range(first, c.max_vpp + 1))
                    if pp * v <= layers and (c.allow_uneven_stages or layers % (pp * v) == 0)
                ]
            elif schedule in ("zbv", "dualpipev"):
                schedule_vpps.append((schedule, 2))
            else:
                schedule_vpps.append((schedule, 1))
    # ZeRO over one replica (and one sequence part) shards nothing: stage 0 stands for all of them.
    zero_stages = [z for z in c.zero_stages if dp * cp > 1 or z == 0] or [0]
    per_replica = global_batch // dp
    if c.micro_batch_sizes is not None:
        mbs_values = [m for m in c.micro_batch_sizes if per_replica % m == 0]
    else:
        mbs_values = [m for m in range(1, min(c.max_mbs, per_replica) + 1) if per_replica % m == 0]
    sp_values = [sp for sp in c.sequence_parallel if tp > 1 or not sp] or [False]
    # The two Megatron-Core overlaps apply to some layouts only (Layout's rules): elsewhere they stay off, so
    # "both" doubles just the layouts where they apply and "on" leaves the others as they were.
    overlap_grad_reduce = dict(c.recipe).get("overlap_grad_reduce", True)
    for schedule, vpp in schedule_vpps:
        for zero in zero_stages:
            gather_values = _switch_values(c.overlap_param_gather, zero == 1 and overlap_grad_reduce)
            for mbs in mbs_values:
                for recompute in c.recompute:
                    for sp in sp_values:
                        for tp_overlap in _switch_values(c.tp_comm_overlap, tp > 1 and sp):
                            for flash in c.flash_attention:
                                if flash and recompute == "selective":
                                    continue  # FlashAttention recomputes the core itself (Layout refuses it)
                                for gather in gather_values:
                                    yield {
                                        "schedule": schedule,
                                        "vpp": vpp,
                                        "zero": zero,
                                        "micro_batch_size": mbs,
                                        "recompute": recompute,
                                        "sequence_parallel": sp,
                                        "tp_comm_overlap": tp_overlap,
                                        "flash_attention": flash,
                                        "overlap_param_gather": gather,
                                    }


def _switch_values(asked: tuple[bool, ...], applies: bool) -> list[bool]:
    """The settings of an optional switch to try on one layout: those asked for where it applies, else off."""
    return list(asked) if applies else [False]


def _expert_degrees(model: ModelSpec, stage_ranks: int, tp: int, c: SweepConstraints) -> list[dict[str, Any]]:
    """(ep, etp) keyword sets for one (tp, cp, dp): for a MoE model every asked-for (default: power-of-two
    dividing the experts) ep and etp (default 1 and tp) whose product divides the stage's ranks; nothing
    to vary for a dense model."""
    if model.moe is None:
        return [{}]
    experts = model.moe.num_experts
    eps = c.expert_parallel or tuple(e for e in (2**k for k in range(experts.bit_length())) if experts % e == 0)
    etps = c.expert_tensor_parallel or tuple(sorted({1, tp}))
    return [{"ep": ep, "etp": etp} for ep in eps for etp in etps if stage_ranks % (ep * etp) == 0]


def _tp_degrees(gpus: int, gpus_per_node: int, c: SweepConstraints) -> list[int]:
    if c.tp is not None:
        return [t for t in _values(c.tp) if gpus % t == 0]
    limit = gpus if c.allow_tp_across_nodes else min(gpus, gpus_per_node)
    if c.max_tp is not None:
        limit = min(limit, c.max_tp)
    degrees = []
    tp = 1
    while tp <= limit:
        if gpus % tp == 0:
            degrees.append(tp)
        tp *= 2
    return degrees


def _pp_degrees(gpus_left: int, layers: int, c: SweepConstraints) -> list[int]:
    if c.pp is not None:
        return [p for p in _values(c.pp) if gpus_left % p == 0]
    limit = min(gpus_left, layers, c.max_pp or gpus_left)
    return [
        p for p in range(1, limit + 1)
        if gpus_left % p == 0 and (c.allow_uneven_stages or layers % p == 0)
    ]


def _values(fixed: int | tuple[int, ...]) -> tuple[int, ...]:
    return fixed if isinstance(fixed, tuple) else (fixed,)


def _gpus_per_node(cluster: Any, gpus: int) -> int:
    if cluster is None:
        return gpus
    if isinstance(cluster, int) and not isinstance(cluster, bool):
        _check_positive("gpus_per_node", cluster)
        return cluster
    per_node = getattr(cluster, "gpus_per_node", None)
    if per_node is None:
        node = getattr(cluster, "node", None)
        per_node = getattr(node, "gpus_per_node", None)
    if not isinstance(per_node, int) or per_node <= 0:
        raise LayoutError(
            f"sweep: cannot read gpus_per_node from {type(cluster).__name__}; pass a cluster, an integer "
            "GPUs-per-node or None"
        )
    return per_node


def _check_schedule(layout: Layout) -> None:
    """The schedule generator's own rules (they may be stricter than the layout's)."""
    from simgrid.schedules.pipeline import check_schedule

    check_schedule(layout.schedule or "none", layout.pp, layout.num_microbatches, layout.vpp)


def _check_positive(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise LayoutError(f"sweep: {name} = {value!r} must be a positive integer")


_NUMBER = re.compile(r"\b\d+\b")


def _reason_key(message: str) -> str:
    """A message's first clause with numbers blanked, so equal rules with different values group."""
    head = message.removeprefix("layout: ").split(";")[0]
    return _NUMBER.sub("N", head).strip()
