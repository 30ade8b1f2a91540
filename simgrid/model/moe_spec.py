"""The Mixture-of-Experts part of a model description: experts, routing and which layers have them.

A MoE layer replaces the dense MLP of a transformer layer by a router and ``num_experts`` MLPs (the
*experts*); each token is sent to the ``top_k`` experts its router scores highest and their outputs are
summed, weighted by the router's probabilities (Shazeer et al. 2017; GShard, Lepikhin et al. 2020;
Switch Transformer, Fedus et al. 2022). Shared experts (Qwen2-MoE, DeepSeekMoE) are dense MLPs every
token goes through besides its routed experts. Shapes of the presets are in :mod:`simgrid.model.presets`.

The router is the softmax top-k router of Mixtral and Qwen: softmax over the experts' logits, the k largest
probabilities chosen, optionally renormalised to sum to one (``normalize_top_k``; Mixtral's top-k-then-
softmax is the same thing, Qwen2-MoE does not renormalise, Qwen3-MoE does). Sigmoid routers with a bias
correction (DeepSeek-V3) are not modelled.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from simgrid.errors import ModelError


@dataclass(frozen=True, kw_only=True)
class MoESpec:
    """Experts, routing and placement of the MoE layers of a decoder-only transformer."""

    num_experts: int
    """Routed experts per MoE layer ``E``."""
    top_k: int
    """Experts each token is routed to ``k`` (``num_experts_per_tok`` in Hugging Face configs)."""
    expert_ffn_hidden_size: int
    """Inner width of one routed expert's MLP (``moe_intermediate_size``); gated like the model's MLP."""
    shared_expert_ffn_hidden_size: int = 0
    """Inner width of the shared expert(s) together (Megatron's ``moe_shared_expert_intermediate_size`` =
    shared experts x width of each); 0 for none."""
    shared_expert_gate: bool = False
    """The shared expert's output is scaled by a learned sigmoid gate (an ``h x 1`` weight; Qwen2-MoE)."""
    first_dense_layers: int = 0
    """The first layers keep a dense MLP of the model's ``ffn_hidden_size`` (DeepSeekMoE's first-k-dense);
    every later layer is a MoE layer."""
    normalize_top_k: bool = True
    """Renormalise the chosen k router probabilities to sum to one (Mixtral, Qwen3-MoE: yes; Qwen2-MoE: no)."""
    capacity_factor: float | None = None
    """``None``: dropless (every routed token is computed). A number: each expert takes at most
    ``capacity_factor x tokens x k / E`` tokens per source rank and drops the rest (GShard; Megatron-Core's
    ``--moe-expert-capacity-factor``)."""
    load_imbalance: float = 1.0
    """Tokens the busiest expert-parallel rank receives over the mean (1.0: perfectly balanced routing). The
    all-to-alls and the experts of every rank are costed at the busiest rank's token count, because the
    combine all-to-all waits for it."""

    def __post_init__(self) -> None:
        for field in ("num_experts", "top_k", "expert_ffn_hidden_size"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ModelError(f"moe: {field} = {value!r} must be a positive integer")
        for field in ("shared_expert_ffn_hidden_size", "first_dense_layers"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ModelError(f"moe: {field} = {value!r} must be an integer >= 0")
        limits = {"num_experts": 2**16, "top_k": 2**16, "expert_ffn_hidden_size": 2**22,
                  "shared_expert_ffn_hidden_size": 2**22, "first_dense_layers": 10_000}  # as ModelSpec's MAX_SIZES
        for field, limit in limits.items():
            if getattr(self, field) > limit:
                raise ModelError(f"moe: {field} is above the limit of {limit:,}; check the value")
        for field in ("shared_expert_gate", "normalize_top_k"):
            if not isinstance(getattr(self, field), bool):
                raise ModelError(f"moe: {field} = {getattr(self, field)!r} must be true or false")
        for field in ("capacity_factor", "load_imbalance"):
            value = getattr(self, field)
            if isinstance(value, bool) or (value is not None and isinstance(value, float) and not math.isfinite(value)):
                raise ModelError(f"moe: {field} = {value!r} must be a finite number")
        if self.top_k > self.num_experts:
            raise ModelError(
                f"moe: top_k = {self.top_k} exceeds num_experts = {self.num_experts}; a token can be routed to at "
                "most every expert once"
            )
        if self.capacity_factor is not None and not (
            isinstance(self.capacity_factor, (int, float)) and self.capacity_factor > 0
        ):
            raise ModelError(
                f"moe: capacity_factor = {self.capacity_factor!r} must be > 0, or None for dropless routing"
            )
        if not (isinstance(self.load_imbalance, (int, float)) and self.load_imbalance >= 1.0):
            raise ModelError(
                f"moe: load_imbalance = {self.load_imbalance!r} must be >= 1.0 (the busiest rank's tokens over "
                "the mean; 1.0 is balanced)"
            )

    @property
    def routed_factor(self) -> float:
        """Routed tokens the busiest rank computes over the balanced count: the imbalance, capped by the
        capacity factor when tokens beyond an expert's capacity are dropped."""
        if self.capacity_factor is None:
            return float(self.load_imbalance)
        return float(min(self.load_imbalance, self.capacity_factor))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready mapping of every field."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MoESpec:
        """Build from :meth:`to_dict` output; unknown keys are an error naming the key."""
        if not isinstance(data, dict):
            raise ModelError(f"moe: expected a mapping of MoESpec fields, got {type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ModelError(f"moe description has unknown field(s) {unknown}; known: {sorted(known)}")
        missing = [f for f in ("num_experts", "top_k", "expert_ffn_hidden_size") if f not in data]
        if missing:
            raise ModelError(f"moe description is missing field(s) {missing}")
        return cls(**data)
