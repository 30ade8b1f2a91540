"""The decoder-only transformer description every cost formula starts from."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from simgrid.errors import ModelError
from simgrid.model.moe_spec import MoESpec

NormKind = Literal["layernorm", "rmsnorm"]
PositionKind = Literal["learned", "rope"]


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """Shapes of a decoder-only transformer (GPT / Llama family)."""

    name: str
    """Preset name or a user label, e.g. ``"gpt3-175b"``."""
    num_layers: int
    """Number of transformer layers ``L``."""
    hidden_size: int
    """Model width ``h``."""
    num_heads: int
    """Attention (query) heads ``a``."""
    num_kv_heads: int | None = None
    """Key/value heads for grouped-query attention; ``None`` means multi-head (= ``num_heads``)."""
    ffn_hidden_size: int | None = None
    """MLP inner width ``f``; ``None`` means ``4 * hidden_size``."""
    gated_mlp: bool = False
    """SwiGLU-style MLP with three weight matrices (Llama) instead of two (GPT)."""
    vocab_size: int = 51200
    """Vocabulary size ``V`` (padded, as trained)."""
    seq_length: int = 2048
    """Training sequence length ``s`` in tokens."""
    tied_embeddings: bool = True
    """Output head shares the input embedding matrix."""
    norm: NormKind = "layernorm"
    """Normalisation kind: LayerNorm has weight and bias, RMSNorm only a weight."""
    position: PositionKind = "learned"
    """Learned absolute position embeddings (``s * h`` parameters) or rotary (none)."""
    bias: bool = True
    """Linear layers carry biases (GPT) or not (Llama)."""
    kv_channels: int | None = None
    """Width of one attention head when it is not ``hidden_size / num_heads`` (Megatron's ``--kv-channels``,
    Hugging Face's ``head_dim``; Qwen3 has 128 with h = 2048 and 32 heads); ``None`` means ``h / a``."""
    moe: MoESpec | None = None
    """Mixture-of-Experts layers (:class:`~simgrid.model.moe_spec.MoESpec`); ``None`` for a dense model."""

    def __post_init__(self) -> None:
        for field in ("num_layers", "hidden_size", "num_heads", "vocab_size", "seq_length"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ModelError(f"model {self.name!r}: {field} = {value!r} must be a positive integer")
        for field in ("num_kv_heads", "ffn_hidden_size", "kv_channels"):
            value = getattr(self, field)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
                raise ModelError(
                    f"model {self.name!r}: {field} = {value!r} must be a positive integer or omitted"
                )
        if self.kv_channels is None and self.hidden_size % self.num_heads:
            raise ModelError(
                f"model {self.name!r}: hidden_size = {self.hidden_size} is not divisible by "
                f"num_heads = {self.num_heads}; pick a head count that divides the width"
            )
        if self.kv_heads > self.num_heads or self.num_heads % self.kv_heads:
            raise ModelError(
                f"model {self.name!r}: num_kv_heads = {self.kv_heads} must divide num_heads = {self.num_heads}"
            )
        if self.norm not in ("layernorm", "rmsnorm"):
            raise ModelError(f"model {self.name!r}: norm = {self.norm!r}; use 'layernorm' or 'rmsnorm'")
        if self.position not in ("learned", "rope"):
            raise ModelError(f"model {self.name!r}: position = {self.position!r}; use 'learned' or 'rope'")
        if self.moe is not None:
            if not isinstance(self.moe, MoESpec):
                raise ModelError(f"model {self.name!r}: moe = {self.moe!r} must be a MoESpec or None")
            if self.moe.first_dense_layers >= self.num_layers:
                raise ModelError(
                    f"model {self.name!r}: moe.first_dense_layers = {self.moe.first_dense_layers} leaves no MoE "
                    f"layer among the {self.num_layers} layers; lower it or drop the moe part"
                )

    @property
    def kv_heads(self) -> int:
        """Key/value head count with the multi-head default applied."""
        return self.num_kv_heads if self.num_kv_heads is not None else self.num_heads

    @property
    def ffn_size(self) -> int:
        """MLP inner width with the ``4h`` default applied."""
        return self.ffn_hidden_size if self.ffn_hidden_size is not None else 4 * self.hidden_size

    @property
    def head_dim(self) -> int:
        """Width of one attention head: ``kv_channels`` when given, else ``h / a``."""
        return self.kv_channels if self.kv_channels is not None else self.hidden_size // self.num_heads

    @property
    def is_moe(self) -> bool:
        """The model has Mixture-of-Experts layers."""
        return self.moe is not None

    def with_seq_length(self, seq_length: int) -> ModelSpec:
        """The same model trained at another sequence length."""
        return dataclasses.replace(self, seq_length=seq_length)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready mapping of every field (round-trips through :meth:`from_dict`)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelSpec:
        """Build from :meth:`to_dict` output; unknown keys are an error naming the key."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ModelError(f"model description has unknown field(s) {unknown}; known: {sorted(known)}")
        missing = [f for f in ("name", "num_layers", "hidden_size", "num_heads") if f not in data]
        if missing:
            raise ModelError(f"model description is missing field(s) {missing}")
        if data.get("moe") is not None and not isinstance(data["moe"], MoESpec):
            data = {**data, "moe": MoESpec.from_dict(data["moe"])}
        return cls(**data)
