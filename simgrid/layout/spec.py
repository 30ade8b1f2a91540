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

ScheduleName = Literal["none", "gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zbv", "interleaved-zb", "looped-bfs",
                       "dualpipev"]
RecomputePolicy = Literal["none", "selective", "full", "selective-op"]
Precision = Literal["bf16", "fp16", "fp32"]
OptimizerName = Literal["adam", "adam-8bit", "sgd"]
DataParallelMode = Literal["allreduce", "parameter-server"]
AttentionKernel = Literal["auto", "fa2", "fa3"]
KernelFusion = Literal["fused", "eager", "eager-fused-norm"]
ZeroImpl = Literal["deepspeed", "fsdp2", "apex"]
ReduceDtype = Literal["param", "fp32"]
BucketPolicy = Literal["ddp", "megatron"]
CrossEntropyImpl = Literal["fused", "unfused"]
OptimizerImpl = Literal["fused", "foreach"]
TPImpl = Literal["megatron", "dtensor"]
CheckpointImpl = Literal["reentrant", "non-reentrant", "non-reentrant-modules"]
FP8Recipe = Literal["none", "delayed", "current"]
P2POrder = Literal["witness", "megatron-core", "megatron-batched"]
FP8AmaxReduction = Literal["stage", "tp", "tp-async-region", "none"]
DropoutPolicy = Literal["auto", "on", "off"]

SCHEDULES: tuple[str, ...] = get_args(ScheduleName)
RECOMPUTE_POLICIES: tuple[str, ...] = get_args(RecomputePolicy)
PRECISIONS: tuple[str, ...] = get_args(Precision)
OPTIMIZERS: tuple[str, ...] = get_args(OptimizerName)
DP_MODES: tuple[str, ...] = get_args(DataParallelMode)
ATTENTION_KERNEL_CHOICES: tuple[str, ...] = get_args(AttentionKernel)
KERNEL_FUSIONS: tuple[str, ...] = get_args(KernelFusion)
ZERO_IMPLS: tuple[str, ...] = get_args(ZeroImpl)
REDUCE_DTYPES: tuple[str, ...] = get_args(ReduceDtype)
BUCKET_POLICIES: tuple[str, ...] = get_args(BucketPolicy)
CROSS_ENTROPY_IMPLS: tuple[str, ...] = get_args(CrossEntropyImpl)
OPTIMIZER_IMPLS: tuple[str, ...] = get_args(OptimizerImpl)
TP_IMPLS: tuple[str, ...] = get_args(TPImpl)
CHECKPOINT_IMPLS: tuple[str, ...] = get_args(CheckpointImpl)
FP8_RECIPES: tuple[str, ...] = get_args(FP8Recipe)
P2P_ORDERS: tuple[str, ...] = get_args(P2POrder)
FP8_AMAX_REDUCTIONS: tuple[str, ...] = get_args(FP8AmaxReduction)
DROPOUT_POLICIES: tuple[str, ...] = get_args(DropoutPolicy)

#: Schedules that place more than one model chunk on each pipeline rank, and how many they need
#: (None: vpp >= 2 interleaved chunks; looped-bfs also runs with one).
CHUNKED_SCHEDULES = {"interleaved-1f1b": None, "zbv": 2, "interleaved-zb": None, "looped-bfs": None, "dualpipev": 2}

