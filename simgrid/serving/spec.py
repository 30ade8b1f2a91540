"""What a serving deployment is: the parallel layout of its replicas and the engine's batching settings.

Defaults follow vLLM's engine (``vllm/engine/arg_utils.py`` ``EngineArgs`` and ``vllm/config.py``
``SchedulerConfig``, v0.4-0.6), the most widely deployed open serving engine and the one Vidur (Agrawal et
al., MLSys 2024) models: at most 256 sequences per iteration (``max_num_seqs``), KV cache in blocks of
16 tokens (``block_size``; Kwon et al., "Efficient Memory Management for Large Language Model Serving with
PagedAttention", SOSP 2023), 90% of device memory for weights, activations and KV cache
(``gpu_memory_utilization``), and a per-iteration token budget of ``max(context, 2048)`` without chunked
prefill and 2048 with it (``SchedulerConfig.__post_init__``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal, get_args

from simgrid.errors import SimgridError
from simgrid.layout.spec import Layout

Batching = Literal["continuous", "static"]
Policy = Literal["prefill-first", "mixed", "chunked"]
Router = Literal["round-robin", "least-loaded"]
WeightDtype = Literal["fp32", "bf16", "fp16", "fp8"]
KVDtype = Literal["auto", "fp32", "bf16", "fp16", "fp8"]

BATCHINGS: tuple[str, ...] = get_args(Batching)
POLICIES: tuple[str, ...] = get_args(Policy)
ROUTERS: tuple[str, ...] = get_args(Router)
WEIGHT_DTYPES: tuple[str, ...] = get_args(WeightDtype)
KV_DTYPES: tuple[str, ...] = get_args(KVDtype)

#: Bytes per element of each storage dtype (fp8: E4M3 or E5M2, one byte; vLLM ``--kv-cache-dtype fp8``).
DTYPE_BYTES: dict[str, int] = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}

DEFAULT_MAX_BATCH = 256
"""vLLM ``max_num_seqs`` default: sequences in one iteration."""
DEFAULT_BLOCK_TOKENS = 16
"""vLLM ``block_size`` default: tokens per KV-cache block (PagedAttention, Kwon et al. 2023)."""
DEFAULT_MEMORY_UTILIZATION = 0.9
"""vLLM ``gpu_memory_utilization`` default: share of device memory the engine may use."""
UNCHUNKED_MIN_BATCHED_TOKENS = 2048
"""vLLM ``SchedulerConfig``: without chunked prefill the token budget is ``max(max_model_len, 2048)``."""
CHUNKED_BATCHED_TOKENS = 2048
"""vLLM ``SchedulerConfig`` (0.6): with chunked prefill the budget defaults to 2048, "a balance between
ITL and TTFT". Sarathi-Serve (Agrawal et al., OSDI 2024) evaluates budgets of 512 (strict TBT) and 2048."""


class ServingError(SimgridError):
    """A serving workload, layout or engine setting is invalid (one line naming the field and the fix)."""


