"""The decoder-only transformer description every cost formula starts from."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any, Literal

from simgrid.errors import ModelError
from simgrid.model.moe_spec import MoESpec

NormKind = Literal["layernorm", "rmsnorm"]
PositionKind = Literal["learned", "rope"]

#: Largest value of each size field. Far above any model trained (Llama 3 405B: 126 layers, width 16384,
#: FFN 53248, vocabulary 128256), they keep every derived count finite and every program buildable; a
#: larger value is a typo or a unit mistake and is refused with the limit named.
MAX_SIZES: dict[str, int] = {
    "num_layers": 10_000,
    "hidden_size": 2**20,
    "num_heads": 2**16,
    "num_kv_heads": 2**16,
    "ffn_hidden_size": 2**22,
    "kv_channels": 2**16,
    "vocab_size": 2**24,
    "seq_length": 2**24,
}
_BOOL_FIELDS = ("gated_mlp", "tied_embeddings", "bias")


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
        if not isinstance(self.name, str):
            raise ModelError(f"model name = {_shown(self.name)} must be a string")
        for field in ("num_layers", "hidden_size", "num_heads", "vocab_size", "seq_length"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ModelError(f"model {self.name!r}: {field} = {_shown(value)} must be a positive integer")
        for field in ("num_kv_heads", "ffn_hidden_size", "kv_channels"):
            value = getattr(self, field)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
                raise ModelError(
                    f"model {self.name!r}: {field} = {_shown(value)} must be a positive integer or omitted"
                )
        for field, limit in MAX_SIZES.items():
            value = getattr(self, field)
            if value is not None and value > limit:
                raise ModelError(f"model {self.name!r}: {field} = {_shown(value)} is above the limit of {limit:,}; "
                                 "check the value (no trained model comes near it)")
        for field in _BOOL_FIELDS:
            value = getattr(self, field)
            if not isinstance(value, bool):
                raise ModelError(f"model {self.name!r}: {field} = {_shown(value)} must be true or false")
        if self.kv_channels is None and self.hidden_size % self.num_heads:
            raise ModelError(
                f"model {self.name!r}: hidden_size = {self.hidden_size} is not divisible by "
                f"num_heads = {self.num_heads}; pick a head count that divides the width"
            )
        if self.kv_heads > self.num_heads or self.num_heads % self.kv_heads:
            raise ModelError(
                f"model {self.name!r}: num_kv_heads = {self.kv_heads} must divide num_heads = {self.num_heads}"
            )
        if not isinstance(self.norm, str) or self.norm not in ("layernorm", "rmsnorm"):
            raise ModelError(f"model {self.name!r}: norm = {self.norm!r}; use 'layernorm' or 'rmsnorm'")
        if not isinstance(self.position, str) or self.position not in ("learned", "rope"):
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
        if not isinstance(data, dict):
            raise ModelError(f"a model description must be an object of ModelSpec fields, not {type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(str(key) for key in set(data) - known)
        if unknown:
            raise ModelError(f"model description has unknown field(s) {unknown}; known: {sorted(known)}")
        missing = [f for f in ("name", "num_layers", "hidden_size", "num_heads") if f not in data]
        if missing:
            raise ModelError(f"model description is missing field(s) {missing}")
        if data.get("moe") is not None and not isinstance(data["moe"], MoESpec):
            data = {**data, "moe": MoESpec.from_dict(data["moe"])}
        return cls(**data)


def load_model_file(path: str | os.PathLike[str]) -> ModelSpec:
    """A model from a JSON file of :class:`ModelSpec` fields; every problem is one line naming the file."""
    from simgrid.io.inputs import parse_json, read_input_text, short_path

    source = f"model file {short_path(path)}"
    data = parse_json(read_input_text(path, what="model file", error=ModelError), source=source, error=ModelError)
    if not isinstance(data, dict):
        raise ModelError(f"{source}: expected a JSON object with ModelSpec fields, got {type(data).__name__}")
    try:
        return ModelSpec.from_dict(data)
    except ModelError as exc:
        raise ModelError(f"{source}: {exc}") from None


def _shown(value: object) -> str:
    """A value for a message; an integer of thousands of digits is summarised, not printed."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 200:
        return f"<an integer of about {int(value.bit_length() * 0.30103) + 1} digits>"
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:40]}...{text[-12:]}"
