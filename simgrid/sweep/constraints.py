"""What a layout search may try: fixed or bounded degrees, allowed schedules, ZeRO stages and recompute.

The defaults describe the search a user planning a run would expect: every pipeline schedule, every
ZeRO stage, every recompute policy, micro-batches up to 8 sequences, up to 8 virtual stages per pipeline
rank, and tensor parallelism kept inside a node (Megatron SC'21, section 3.3: TP all-reduces every
layer, so it is only worth it over NVLink).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from simgrid.errors import LayoutError
from simgrid.layout import RECOMPUTE_POLICIES, SCHEDULES

#: Every pipeline schedule a search may be asked to try (``"none"`` is the only schedule for pp = 1).
ALL_PIPELINE_SCHEDULES: tuple[str, ...] = tuple(s for s in SCHEDULES if s != "none")
#: Pipeline schedules a search tries by default when pp > 1 (the others on request: --schedule).
PIPELINE_SCHEDULES: tuple[str, ...] = ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zbv")
ZERO_STAGES: tuple[int, ...] = (0, 1, 2, 3)
SEARCHED_RECOMPUTE: tuple[str, ...] = tuple(p for p in RECOMPUTE_POLICIES if p != "selective-op")
"""Recompute policies a search tries by default: torchtitan's per-op checkpointing (``selective-op``) is one
framework's policy, tried only when the user names it (``--recompute selective-op``)."""