#: Bytes of one fp32 element (IEEE 754 binary32): master weights, fp32 gradients and optimizer moments. The one
#: home of the constant: the layout is the lowest layer that the model and the lowering both import.
FP32_BYTES = 4


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
    ep: int = 1
    """Expert-parallel degree (MoE models): each rank of an EP group holds ``num_experts / ep`` experts and
    all-to-alls tokens to them. With MoE parallel folding (Megatron-Core) the experts lay ``etp x ep x edp``
    over the same ``tp x cp x dp`` ranks of a pipeline stage that attention uses (:class:`~.mesh.Mesh`)."""
    etp: int | None = None
    """Expert tensor-parallel degree: each expert's MLP is split over ``etp`` ranks; ``None`` means ``tp``
    (Megatron-Core's default for ``--expert-tensor-parallel-size``)."""
    vpp: int = 1
    """Model chunks per pipeline rank (virtual stages): >1 for interleaved 1F1B and interleaved ZB, >= 1 for
    looped BFS, 2 for ZBV and DualPipeV."""
    zero: int = 0
    """ZeRO stage 0-3: 1 shards optimizer states, 2 also gradients, 3 also parameters."""
    micro_batch_size: int = 1
    """Sequences per micro-batch per data-parallel replica."""
    global_batch_size: int | None = None
    """Sequences per optimizer step over all replicas; ``None`` means ``micro_batch_size * dp``."""
    schedule: ScheduleName | None = None
    """Pipeline schedule; ``None`` picks ``"none"`` for pp = 1 and ``"1f1b"`` otherwise."""
    recompute: RecomputePolicy = "none"
    """Activation recomputation: none, selective (Megatron: the attention core), full (whole layer) or
    selective-op (torchtitan's per-op selective checkpointing: every other matmul output and the fused
    attention output saved, the rest of each layer recomputed; :mod:`simgrid.model.selective_op`)."""
    sequence_parallel: bool = False
    """Megatron sequence parallelism: shard norms/dropout along the sequence (needs tp > 1)."""
    flash_attention: bool = False
    """Fused attention core (FlashAttention; Dao et al. 2022, Dao 2023): the s x s scores never reach HBM
    or the saved activations, and the backward recomputes Q K^T in its place. Off by default, as in the
    Megatron-LM runs the validation reproduces."""
    attention_kernel: AttentionKernel = "auto"
    """Which fused-attention kernel family runs the core when ``flash_attention`` is on: ``fa2``
    (FlashAttention-2, e.g. PyTorch SDPA's flash backend), ``fa3`` (FlashAttention-3; cuDNN's fused
    attention in Transformer Engine runs at a similar speed on H100) or ``auto`` (the GPU profile's default)."""
    kernel_fusion: KernelFusion = "fused"
    """How the element-wise work between the GEMMs runs: ``fused`` (Megatron-LM / Transformer Engine fused
    kernels, or torch.compile), ``eager`` (PyTorch eager, one kernel per op as torchtitan's Llama code
    writes it: fp32 RMSNorm chain, complex rotary, SiLU then multiply, separate Q/K/V and gate/up
    projections, a copy of the attention output) or ``eager-fused-norm`` (eager with a fused RMSNorm
    kernel, torchtitan's ``fused_rmsnorm``)."""
    precision: Precision = "bf16"
    """Parameter/activation dtype; bf16/fp16 imply mixed precision with fp32 master weights."""
    optimizer: OptimizerName = "adam"
    """Optimizer: Adam (fp32 states), 8-bit Adam (quantised moments) or SGD with momentum."""
    offload_optimizer: bool = False
    """Keep optimizer states and run the update on the host CPU (ZeRO-Offload)."""
    optimizer_impl: OptimizerImpl = "fused"
    """How the GPU optimizer step is launched: ``fused`` (one multi-tensor kernel: Megatron-LM / Transformer
    Engine FusedAdam, ``torch.optim.AdamW(fused=True)``, torchtitan's default since Feb 2025) or ``foreach``
    (``torch.optim.AdamW(foreach=True)``, torchtitan before then: a dozen ``_foreach_*`` ops, each dispatched
    per parameter tensor, host-bound on FSDP2's DTensors; :mod:`simgrid.schedules.lower.optimizer`)."""
    dp_mode: DataParallelMode = "allreduce"
    """Gradient sync: bucketed all-reduce (DDP) or parameter server (reduce, update on rank 0, broadcast)."""
    bucket_size_MB: float = 25.0
    """Gradient bucket size for overlapped data-parallel sync (PyTorch DDP default 25 MB)."""
    bucket_policy: BucketPolicy = "ddp"
    """How gradients are bucketed (:func:`simgrid.schedules.buckets.grad_buckets`): ``ddp`` closes buckets at
    ``bucket_size_MB`` on every stage (PyTorch DDP); ``megatron`` follows Megatron-Core's
    DistributedDataParallel (core_r0.8.0): ``max(40e6, 1e6 * dp)`` parameters per bucket on the first
    pipeline rank's first model chunk, one bucket per model chunk elsewhere (``bucket_size_MB`` unused)."""
    cross_entropy: CrossEntropyImpl = "fused"
    """How the loss turns the 16-bit logits into fp32 cross entropy (only its transient memory differs,
    :func:`simgrid.memory.loss_working_bytes`): ``fused`` is Megatron-Core's vocab-parallel kernel (fp32 softmax
    built and differentiated in place); ``unfused`` is ``F.cross_entropy(logits.float(), labels)`` as torchtitan
    calls it (an fp32 copy, an fp32 log-softmax and, in the backward, two more fp32 logit-sized tensors)."""
    zero3_prefetch_depth: int = 1
    """FSDP2: gather units (layers) whose parameters ZeRO-3 gathers ahead of use (FSDP2's implicit forward
    and default backward prefetch is 1). DeepSpeed prefetches by its bucket size instead."""
    zero_impl: ZeroImpl = "deepspeed"
    """How ZeRO-3 gathers and reduces (simgrid.model.zero3_units): ``deepspeed`` (ZeRO stage 3,
    per-module gathers with its default prefetch, reuse and bucket sizes) or ``fsdp2`` (PyTorch
    ``fully_shard`` per transformer layer). Read when ``zero = 3``, and for ``apex``, which needs ``zero = 1``:
    NeMo's apex ``DistributedFusedAdam`` under Megatron-Core's schedules (one bucket per transformer layer padded to
    ``bucket_size_MB``, per-chunk parameter and gradient sync; :mod:`simgrid.schedules.lower.apex_sync`)."""
    reduce_dtype: ReduceDtype = "param"
    """FSDP2's ``MixedPrecisionPolicy.reduce_dtype``: ``param`` (PyTorch's default, ``None``: gradients are
    reduce-scattered in the parameter dtype, 16-bit in mixed precision) or ``fp32`` (gradients cast to fp32
    before the reduce-scatter, twice the bytes; torchtitan's default, ``training.mixed_precision_reduce =
    "float32"``); with zero 3 ``fp32`` needs ``zero_impl = "fsdp2"``. With ZeRO 0-2, ``fp32`` is Megatron-LM's fp32
    ``main_grad`` (forced for bf16, ``accumulate_allreduce_grads_in_fp32``): gradients are kept (4 bytes per
    parameter) and all-reduced / reduce-scattered in fp32 (:func:`simgrid.memory.states.state_bytes_per_param`)."""
    overlap_grad_reduce: bool = True
    """Overlap the data-parallel gradient sync with the backward, bucket by bucket (PyTorch DDP); False
    syncs every bucket after the last backward (Megatron-LM 2021's ``--DDP-impl local``)."""
    overlap_param_gather: bool = False
    """Megatron-Core ``--overlap-param-gather`` (distributed optimizer, ZeRO-1): the updated parameters are
    all-gathered bucket by bucket in the *next* step's forward, each bucket waited for just before the first
    forward op that uses it (:mod:`simgrid.schedules.lower.param_gather`); False gathers every bucket after
    the optimizer step. Needs zero = 1 and overlap_grad_reduce (Megatron-LM's argument check)."""
    tp_comm_overlap: bool = False
    """Megatron-Core ``--tp-comm-overlap``: Transformer Engine's userbuffers run the sequence-parallel
    all-gathers and reduce-scatters of the transformer layers in chunks beside their GEMMs
    (:mod:`simgrid.schedules.lower.tp_overlap`); False issues each next to its GEMM and waits for it. Needs
    tp > 1 and sequence parallelism (Megatron-LM's argument check)."""
    tp_async_grad_comm: bool = False
    """Megatron-LM's asynchronous tensor-parallel backward communication (on by default from 2021-09 on,
    ``--no-async-tensor-model-parallel-allreduce`` turns it off; always on with ``--sequence-parallel``): the
    column-parallel linear's input-gradient all-reduce / reduce-scatter runs beside its weight-gradient GEMM
    and, with sequence parallelism, its input re-gather beside its input-gradient GEMM
    (:mod:`simgrid.schedules.lower.tp_async`); False waits for each next to its GEMM. A no-op at tp = 1 (as in
    Megatron-LM); not with tp_comm_overlap, whose Transformer Engine ``bulk`` overlap already does this."""
    grad_accumulation_fusion: bool = False
    """Megatron-LM's gradient accumulation fusion (``--gradient-accumulation-fusion``, on by default in Megatron-Core,
    megatron/training/arguments.py line 1163 at f2e5db4; Transformer Engine's ``fuse_wgrad_accumulation``): each
    weight-gradient GEMM accumulates into the parameter's ``main_grad`` (beta = 1: its epilogue reads C and writes
    D in main_grad's dtype, fp32 under ``reduce_dtype = "fp32"``, else the parameter dtype) instead of writing a
    fresh 16-bit gradient that a separate kernel then adds (:func:`simgrid.model.gemms.wgrad_accumulate_bytes`).
    Needs zero 0-2 (ZeRO-3 / FSDP2 have no ``main_grad``) and tp_impl ``megatron``."""
    tp_impl: TPImpl = "megatron"
    """Whose tensor parallelism, by its activation layout: ``megatron`` keeps activations ``[s, b, h]``, so the
    sequence-parallel all-gathers and reduce-scatters work on dim 0 with no copy (Megatron-LM); ``dtensor`` is
    PyTorch DTensor TP as torchtitan applies it to ``[b, s, h]`` activations sharded on dim 1, where every
    sequence-parallel all-gather is followed by, and every reduce-scatter preceded by, a chunk + cat copy of
    the whole tensor on the compute stream (:mod:`simgrid.schedules.lower.dtensor_copies`)."""
    checkpoint_impl: CheckpointImpl = "reentrant"
    """How ``recompute = "full"`` checkpoints (:mod:`simgrid.model.early_stop`): ``reentrant`` reruns each
    transformer layer's whole forward (Megatron-LM's ``tensor_parallel.checkpoint``); ``non-reentrant`` is
    PyTorch's ``torch.utils.checkpoint(use_reentrant=False)`` around each whole layer (torchtitan), whose
    recompute stops once every tensor saved for the backward is back, so a layer's last GEMM (the MLP's
    second matrix), what follows it and its output collective are not rerun; ``non-reentrant-modules`` wraps
    the attention and the MLP separately, norms and residual adds outside (NeMo AutoModel with torch.compile),
    so neither norm, neither residual add nor either output projection reruns. Per-op checkpointing
    (``selective-op``) is always non-reentrant and already stops early; ``selective`` is Megatron's."""
    fp8_recipe: FP8Recipe = "none"
    """Transformer Engine fp8 autocast over the transformer layers' linear layers, HYBRID format (E4M3 forward
    tensors, E5M2 gradients): ``delayed`` is TE ``DelayedScaling`` (scales from an amax history; Megatron
    ``--fp8-recipe delayed``), ``current`` is ``Float8CurrentScaling`` (an amax pass over each tensor before its
    cast; NeMo's "FP8-CS", Megatron ``--fp8-recipe tensorwise``); ``none`` runs every GEMM in ``precision``.
    Needs precision bf16 or fp16, a dense model and a GPU with an fp8 peak (:mod:`simgrid.layout.fp8_checks`;
    docs/design.md, "fp8 training" and "fp8 checks and MoE + fp8")."""
    fp8_params: bool = False
    """Transformer Engine's fp8 weights (NeMo ``model.fp8_params``: the model is built under TE ``fp8_model_init``,
    so every TE linear's weight is a ``Float8Tensor``): no 16-bit copy of those weights, no per-step weight cast in
    the forward (only the transpose cache refill), apex DistributedFusedAdam casts its updated fp32 shard to fp8 and
    all-gathers those weights as uint8, 1 byte per element (docs/design.md, "fp8 parameters (session 15)").
    Needs ``fp8_recipe = "delayed"`` and ``zero_impl = "apex"`` (the implementation read)."""
    fp8_amax_reduction: FP8AmaxReduction = "stage"
    """How Transformer Engine's delayed recipe reduces the amaxes (``fp8_recipe = "delayed"`` only;
    :mod:`simgrid.schedules.lower.amax_reduction`): ``stage`` (default: TE v1.6+ and Megatron-Core 338af514 on) one
    synchronous MAX all-reduce of every fp8 module's amaxes on the rank at each autocast exit and after each first
    module's backward, over the tensor-, data- and context-parallel ranks of the pipeline stage; ``tp`` the same
    over the tensor-parallel group (Megatron-Core core_v0.7.0.beta); ``tp-async-region`` TE 09ba842 with
    ``NVTE_DP_AMAX_REDUCE_INTERVAL=0`` and ``NVTE_ASYNC_AMAX_REDUCTION=1``: the region's amaxes, asynchronously over
    the tensor-parallel group, waited for before the next forward / backward; ``none``: no reduction
    (``reduce_amax`` False). docs/design.md, "TE amax reduction (session 16)"."""
    fp8_attention_amax: bool = True
    """Transformer Engine's ``DotProductAttention`` keeps fp8 metadata of 3 GEMMs and joins the amax buffers even
    without fp8 attention (TE v1.8 on: it is a ``TransformerEngineBaseModule``); false for older TE (v1.6rc1,
    09ba842), whose attention has none. With ``fp8_params`` its amaxes sit in a buffer of their own (their module
    has no fp8 weights), reduced by a second all-reduce."""

    p2p_order: P2POrder = "witness"
    """Where each pipeline rank posts its SENDs and RECVs (:mod:`simgrid.schedules.lower.p2p`): ``witness`` orders
    each peer pair's transfers by producer finish time in a unit-time run and posts each RECV as early as that
    order allows; ``megatron-core`` posts them where Megatron-Core's interleaved schedule with
    ``overlap_p2p_comm`` (its default there) does: the RECV for the next forward right after each forward, the
    one for the next backward right after each backward, each waited for before the next forward / backward,
    and a non-overlapped cool-down; with m = pp every forward runs before the first backward, as Megatron-Core
    does (:mod:`simgrid.schedules.lower.p2p_megatron`). Needs schedule ``interleaved-1f1b`` with m a multiple
    of pp. ``megatron-batched`` is Megatron-LM's path without that overlap (Megatron-Core's 1F1B, and Megatron-LM
    2021/2022): each schedule call's sends and receives are one batch, waited for at once
    (:mod:`simgrid.schedules.lower.p2p_batched`); needs ``1f1b``, or ``interleaved-1f1b`` with m a multiple of pp."""
    p2p_scatter_gather: bool = False
    """Megatron-LM's ``scatter_gather_tensors_in_pipeline`` (on by default from March 2021 to 2022: arguments.py line
    577 at 64a83fb, 585 at e269e20, 761 at 2755bcb87b): each tensor-parallel rank sends only its ``1/tp`` slice of
    the boundary tensor and the receiver all-gathers the slices over its tensor-parallel group after the batch
    (p2p_communication.py ``_communicate``). Needs ``p2p_order = "megatron-batched"`` (that code path) and no
    sequence parallelism (which already sends ``s/tp``; 2755bcb87b turns scatter-gather off under it, line 64)."""
    dropout: DropoutPolicy = "auto"
    """Whether the run trains with dropout (hidden and attention probability > 0): its masks (HBM bytes and
    saved activations, :mod:`simgrid.model.kernels`, :mod:`simgrid.model.activations`) and the unfused core's
    attention-dropout kernels. ``auto`` takes the model's usual recipe (:func:`simgrid.model.uses_dropout`: GPT
    with biases 0.1, Megatron-LM's ``--hidden-dropout`` / ``--attention-dropout`` defaults; Llama none); ``on`` /
    ``off`` state the run's own config, e.g. MLPerf GPT-3's ``hidden_dropout: 0.0`` / ``attention_dropout: 0.0``
    (docs/design.md, "Dropout as the recipes apply it (session 16)")."""

    def __post_init__(self) -> None:
        for field in ("dp", "tp", "pp", "cp", "ep", "vpp", "micro_batch_size", "zero3_prefetch_depth"):
            _positive_int(field, getattr(self, field))
        if self.etp is not None:
            _positive_int("etp", self.etp)
        if self.global_batch_size is not None:
            _positive_int("global_batch_size", self.global_batch_size)
        if not isinstance(self.zero, int) or isinstance(self.zero, bool) or self.zero not in (0, 1, 2, 3):
            raise LayoutError(f"layout: zero = {self.zero!r} must be a ZeRO stage 0, 1, 2 or 3")
        _choice("schedule", self.schedule, SCHEDULES, allow_none=True)
        _choice("recompute", self.recompute, RECOMPUTE_POLICIES)
        _choice("precision", self.precision, PRECISIONS)
        _choice("optimizer", self.optimizer, OPTIMIZERS)
        _choice("dp_mode", self.dp_mode, DP_MODES)
        _choice("attention_kernel", self.attention_kernel, ATTENTION_KERNEL_CHOICES)
        _choice("kernel_fusion", self.kernel_fusion, KERNEL_FUSIONS)
        _choice("zero_impl", self.zero_impl, ZERO_IMPLS)
        _choice("reduce_dtype", self.reduce_dtype, REDUCE_DTYPES)
        _choice("bucket_policy", self.bucket_policy, BUCKET_POLICIES)
        _choice("cross_entropy", self.cross_entropy, CROSS_ENTROPY_IMPLS)
        _choice("optimizer_impl", self.optimizer_impl, OPTIMIZER_IMPLS)
        _choice("tp_impl", self.tp_impl, TP_IMPLS)
        _choice("checkpoint_impl", self.checkpoint_impl, CHECKPOINT_IMPLS)
        _choice("fp8_recipe", self.fp8_recipe, FP8_RECIPES)
        _choice("p2p_order", self.p2p_order, P2P_ORDERS)
        _choice("fp8_amax_reduction", self.fp8_amax_reduction, FP8_AMAX_REDUCTIONS)
        _choice("dropout", self.dropout, DROPOUT_POLICIES)
        for flag in ("sequence_parallel", "flash_attention", "offload_optimizer", "overlap_grad_reduce",
                     "tp_comm_overlap", "overlap_param_gather", "tp_async_grad_comm", "grad_accumulation_fusion",
                     "fp8_params", "fp8_attention_amax", "p2p_scatter_gather"):
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
    def expert_tp(self) -> int:
        """Expert tensor-parallel degree with the default (``tp``) applied."""
        return self.etp if self.etp is not None else self.tp

    @property
    def edp(self) -> int:
        """Expert data-parallel degree: ranks of a pipeline stage holding the same expert shard,
        ``tp * cp * dp / (ep * etp)``; expert gradients are summed, and ZeRO shards expert states, over them."""
        return self.tp * self.cp * self.dp // (self.ep * self.expert_tp)

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
        return FP32_BYTES if self.precision == "fp32" else 2

    # -- rules ---------------------------------------------------------------------------------
    def _check_rules(self) -> None:
        from simgrid.limits import check_world_size

        check_world_size(self.world_size, what=f"layout dp * tp * pp * cp = {self.dp} * {self.tp} * {self.pp} * {self.cp}")
        stage_ranks = self.tp * self.cp * self.dp
        if stage_ranks % (self.ep * self.expert_tp):
            raise LayoutError(
                f"layout: ep * etp = {self.ep} * {self.expert_tp} must divide tp * cp * dp = {self.tp} * {self.cp} * "
                f"{self.dp} = {stage_ranks} (MoE parallel folding lays the experts over the ranks of one pipeline "
                "stage); change ep or etp (etp defaults to tp), or the dense degrees"
            )
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
        problem = schedule_problem(str(self.schedule), self.pp, m, self.vpp)
        if problem:
            raise LayoutError(
                f"layout: {problem} (m = global batch {self.gbs} / (micro-batch {self.micro_batch_size} * "
                f"dp {self.dp}))" if "micro-batch" in problem else f"layout: {problem}"
            )
        if self.p2p_order == "megatron-batched" and (self.schedule not in ("1f1b", "interleaved-1f1b")
                                                     or (self.schedule == "interleaved-1f1b" and m % self.pp)):
            raise LayoutError(
                f"layout: p2p_order 'megatron-batched' is Megatron-LM's batched, synchronised p2p of its 1F1B and "
                f"interleaved schedules, which needs schedule '1f1b', or 'interleaved-1f1b' with m a multiple of pp "
                f"(schedule = {self.schedule!r}, pp = {self.pp}, m = {m}); use p2p_order 'witness' or change the layout"
            )
        if self.p2p_scatter_gather and (self.p2p_order != "megatron-batched" or self.sequence_parallel):
            raise LayoutError(
                f"layout: p2p_scatter_gather is Megatron-LM's batched p2p of 1/tp slices, gathered over tp, which "
                f"needs p2p_order 'megatron-batched' and no sequence parallelism (p2p_order = {self.p2p_order!r}, "
                f"sequence_parallel = {self.sequence_parallel}); set those or drop p2p_scatter_gather"
            )
        if self.p2p_order == "megatron-core" and (self.schedule != "interleaved-1f1b" or m % self.pp):
            # Megatron-LM 338af514 arguments.py lines 271-277 turn overlap_p2p_comm off without interleaving;
            # schedules.py lines 566-570 need pp | m.
            raise LayoutError(
                f"layout: p2p_order 'megatron-core' is Megatron-Core's overlapped p2p of its interleaved schedule, "
                f"which needs schedule 'interleaved-1f1b' with m a multiple of pp (schedule = "
                f"{self.schedule!r}, pp = {self.pp}, m = {m}); use p2p_order 'witness' or change the layout"
            )
        if self.flash_attention and self.recompute == "selective":
            raise LayoutError(
                "layout: recompute 'selective' reruns the attention core, which flash_attention already "
                "recomputes inside its backward (nothing is left to recompute selectively); use recompute "
                "'none' or 'full' with flash_attention"
            )
        if self.checkpoint_impl != "reentrant" and (self.recompute == "selective" or self.tp_comm_overlap):
            what = "recompute 'selective'" if self.recompute == "selective" else "tp_comm_overlap"
            raise LayoutError(
                f"layout: checkpoint_impl = {self.checkpoint_impl!r} is PyTorch's non-reentrant checkpoint, but "
                f"{what} is Megatron-LM's, which checkpoints reentrantly; use checkpoint_impl 'reentrant'"
            )
        if self.recompute == "selective-op" and not self.flash_attention:
            raise LayoutError(
                "layout: recompute 'selective-op' (torchtitan's per-op checkpointing) saves the fused attention "
                "kernel's output (SDPA's flash backend); turn flash_attention on, or use recompute 'selective' "
                "for the unfused core"
            )
        if self.recompute == "selective-op" and self.tp > 1 and not self.sequence_parallel:
            raise LayoutError(
                f"layout: recompute 'selective-op' with tp = {self.tp} is modelled with sequence-parallel norms "
                "only (torchtitan's tensor parallelism, whose reduce-scatter outputs the policy saves); turn "
                "sequence_parallel on"
            )
        for megatron_only in ("tp_comm_overlap", "tp_async_grad_comm"):
            if getattr(self, megatron_only) and self.tp_impl != "megatron":
                raise LayoutError(f"layout: {megatron_only} is Megatron's tensor-parallel overlap, but tp_impl = "
                                  f"{self.tp_impl!r}; use tp_impl 'megatron' or turn {megatron_only} off")
        if self.grad_accumulation_fusion and (self.zero == 3 or self.tp_impl != "megatron"):
            raise LayoutError(
                f"layout: grad_accumulation_fusion is Megatron-LM's weight-gradient accumulation into main_grad, but "
                f"zero = {self.zero} and tp_impl = {self.tp_impl!r}; use zero 0-2 with tp_impl 'megatron', or turn "
                f"grad_accumulation_fusion off (FSDP2 / ZeRO-3 write fresh gradients)"
            )
        if self.reduce_dtype == "fp32" and self.zero == 3 and self.zero_impl != "fsdp2":
            raise LayoutError(
                f"layout: reduce_dtype 'fp32' with zero 3 is FSDP2's MixedPrecisionPolicy setting, but zero_impl = "
                f"{self.zero_impl!r}; use zero_impl 'fsdp2', zero 0-2 (fp32 gradient buffers, Megatron-LM's "
                f"main_grad), or reduce_dtype 'param'"
            )
        if self.sequence_parallel and self.tp == 1:
            raise LayoutError(
                "layout: sequence_parallel shards along the sequence over the tensor-parallel group and "
                "needs tp > 1; set tp > 1 or turn sequence parallelism off"
            )
        if self.tp_comm_overlap and (self.tp == 1 or not self.sequence_parallel):
            raise LayoutError(
                f"layout: tp_comm_overlap overlaps the sequence-parallel all-gathers and reduce-scatters with their "
                f"GEMMs and needs tp > 1 with sequence parallelism (tp = {self.tp}, sequence_parallel = "
                f"{self.sequence_parallel}); set both, or turn tp_comm_overlap off"
            )
        if self.tp_async_grad_comm and self.tp_comm_overlap:
            raise LayoutError(
                "layout: tp_async_grad_comm and tp_comm_overlap both overlap the backward's tensor-parallel "
                "collectives (Transformer Engine's bulk overlap covers what the async path does); turn one off"
            )
        if self.overlap_param_gather and (self.zero != 1 or not self.overlap_grad_reduce):
            # Megatron-LM arguments.py (core_r0.8.0): --overlap-param-gather asserts the distributed optimizer
            # and --overlap-grad-reduce.
            raise LayoutError(
                f"layout: overlap_param_gather is the distributed optimizer's (ZeRO-1) deferred parameter "
                f"all-gather and needs zero = 1 with overlap_grad_reduce (zero = {self.zero}, overlap_grad_reduce "
                f"= {self.overlap_grad_reduce}); set both, or turn overlap_param_gather off"
            )
        if self.zero_impl == "apex" and (self.zero != 1 or self.dp_mode != "allreduce"
                                         or self.bucket_policy != "ddp"
                                         or self.schedule not in (None, "none", "1f1b", "interleaved-1f1b")):
            # NeMo r2.0.0rc1 megatron_gpt_model.py fwd_bwd_step hands apex's sync to Megatron-Core's three schedules.
            raise LayoutError(
                f"layout: zero_impl 'apex' is NeMo's apex DistributedFusedAdam (ZeRO-1 under Megatron-Core's none / "
                f"1f1b / interleaved-1f1b schedules, its own per-layer buckets) but zero = {self.zero}, dp_mode = "
                f"{self.dp_mode!r}, bucket_policy = {self.bucket_policy!r}, schedule = {self.schedule!r}; use zero 1, "
                f"dp_mode 'allreduce', bucket_policy 'ddp' and one of those schedules, or zero_impl 'deepspeed'"
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
        if self.fp8_recipe != "none" and self.precision == "fp32":
            raise LayoutError(
                f"layout: fp8_recipe = {self.fp8_recipe!r} needs 16-bit mixed precision (Transformer Engine's fp8 "
                f"autocast keeps bf16/fp16 master copies) but precision = 'fp32'; use precision 'bf16' or fp8_recipe 'none'"
            )
        if self.fp8_params and self.fp8_recipe != "delayed":
            raise LayoutError(
                f"layout: fp8_params = true needs fp8_recipe 'delayed' (NeMo's fp8 weights are Transformer Engine "
                f"DelayedScaling Float8Tensors) but fp8_recipe = {self.fp8_recipe!r}; use --fp8 delayed or drop --fp8-params"
            )
        if self.fp8_recipe != "delayed" and self.fp8_amax_reduction not in ("stage", "none"):
            raise LayoutError(
                f"layout: fp8_amax_reduction = {self.fp8_amax_reduction!r} is Transformer Engine's delayed recipe's "
                f"amax reduction but fp8_recipe = {self.fp8_recipe!r}; use --fp8 delayed or drop --fp8-amax-reduction"
            )
        if self.fp8_params and self.zero_impl != "apex":
            raise LayoutError(
                f"layout: fp8_params = true is modelled for NeMo's apex DistributedFusedAdam only but zero_impl = "
                f"{self.zero_impl!r}; use --zero 1 --zero-impl apex or drop --fp8-params"
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


#: Schedules that place two chunks per rank in a V (chunk 0 on stage ``r``, chunk 1 on ``2*pp - 1 - r``).
V_SCHEDULES = ("zbv", "dualpipev")
#: Schedules with ``vpp`` interleaved chunks per rank (stage ``s`` on rank ``s % pp``).
INTERLEAVED_SCHEDULES = ("interleaved-1f1b", "interleaved-zb", "looped-bfs")


def interleave_rounds(pp: int, num_microbatches: int) -> tuple[int, int]:
    """``(rounds, micro-batches per round)`` of interleaving: ``max(1, m // pp)`` rounds of equal size
    (torch 2.13 ``ScheduleInterleaved1F1B``; Megatron-LM's rounds of pp when pp divides m)."""
    rounds = max(1, num_microbatches // pp)
    return rounds, num_microbatches // rounds


def schedule_problem(schedule: str, pp: int, num_microbatches: int, vpp: int) -> str | None:
    """What stops ``schedule`` from running ``num_microbatches`` on ``pp`` ranks with ``vpp`` chunks each,
    with the fix, or ``None``. The one place these rules live (Layout and the order generators ask it)."""
    m = num_microbatches
    if schedule in ("interleaved-1f1b", "interleaved-zb"):
        if vpp < 2:
            plain = "'1f1b'" if schedule == "interleaved-1f1b" else "'zb-h1'"
            return (f"schedule {schedule!r} needs vpp >= 2 model chunks per rank, got vpp = {vpp}; set vpp to 2 or "
                    f"more, or use {plain}")
        rounds, _ = interleave_rounds(pp, m)
        if m % rounds:
            # Micro-batches walk the chunks in rounds of equal size; a partial last round would make a
            # chunk wait for micro-batches that never arrive.
            good = [n for n in range(1, 2 * (m + pp)) if n % interleave_rounds(pp, n)[0] == 0]
            lower = max(n for n in good if n < m)
            upper = min(n for n in good if n > m)
            return (f"schedule {schedule!r} runs the micro-batch count m = {m} in max(1, m // pp) = {rounds} rounds "
                    f"of equal size (pp = {pp}), and {rounds} does not divide {m}; use m = {lower} or {upper}")
    elif schedule in V_SCHEDULES:
        if vpp != 2:
            return (f"schedule {schedule!r} places exactly 2 model chunks on each rank (a V shape); got vpp = "
                    f"{vpp}; set vpp = 2")
        if schedule == "dualpipev" and m < 2 * pp:
            return (f"schedule 'dualpipev' needs a micro-batch count of at least 2 * pp = {2 * pp} (one per stage), "
                    f"got m = {m}; raise the global batch or use 'zbv'")
    elif schedule != "looped-bfs" and vpp != 1:
        return (f"vpp = {vpp} (virtual stages) only applies to {', '.join(repr(s) for s in CHUNKED_SCHEDULES)}; "
                f"schedule is {schedule!r}; set vpp = 1 or change the schedule")
    return None


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
    _check_experts(model, layout)
    local_seq = model.seq_length // layout.cp
    if layout.sequence_parallel and local_seq % layout.tp:
        raise LayoutError(
            f"layout: sequence parallel needs tp = {layout.tp} to divide the sequence length "
            f"{model.seq_length}" + (f" / cp {layout.cp} = {local_seq}" if layout.cp > 1 else "")
        )


def _check_experts(model: ModelSpec, layout: Layout) -> None:
    """Expert-parallel rules: degrees fit the experts, and the MoE token layout Megatron-Core requires."""
    moe = model.moe
    if moe is None:
        if layout.ep > 1 or (layout.etp is not None and layout.etp > 1):
            raise LayoutError(
                f"layout: ep = {layout.ep}, etp = {layout.etp} split experts, but {model.name!r} is a dense model "
                "with none; set ep = 1 and leave etp unset, or pick a MoE model"
            )
        return
    if moe.num_experts % layout.ep:
        raise LayoutError(
            f"layout: ep = {layout.ep} does not divide the {moe.num_experts} experts of {model.name!r}; use an ep "
            f"that divides {moe.num_experts}"
        )
    if moe.expert_ffn_hidden_size % layout.expert_tp:
        raise LayoutError(
            f"layout: etp = {layout.expert_tp} does not divide the expert width {moe.expert_ffn_hidden_size} of "
            f"{model.name!r}; use an etp that divides it (etp defaults to tp)"
        )
    shared = moe.shared_expert_ffn_hidden_size
    if shared % layout.tp:
        raise LayoutError(
            f"layout: tp = {layout.tp} does not divide the shared-expert width {shared} of {model.name!r}; the "
            "shared expert is split like the dense MLP"
        )
    if layout.tp > 1 and not layout.sequence_parallel:
        raise LayoutError(
            f"layout: a MoE model with tp = {layout.tp} needs sequence parallelism (Megatron-Core requires it: the "
            "MoE layer routes each rank's sequence shard); turn sequence parallelism on"
        )
    if layout.dp_mode == "parameter-server":
        raise LayoutError(
            "layout: dp_mode 'parameter-server' is not modelled for MoE models (expert gradients sync over the "
            "expert data-parallel group); use dp_mode 'allreduce'"
        )
    if layout.recompute == "selective-op":
        raise LayoutError(
            f"layout: recompute 'selective-op' is not modelled for MoE models such as {model.name!r} (its saved-op "
            "list is written for dense layers); use recompute 'none', 'selective' or 'full'"
        )
    if layout.zero >= 2:
        raise LayoutError(
            f"layout: zero = {layout.zero} is not modelled for MoE models; use zero 0 or 1 (ZeRO-1 shards the "
            "expert optimizer states over the expert data-parallel group, as Megatron's distributed optimizer does)"
        )


def _positive_int(field: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise LayoutError(f"layout: {field} = {value!r} must be a positive integer")


def _choice(field: str, value: object, allowed: tuple[str, ...], *, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if value not in allowed:
        raise LayoutError(f"layout: {field} = {value!r} is not one of {', '.join(allowed)}")