def _positive_int(owner: str, field: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ServingError(f"{owner}: {field} = {value!r} must be a positive integer")


def _choice(owner: str, field: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ServingError(f"{owner}: {field} = {value!r} is not one of {', '.join(allowed)}")


@dataclass(frozen=True, kw_only=True)
class ServingLayout:
    """How one model is spread over GPUs to serve: identical replicas of a tp x pp model instance."""

    tp: int = 1
    """Tensor-parallel degree inside one replica (Megatron 1-D: heads and MLP columns split)."""
    pp: int = 1
    """Pipeline stages of one replica (layers split; vLLM keeps ``pp`` batches in flight)."""
    replicas: int = 1
    """Data-parallel replicas; a router spreads requests over them."""

    def __post_init__(self) -> None:
        for field in ("tp", "pp", "replicas"):
            _positive_int("serving layout", field, getattr(self, field))

    @property
    def gpus_per_replica(self) -> int:
        """GPUs of one model instance: ``tp * pp``."""
        return self.tp * self.pp

    @property
    def world_size(self) -> int:
        """GPUs of the whole deployment: ``tp * pp * replicas``."""
        return self.tp * self.pp * self.replicas

    def label(self) -> str:
        """``tp4 pp1 x2``: short name for tables and plots."""
        return f"tp{self.tp} pp{self.pp} x{self.replicas}"

    def to_dict(self) -> dict[str, int]:
        """JSON-ready mapping of the degrees."""
        return dataclasses.asdict(self)


@dataclass(frozen=True, kw_only=True)
class ServingConfig:
    """The serving engine's settings: batching, scheduling policy, budgets and dtypes."""

    batching: Batching = "continuous"
    """``continuous``: iteration-level batching (Orca, Yu et al. OSDI 2022; vLLM): requests join and leave
    the batch between iterations. ``static``: request-level batching (FasterTransformer): a batch is formed,
    prefilled and decoded until its longest request ends; nobody joins or leaves early."""
    policy: Policy = "prefill-first"
    """Which work an iteration of continuous batching holds (see :mod:`simgrid.serving.policies`):
    ``prefill-first`` (vLLM V0: waiting prompts run in prefill-only iterations, decodes pause),
    ``mixed`` (Orca: running decodes plus whole new prompts in one iteration), ``chunked`` (Sarathi-Serve:
    decodes first, then prompt chunks up to the token budget; decode-first, stall-free)."""
    max_batch_size: int = DEFAULT_MAX_BATCH
    """Most sequences in one iteration (vLLM ``max_num_seqs``); for static batching the batch size."""
    max_batched_tokens: int | None = None
    """Most tokens (prompt + decode) in one iteration; ``None``: vLLM's default for the policy."""
    block_tokens: int = DEFAULT_BLOCK_TOKENS
    """Tokens per KV-cache block (PagedAttention allocates whole blocks)."""
    memory_utilization: float = DEFAULT_MEMORY_UTILIZATION
    """Share of each GPU's memory the engine may fill with weights, activations and KV cache."""
    kv_budget_GiB: float | None = None
    """KV-cache bytes per GPU, overriding the budget derived from memory; ``None``: derived."""
    dtype: WeightDtype = "bf16"
    """Weights and GEMM precision (``fp8``: 8-bit weights and fp8 tensor-core rate; activations stay 16-bit)."""
    kv_dtype: KVDtype = "auto"
    """KV-cache element type; ``auto`` follows the activations (vLLM ``--kv-cache-dtype``), ``fp8`` halves it."""
    router: Router = "round-robin"
    """How arriving requests are spread over replicas: in turn, or to the one with the least work queued."""

    def __post_init__(self) -> None:
        owner = "serving config"
        _choice(owner, "batching", self.batching, BATCHINGS)
        _choice(owner, "policy", self.policy, POLICIES)
        _choice(owner, "router", self.router, ROUTERS)
        _choice(owner, "dtype", self.dtype, WEIGHT_DTYPES)
        _choice(owner, "kv_dtype", self.kv_dtype, KV_DTYPES)
        _positive_int(owner, "max_batch_size", self.max_batch_size)
        _positive_int(owner, "block_tokens", self.block_tokens)
        if self.max_batched_tokens is not None:
            _positive_int(owner, "max_batched_tokens", self.max_batched_tokens)
        if not isinstance(self.memory_utilization, (int, float)) or not 0 < self.memory_utilization <= 1:
            raise ServingError(f"{owner}: memory_utilization = {self.memory_utilization!r} must be in (0, 1]")
        if self.kv_budget_GiB is not None and not self.kv_budget_GiB > 0:
            raise ServingError(f"{owner}: kv_budget_GiB = {self.kv_budget_GiB!r} must be > 0 GiB")

    @property
    def weight_bytes(self) -> int:
        """Bytes per weight."""
        return DTYPE_BYTES[self.dtype]

    @property
    def activation_dtype(self) -> str:
        """Dtype of activations, TP messages and (with ``kv_dtype='auto'``) the KV cache."""
        return "fp32" if self.dtype == "fp32" else ("fp16" if self.dtype == "fp16" else "bf16")

    @property
    def kv_bytes(self) -> int:
        """Bytes per KV-cache element."""
        return DTYPE_BYTES[self.activation_dtype if self.kv_dtype == "auto" else self.kv_dtype]

    def token_budget(self, max_context: int) -> int:
        """Tokens one iteration may hold: the setting, or vLLM's default for the policy."""
        if self.max_batched_tokens is not None:
            return self.max_batched_tokens
        if self.batching == "continuous" and self.policy == "chunked":
            return CHUNKED_BATCHED_TOKENS
        return max(max_context, UNCHUNKED_MIN_BATCHED_TOKENS)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready mapping of every field."""
        return dataclasses.asdict(self)


def model_layout(layout: ServingLayout, config: ServingConfig) -> Layout:
    """The :class:`~simgrid.layout.Layout` of one replica that :mod:`simgrid.model`'s cost functions take.

    Serving engines run a fused attention kernel (FlashAttention or PagedAttention), so the s x s scores
    never reach HBM; 16-bit activations unless the weights are fp32. Inference applies no dropout
    (``model.eval()``), so no mask is drawn whatever the model's training recipe.
    """
    precision = "fp32" if config.activation_dtype == "fp32" else config.activation_dtype
    return Layout(tp=layout.tp, pp=layout.pp, flash_attention=True, precision=precision, dropout="off")  # type: ignore[arg-type]