@dataclass(frozen=True, kw_only=True)
class SweepConstraints:
    """Bounds on the layouts :func:`simgrid.sweep.enumerate_layouts` generates."""

    tp: int | tuple[int, ...] | None = None
    """Fixed tensor-parallel degree(s); ``None`` searches powers of two."""
    max_tp: int | None = None
    """Largest tensor-parallel degree tried; ``None`` means GPUs per node (or all GPUs across nodes)."""
    pp: int | tuple[int, ...] | None = None
    """Fixed pipeline-parallel degree(s); ``None`` searches every degree that divides the GPU count."""
    max_pp: int | None = None
    """Largest pipeline-parallel degree tried; ``None`` means no bound beyond the layer count."""
    dp: int | tuple[int, ...] | None = None
    """Fixed data-parallel degree(s); ``None`` lets it follow from ``gpus / (tp * pp)``."""
    max_dp: int | None = None
    """Largest data-parallel degree tried; ``None`` means no bound."""
    schedules: tuple[str, ...] = PIPELINE_SCHEDULES
    """Pipeline schedules tried when pp > 1."""
    zero_stages: tuple[int, ...] = ZERO_STAGES
    """ZeRO stages tried (only stage 0 is tried when dp = 1: the others shard nothing)."""
    recompute: tuple[str, ...] = SEARCHED_RECOMPUTE
    """Activation-recompute policies tried (``selective-op`` only when named)."""
    max_mbs: int = 8
    """Largest micro-batch size in sequences (sizes tried divide ``global_batch / dp``)."""
    micro_batch_sizes: tuple[int, ...] | None = None
    """Exact micro-batch sizes to try instead of every divisor up to ``max_mbs``."""
    max_vpp: int = 8
    """Largest number of model chunks per pipeline rank tried for interleaved 1F1B."""
    allow_tp_across_nodes: bool = False
    """Let tensor parallelism span nodes (slow: every layer all-reduces over the network)."""
    sequence_parallel: tuple[bool, ...] = (False,)
    """Sequence-parallel settings tried; ``True`` is only tried with tp > 1."""
    flash_attention: tuple[bool, ...] = (False,)
    """FlashAttention settings tried (selective recompute is skipped with it: nothing is left to recompute)."""
    tp_comm_overlap: tuple[bool, ...] = (False,)
    """Transformer Engine TP communication overlap settings tried (Megatron-Core ``--tp-comm-overlap``);
    ``True`` is only tried where it applies (tp > 1 with sequence parallelism), the other layouts keep it off."""
    overlap_param_gather: tuple[bool, ...] = (False,)
    """Deferred ZeRO-1 parameter all-gather settings tried (Megatron-Core ``--overlap-param-gather``); ``True``
    is only tried where it applies (zero = 1 with overlapped gradient reduce), the other layouts keep it off."""
    context_parallel: tuple[int, ...] = (1,)
    """Context-parallel degrees tried (each rank holds ``seq / cp`` tokens; Llama 3's all-gather CP)."""
    expert_parallel: tuple[int, ...] | None = None
    """Expert-parallel degrees tried for a MoE model; ``None`` tries every power of two dividing the expert count
    (each must also divide the ``tp * cp * dp`` ranks of a stage, MoE parallel folding). Dense models: 1."""
    expert_tensor_parallel: tuple[int, ...] | None = None
    """Expert tensor-parallel degrees tried for a MoE model; ``None`` tries 1 and tp (Megatron's default)."""
    vpps: tuple[int, ...] | None = None
    """Chunks per pipeline rank tried by the interleaved schedules; ``None``: 2 to ``max_vpp``."""
    recipe: tuple[tuple[str, Any], ...] = ()
    """Layout fields every candidate keeps as given, e.g. ``(("precision", "fp16"),)``."""
    allow_uneven_stages: bool = False
    """Also try pp * vpp that does not divide the layer count (stages then differ by a layer; the
    slowest stage sets the pace, so even splits are tried by default, as Megatron-LM requires)."""

    def __post_init__(self) -> None:
        for name in ("tp", "max_tp", "pp", "max_pp", "dp", "max_dp"):
            value = getattr(self, name)
            values = value if isinstance(value, tuple) and name in ("tp", "pp", "dp") else (value,)
            if value is not None and not (values and all(_is_positive_int(v) for v in values)):
                raise LayoutError(f"sweep constraint {name} = {value!r} must be a positive integer or unset")
        for name in ("max_mbs", "max_vpp"):
            if not _is_positive_int(getattr(self, name)):
                raise LayoutError(f"sweep constraint {name} = {getattr(self, name)!r} must be a positive integer")
        _check_choices("schedules", self.schedules, ALL_PIPELINE_SCHEDULES)
        if self.vpps is not None and not (self.vpps and all(_is_positive_int(v) for v in self.vpps)):
            raise LayoutError(f"sweep constraint vpps = {self.vpps!r} must be a non-empty tuple of positive integers")
        _check_choices("zero_stages", self.zero_stages, ZERO_STAGES)
        _check_choices("recompute", self.recompute, RECOMPUTE_POLICIES)
        _check_choices("sequence_parallel", self.sequence_parallel, (False, True))
        _check_choices("flash_attention", self.flash_attention, (False, True))
        _check_choices("tp_comm_overlap", self.tp_comm_overlap, (False, True))
        _check_choices("overlap_param_gather", self.overlap_param_gather, (False, True))
        if not self.context_parallel or not all(_is_positive_int(c) for c in self.context_parallel):
            raise LayoutError(
                f"sweep constraint context_parallel = {self.context_parallel!r} must be a non-empty tuple of "
                "positive integers"
            )
        for name in ("expert_parallel", "expert_tensor_parallel"):
            values = getattr(self, name)
            if values is not None and (not values or not all(_is_positive_int(v) for v in values)):
                raise LayoutError(
                    f"sweep constraint {name} = {values!r} must be a non-empty tuple of positive integers or unset"
                )
        mbs = self.micro_batch_sizes
        if mbs is not None and (not mbs or not all(_is_positive_int(m) for m in mbs)):
            raise LayoutError(
                f"sweep constraint micro_batch_sizes = {mbs!r} must be a non-empty tuple of positive integers"
            )
        for fixed, bound in (("tp", "max_tp"), ("pp", "max_pp"), ("dp", "max_dp")):
            f, b = getattr(self, fixed), getattr(self, bound)
            f = max(f) if isinstance(f, tuple) else f
            if f is not None and b is not None and f > b:
                raise LayoutError(
                    f"sweep constraints {fixed} = {f} and {bound} = {b} contradict; drop one or raise {bound}"
                )

    def describe(self) -> str:
        """The constraints that differ from the defaults, as ``name=value`` pairs (``"defaults"`` if none)."""
        default = SweepConstraints()
        changed = [
            f"{name}={_short(value)}"
            for name, value in self.__dict__.items()
            if value != getattr(default, name)
        ]
        return ", ".join(changed) if changed else "defaults"


def _is_positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _check_choices(name: str, values: tuple[Any, ...], allowed: tuple[Any, ...]) -> None:
    if not isinstance(values, tuple) or not values:
        raise LayoutError(f"sweep constraint {name} = {values!r} must be a non-empty tuple from {allowed}")
    bad = [v for v in values if v not in allowed or isinstance(v, bool) != isinstance(allowed[0], bool)]
    if bad:
        raise LayoutError(
            f"sweep constraint {name} has {bad!r}; allowed: {', '.join(str(a) for a in allowed)}"
        )


def _short(value: object) -> str:
    if isinstance(value, tuple):
        return "/".join(str(v) for v in value)
    return str(value)
