"""The dev-set row types of issue 12 (``Source``, ``DevRow``), its targets, and the FLOP conventions the
sources count with. The rows themselves live in :mod:`modern_data` (and :mod:`nemo_2407_data`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from simgrid.layout.spec import Precision, RecomputePolicy
from simgrid.model.spec import ModelSpec

MetricKind = Literal["tokens_per_s_per_gpu", "model_tflops_per_gpu"]
"""How a source states its throughput: tokens per second per GPU, or model TFLOP/s per GPU under the
source's own FLOP count (converted to tokens/s with that count, never with the simulator's)."""

DEV_ROW_TOLERANCE = 0.10
"""Issue 12: every dev row within 10 %."""
DEV_MAE_TARGET = 0.05
"""Issue 12: mean absolute error over the whole dev set at most 5 %."""
DEV_SIGNED_TARGET = 0.02
"""Issue 12: mean signed error within +-2 % (no systematic optimism)."""
HALF_PEAK = 0.5
"""The naive estimate the issue compares with: every executed FLOP at half of the GPU's dense peak."""


@dataclass(frozen=True, kw_only=True)
class Source:
    """Where a published figure comes from."""

    document: str
    """Document (repository file or page)."""
    section: str
    """Table, figure or section inside it."""
    url: str
    """Address (pinned to a commit where the document lives in a repository)."""
    version: str
    """Software versions and the date the figure was published."""

    @property
    def label(self) -> str:
        """Short citation for a table cell."""
        return f"{self.document}, {self.section}"


