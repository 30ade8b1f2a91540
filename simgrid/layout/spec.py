"""The parallel layout: how a training step is split over GPUs.

One validated object: degrees, ZeRO stage, batch sizes, pipeline schedule, recompute policy, precision
and optimizer. Model-independent rules are checked on construction; rules that need the model (tp divides
heads, pp * vpp divides layers) are checked by :func:`check_layout`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, get_args

from simgrid.errors import LayoutError

if TYPE_CHECKING:
    from simgrid.model.spec import ModelSpec

ScheduleName = Literal["none", "gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zbv"]
RecomputePolicy = Literal["none", "selective", "full"]
Precision = Literal["bf16", "fp16", "fp32"]
OptimizerName = Literal["adam", "adam-8bit", "sgd"]
DataParallelMode = Literal["allreduce", "parameter-server"]

SCHEDULES: tuple[str, ...] = get_args(ScheduleName)
RECOMPUTE_POLICIES: tuple[str, ...] = get_args(RecomputePolicy)
PRECISIONS: tuple[str, ...] = get_args(Precision)
OPTIMIZERS: tuple[str, ...] = get_args(OptimizerName)
DP_MODES: tuple[str, ...] = get_args(DataParallelMode)

#: Schedules that place more than one model chunk on each pipeline rank, and how many they need.
CHUNKED_SCHEDULES = {"interleaved-1f1b": None, "zbv": 2}


@dataclass(frozen=True, kw_only=True)
class Layout:
    """Degrees of parallelism and the training-step recipe for one run."""

    dp: int = 1
    """Data-parallel degree (model replicas)."""
    tp: int = 1
    """Tensor-parallel degree (Megatron 1-D: attention heads and MLP columns split)."""
    pp: int = 1
    """Pipeline-parallel degree (number of pipeline ranks)."""
    cp: int = 1
    """Context-parallel degree: each rank of a CP group holds ``seq_length / cp`` tokens of every sequence and
    all-gathers the keys and values of the others for attention (Llama 3's all-gather context
    parallelism, Dubey et al. 2024, section 3.3.2). Parameters are replicated over the CP group."""
    vpp: int = 1
    """Model chunks per pipeline rank (virtual stages): >1 for interleaved 1F1B, 2 for ZBV."""
    zero: int = 0
    """ZeRO stage 0-3: 1 shards optimizer states, 2 also gradients, 3 also parameters."""
    micro_batch_size: int = 1
    """Sequences per micro-batch per data-parallel replica."""
    global_batch_size: int | None = None
    """Sequences per optimizer step over all replicas; ``None`` means ``micro_batch_size * dp``."""
    schedule: ScheduleName | None = None
    """Pipeline schedule; ``None`` picks ``"none"`` for pp = 1 and ``"1f1b"`` otherwise."""
    recompute: RecomputePolicy = "none"
    """Activation recomputation: none, selective (attention core) or full (whole layer)."""
    sequence_parallel: bool = False
    """Megatron sequence parallelism: shard norms/dropout along the sequence (needs tp > 1)."""
    flash_attention: bool = False
    """Fused attention core (FlashAttention; Dao et al. 2022, Dao 2023): the s x s scores never reach HBM
    or the saved activations, and the backward recomputes Q K^T in its place. Off by default, as in the
    Megatron-LM runs the validation reproduces."""
    precision: Precision = "bf16"
    """Parameter/activation dtype; bf16/fp16 imply mixed precision with fp32 master weights."""
    optimizer: OptimizerName = "adam"
    """Optimizer: Adam (fp32 states), 8-bit Adam (quantised moments) or SGD with momentum."""
    offload_optimizer: bool = False
    """Keep optimizer states and run the update on the host CPU (ZeRO-Offload)."""
    dp_mode: DataParallelMode = "allreduce"
    """Gradient sync: bucketed all-reduce (DDP) or parameter server (reduce, update on rank 0, broadcast)."""
    bucket_size_MB: float = 25.0
    """Gradient bucket size for overlapped data-parallel sync (PyTorch DDP default 25 MB)."""
    zero3_prefetch_depth: int = 1
    """Layers whose parameters ZeRO-3 gathers ahead of use."""
    overlap_grad_reduce: bool = True
    """Overlap the data-parallel gradient sync with the backward, bucket by bucket (PyTorch DDP); False
    syncs every bucket after the last backward (Megatron-LM 2021's ``--DDP-impl local``)."""

    def __post_init__(self) -> None:
        for field in ("dp", "tp", "pp", "cp", "vpp", "micro_batch_size", "zero3_prefetch_depth"):
            _positive_int(field, getattr(self, field))
        if self.global_batch_size is not None:
            _positive_int("global_batch_size", self.global_batch_size)
        if not isinstance(self.zero, int) or isinstance(self.zero, bool) or self.zero not in (0, 1, 2, 3):
            raise LayoutError(f"layout: zero = {self.zero!r} must be a ZeRO stage 0, 1, 2 or 3")
        _choice("schedule", self.schedule, SCHEDULES, allow_none=True)
        _choice("recompute", self.recompute, RECOMPUTE_POLICIES)
        _choice("precision", self.precision, PRECISIONS)
        _choice("optimizer", self.optimizer, OPTIMIZERS)
        _choice("dp_mode", self.dp_mode, DP_MODES)
        for flag in ("sequence_parallel", "flash_attention", "offload_optimizer", "overlap_grad_reduce"):
            if not isinstance(getattr(self, flag), bool):
                raise LayoutError(f"layout: {flag} = {getattr(self, flag)!r} must be true or false")
        if isinstance(self.bucket_size_MB, bool) or not isinstance(self.bucket_size_MB, int | float):
            raise LayoutError(f"layout: bucket_size_MB = {self.bucket_size_MB!r} must be a number of MB")
        if not self.bucket_size_MB > 0:
            raise LayoutError(f"layout: bucket_size_MB = {self.bucket_size_MB!r} must be > 0")
        if self.schedule is None:
            object.__setattr__(self, "schedule", "none" if self.pp == 1 else "1f1b")
        self._check_rules()

    # -- derived sizes -------------------------------------------------------------------------
    @property
    def world_size(self) -> int:
        """GPUs in the run: ``dp * tp * pp * cp``."""
        return self.dp * self.tp * self.pp * self.cp

    @property
    def grad_sync_size(self) -> int:
        """Ranks holding the same parameters: ``dp * cp``. Gradients are summed, and ZeRO shards, over them
        (each context-parallel rank's gradients cover only its part of every sequence)."""
        return self.dp * self.cp

    @property
    def gbs(self) -> int:
        """Global batch in sequences, with the default applied."""
        return self.global_batch_size if self.global_batch_size is not None else self.micro_batch_size * self.dp

    @property
    def num_microbatches(self) -> int:
        """Micro-batches each replica runs per step (gradient accumulation steps)."""
        return self.gbs // (self.micro_batch_size * self.dp)

    @property
    def num_stages(self) -> int:
        """Pipeline stages in total (model chunks): ``pp * vpp``."""
        return self.pp * self.vpp

    @property
    def mixed_precision(self) -> bool:
        """Training keeps fp32 master weights beside 16-bit working weights."""
        return self.precision != "fp32"

    @property
    def param_bytes(self) -> int:
        """Bytes of one working parameter (and of one activation element)."""
        return 4 if self.precision == "fp32" else 2

    # -- rules ---------------------------------------------------------------------------------
    def _check_rules(self) -> None:
        from simgrid.limits import check_world_size

        check_world_size(self.world_size, what=f"layout dp * tp * pp * cp = {self.dp} * {self.tp} * {self.pp} * {self.cp}")
        if self.gbs % (self.micro_batch_size * self.dp):
            raise LayoutError(
                f"layout: global_batch_size = {self.gbs} is not divisible by micro_batch_size * dp = "
                f"{self.micro_batch_size} * {self.dp}; choose a global batch that is a multiple of "
                f"{self.micro_batch_size * self.dp}"
            )
        m = self.num_microbatches
        if self.pp == 1 and self.schedule != "none":
            raise LayoutError(
                f"layout: schedule = {self.schedule!r} needs pipeline parallelism but pp = 1; "
                "use schedule 'none' or set pp > 1"
            )
        if self.pp > 1 and self.schedule == "none":
            raise LayoutError(
                f"layout: pp = {self.pp} needs a pipeline schedule; pick one of "
                f"{', '.join(s for s in SCHEDULES if s != 'none')}"
            )
        if self.schedule == "interleaved-1f1b":
            if self.vpp < 2:
                raise LayoutError(
                    f"layout: schedule 'interleaved-1f1b' needs vpp >= 2 model chunks per rank, got "
                    f"vpp = {self.vpp}; set vpp to 2 or more, or use '1f1b'"
                )
            if m % self.pp:
                raise LayoutError(
                    f"layout: interleaved 1F1B needs the micro-batch count ({m} = global batch {self.gbs} / "
                    f"(micro-batch {self.micro_batch_size} * dp {self.dp})) to be a multiple of pp = "
                    f"{self.pp}; change the global batch or the micro-batch size"
                )
        elif self.schedule == "zbv":
            if self.vpp != 2:
                raise LayoutError(
                    f"layout: schedule 'zbv' places exactly 2 model chunks on each rank (a V shape); "
                    f"got vpp = {self.vpp}; set vpp = 2"
                )
        elif self.vpp != 1:
            raise LayoutError(
                f"layout: vpp = {self.vpp} (virtual stages) only applies to 'interleaved-1f1b' and 'zbv'; "
                f"schedule is {self.schedule!r}; set vpp = 1 or change the schedule"
            )
        if self.flash_attention and self.recompute == "selective":
            raise LayoutError(
                "layout: recompute 'selective' reruns the attention core, which flash_attention already "
                "recomputes inside its backward (nothing is left to recompute selectively); use recompute "
                "'none' or 'full' with flash_attention"
            )
        if self.sequence_parallel and self.tp == 1:
            raise LayoutError(
                "layout: sequence_parallel shards along the sequence over the tensor-parallel group and "
                "needs tp > 1; set tp > 1 or turn sequence parallelism off"
            )
        if self.zero >= 2 and self.pp > 1:
            raise LayoutError(
                f"layout: zero = {self.zero} with pp = {self.pp} is not supported: ZeRO-2/3 shard gradients "
                "that pipeline stages accumulate over micro-batches (DeepSpeed and Megatron-LM refuse it "
                "too); use zero <= 1 with pipeline parallelism"
            )
        if self.dp_mode == "parameter-server" and self.cp > 1:
            raise LayoutError(
                f"layout: dp_mode 'parameter-server' with cp = {self.cp} is not modelled (the server would "
                "have to sum the context-parallel partial gradients too); use dp_mode 'allreduce'"
            )
        if self.dp_mode == "parameter-server" and self.zero:
            raise LayoutError(
                f"layout: dp_mode 'parameter-server' keeps full optimizer states on one rank and cannot "
                f"be combined with zero = {self.zero}; use dp_mode 'allreduce' for ZeRO"
            )
        if self.zero and self.dp == 1:
            # ZeRO over a single replica shards nothing; allowed (it degenerates to stage 0) but noted.
            pass

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready mapping of every field (round-trips through :meth:`from_dict`)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Layout:
        """Build from :meth:`to_dict` output; unknown keys are an error naming the key."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise LayoutError(f"layout has unknown field(s) {unknown}; known: {sorted(known)}")
        return cls(**data)


def check_layout(model: ModelSpec, layout: Layout) -> None:
    """Check the rules that need both the model and the layout; raise :class:`LayoutError`."""
    if model.num_heads % layout.tp:
        raise LayoutError(
            f"layout: tp = {layout.tp} does not divide the {model.num_heads} attention heads of "
            f"{model.name!r}; use a tp that divides {model.num_heads}"
        )
    if model.kv_heads % layout.tp and layout.tp % model.kv_heads:
        raise LayoutError(
            f"layout: tp = {layout.tp} and the {model.kv_heads} key/value heads of {model.name!r} do not "
            "divide one another; use a tp that divides or is a multiple of the KV head count"
        )
    if model.ffn_size % layout.tp:
        raise LayoutError(
            f"layout: tp = {layout.tp} does not divide the MLP width {model.ffn_size} of {model.name!r}"
        )
    if layout.num_stages > model.num_layers:
        raise LayoutError(
            f"layout: pp * vpp = {layout.pp} * {layout.vpp} = {layout.num_stages} stages exceed the "
            f"{model.num_layers} layers of {model.name!r}; every stage needs at least one layer"
        )
    if layout.cp > 1 and model.seq_length % (2 * layout.cp):
        raise LayoutError(
            f"layout: cp = {layout.cp} splits each sequence into 2 * cp = {2 * layout.cp} chunks (two per rank, "
            f"so causal attention work is balanced) but the sequence length {model.seq_length} is not a "
            f"multiple of {2 * layout.cp}; use a cp whose double divides {model.seq_length}"
        )
    local_seq = model.seq_length // layout.cp
    if layout.sequence_parallel and local_seq % layout.tp:
        raise LayoutError(
            f"layout: sequence parallel needs tp = {layout.tp} to divide the sequence length "
            f"{model.seq_length}" + (f" / cp {layout.cp} = {local_seq}" if layout.cp > 1 else "")
        )


def _positive_int(field: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise LayoutError(f"layout: {field} = {value!r} must be a positive integer")


def _choice(field: str, value: object, allowed: tuple[str, ...], *, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if value not in allowed:
        raise LayoutError(f"layout: {field} = {value!r} is not one of {', '.join(allowed)}")