@dataclass(frozen=True, kw_only=True)
class DevRow:
    """One published training run: its layout, its recipe and its throughput."""

    id: str
    """Row id (``--rows`` accepts it)."""
    source: Source
    """Where the figure is published."""
    gpu: str
    """GPU as the source names it (``H100``, ``A100``)."""
    cluster: str
    """Cluster profile the row is simulated on."""
    model: str
    """Model preset (shape as the source's model)."""
    seq_length: int
    """Tokens per sequence in the run (replaces the preset's when different)."""
    dp: int
    """Data-parallel (or FSDP shard) degree."""
    tp: int = 1
    """Tensor-parallel degree."""
    pp: int = 1
    """Pipeline-parallel degree."""
    cp: int = 1
    """Context-parallel degree."""
    vpp: int = 1
    """Model chunks per pipeline rank (interleaved 1F1B when > 1)."""
    zero: int = 0
    """ZeRO stage (3 for FSDP full sharding, 1 for Megatron's distributed optimizer)."""
    zero_impl: str | None = None
    """Framework of the ZeRO implementation (``fsdp2``, ``megatron``, ``apex``); passed to the layout when the layout
    has a ``zero_impl`` setting (issue 12 item 3: ZeRO-3 rows, and ``apex`` for NeMo's DistributedFusedAdam ZeRO-1
    rows), recorded otherwise."""
    reduce_dtype: str = "param"
    """Gradient reduce dtype (``Layout.reduce_dtype``): ``fp32`` where the source's FSDP2 sets
    ``MixedPrecisionPolicy(reduce_dtype=torch.float32)`` (torchtitan) or, with ZeRO 0-2, where Megatron-LM keeps
    fp32 ``main_grad`` buffers (bf16 runs), ``param`` (PyTorch's default) else."""
    micro_batch: int
    """Sequences per micro-batch per data-parallel rank."""
    global_batch: int
    """Sequences per optimizer step."""
    recompute: RecomputePolicy = "none"
    """Activation recomputation the simulator runs."""
    sequence_parallel: bool = False
    """Megatron sequence parallelism (or torchtitan's sequence-parallel norms) with tp > 1."""
    tp_comm_overlap: bool = False
    """Megatron-Core ``--tp-comm-overlap`` (Transformer Engine's chunked TP overlap; Layout.tp_comm_overlap)."""
    tp_impl: str = "megatron"
    """Tensor-parallel implementation (Layout.tp_impl): ``dtensor`` for torchtitan's DTensor TP on ``[b, s, h]``
    activations (a chunk + cat copy per sequence-parallel collective), ``megatron`` else."""
    checkpoint_impl: str = "reentrant"
    """How full activation checkpointing reruns a layer (Layout.checkpoint_impl): ``non-reentrant`` for
    torch.utils.checkpoint around each whole block (torchtitan), ``non-reentrant-modules`` for the attention and
    MLP modules wrapped apart (NeMo AutoModel with torch.compile), ``reentrant`` (Megatron-LM) else."""
    overlap_param_gather: bool = False
    """Megatron-Core ``--overlap-param-gather`` (ZeRO-1 parameter gathers in the next step's forward;
    Layout.overlap_param_gather). Rows with ``zero_impl = "megatron"`` also take Megatron-Core's gradient
    buckets (``Layout.bucket_policy = "megatron"``)."""
    flash_attention: bool = True
    """Fused attention (FlashAttention / cuDNN / SDPA flash backend)."""
    attention_kernel: str = "auto"
    """Fused-attention kernel family the framework runs (``fa2``: PyTorch SDPA's flash backend, which
    SDPA picks first on H100 — pytorch/pytorch issue 142132, Dec 2024 nightly: SDPA at 329 TFLOP/s where
    cuDNN and FA3 reach 631; ``auto``: the GPU profile's default, cuDNN/FA3-class on H100 as Transformer
    Engine runs it)."""
    kernel_fusion: str = "fused"
    """Element-wise kernels between the GEMMs (Layout.kernel_fusion): ``fused`` for Transformer Engine and
    torch.compile, ``eager`` for PyTorch eager, ``eager-fused-norm`` for eager with torchtitan's fused RMSNorm."""
    precision: Precision = "bf16"
    """Compute precision of everything outside the fp8 GEMMs (and of the parameters)."""
    fp8_recipe: str = "none"
    """Transformer Engine fp8 autocast over the transformer layers' linear layers (``Layout.fp8_recipe``):
    ``delayed`` (``DelayedScaling``, NeMo's "FP8" until 25.04), ``current`` (``Float8CurrentScaling``, NeMo's
    "FP8-CS"), ``none`` (every GEMM in ``precision``). Passed to the layout when the layout has the setting
    (session 12, helper fp8core); a row with an fp8 recipe is not simulated without it."""
    fp8_params: bool = False
    """``Layout.fp8_params``: Transformer Engine fp8 weights, where the source's config sets NeMo ``model.fp8_params``
    (apex DistributedFusedAdam gathers them as uint8; docs/design.md "fp8 parameters (session 15)")."""
    bucket_size_MB: float | None = None
    """Gradient bucket size in MB (``Layout.bucket_size_MB``; ``None``: the layout's default), where the source's
    optimizer buckets by size (NeMo's apex DistributedFusedAdam ``bucket_cap_mb``)."""
    tp_async_grad_comm: bool = False
    """``Layout.tp_async_grad_comm``: the backward's tensor-parallel collectives issued asynchronously beside the
    weight-gradient GEMM (Transformer Engine's ``async_op=True`` path when userbuffers overlap is off)."""
    p2p_order: str = "witness"
    """``Layout.p2p_order``: ``megatron-core`` where the run used Megatron-Core's interleaved schedule with
    ``overlap_p2p_comm`` on (pipeline transfers posted and waited where that code does), ``witness`` else (and for
    the 2021/2022 Megatron-LM rows, whose p2p was batched and synchronised)."""
    dropout: str = "auto"
    """``Layout.dropout``: ``off`` where the run's config sets hidden and attention dropout to 0 on a model whose
    usual recipe has it (MLPerf GPT-3: conf/custom.yaml ``hidden_dropout: 0.0``, ``attention_dropout: 0.0``),
    ``auto`` (the model's recipe: GPT 0.1, Llama none) where the config agrees with it."""
    grad_accumulation_fusion: bool | None = None
    """``Layout.grad_accumulation_fusion`` (``None``: on for Megatron-Core rows, ``zero_impl = "megatron"``, off
    else)."""
    metric: MetricKind
    """What the source reports."""
    published: float
    """The figure as a number, in the unit of ``metric``."""
    published_text: str
    """The figure exactly as printed, with its unit."""
    conversion: str
    """How the figure becomes tokens per second per GPU."""
    recipe: str
    """The recipe as the source states it (precision, recompute, compile, overlap, batch)."""
    assumed: tuple[str, ...] = ()
    """Settings the source leaves unstated and the values this row assumes."""
    deviations: tuple[str, ...] = ()
    """Where the simulated layout or hardware differs from the source's (the simulator cannot express it)."""
    not_expressible: str = ""
    """Why the row cannot be simulated at all (empty: it is simulated)."""
    cross_entropy: str = "fused"
    """The loss implementation (``Layout.cross_entropy``): ``unfused`` where the source's code calls
    ``F.cross_entropy`` on an fp32 copy of the logits (torchtitan), ``fused`` (Megatron-Core's kernel) else."""
    optimizer_impl: str = "fused"
    """The optimizer step's implementation (``Layout.optimizer_impl``): ``foreach`` where the source's code calls
    ``torch.optim.AdamW(foreach=True)`` (torchtitan before Feb 2025), ``fused`` (FusedAdam, fused=True) else."""
    published_memory_GiB: float | None = None
    """Peak memory per GPU as the source prints it, GiB (``None``: the source publishes none); what it measures
    is in ``memory_definition``."""
    memory_definition: str = ""
    """What the published memory figure is and where the source's code measures it."""

    @property
    def gpus(self) -> int:
        """GPUs in the run."""
        return self.dp * self.tp * self.pp * self.cp

    @property
    def tokens_per_step(self) -> int:
        """Tokens per optimizer step over the whole run."""
        return self.global_batch * self.seq_length


# -- FLOP conventions of the sources (written out from each source's code, not from simgrid) ----------------
def megatron_core_flops_per_step(spec: ModelSpec, global_batch: int) -> float:
    """Model FLOPs of one step as Megatron-Core r0.8.0 counts them (``num_floating_point_operations`` in
    megatron/training/training.py, tag core_r0.8.0):
    ``12 B s L h^2 [ (1 + g/a + s/h) q + (f/h) e m + V / (2 L h) ]`` with g/a the key-value groups per
    head, q = (heads * head dim) / h, e = experts routed to (1 for dense), m = 3/2 for SwiGLU; forward and
    backward (factor 3), causal attention counted in full, recompute not counted.
    """
    b, s, layers, h = global_batch, spec.seq_length, spec.num_layers, spec.hidden_size
    groups_per_head = spec.kv_heads / spec.num_heads
    query_ratio = spec.num_heads * (h // spec.num_heads) / h
    gated = 1.5 if spec.gated_mlp else 1.0
    return 12.0 * b * s * layers * h * h * (
        (1 + groups_per_head + s / h) * query_ratio + (spec.ffn_size / h) * gated + spec.vocab_size / (2 * layers * h)
    )
