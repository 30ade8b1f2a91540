"""The model's full weights: every parameter's name, shape, initialisation and tensor-parallel shard dimension.

Names follow the blocks of :mod:`executor.model` (``embed.wte``, ``L{i}.attn.q.weight``, ``head.norm.weight``,
...). Everything is fp32; initialisation is deterministic from a seed and identical on every process (GPT-2
recipe: normal with std 0.02, residual output projections scaled by ``1/sqrt(2L)``, Radford et al. 2019,
section 2.3), so every rank cuts its shards from the same full tensors as the single-process reference.
"""

from __future__ import annotations

import math

import torch

from simgrid.model.spec import ModelSpec

INIT_STD = 0.02
"""Standard deviation of weight initialisation (GPT-2, Radford et al. 2019)."""


def head_index(spec: ModelSpec) -> int:
    """Block index of the output head."""
    return 2 * spec.num_layers + 1


def weight_layout(spec: ModelSpec) -> dict[str, tuple[tuple[int, ...], str, int | None]]:
    """Every full parameter: name -> (shape, init rule, tensor-parallel shard dim or None), in init order."""
    h, d, f = spec.hidden_size, spec.head_dim, spec.ffn_size
    q_out, kv_out = spec.num_heads * d, spec.kv_heads * d
    out: dict[str, tuple[tuple[int, ...], str, int | None]] = {"embed.wte": ((spec.vocab_size, h), "normal", 0)}
    if spec.position == "learned":
        out["embed.wpe"] = ((spec.seq_length, h), "normal", None)

    def norm(prefix: str) -> None:
        out[f"{prefix}.norm.weight"] = ((h,), "ones", None)
        if spec.norm == "layernorm":
            out[f"{prefix}.norm.bias"] = ((h,), "zeros", None)

    def linear(name: str, shape: tuple[int, int], dim: int, rule: str = "normal") -> None:
        out[f"{name}.weight"] = (shape, rule, dim)
        if spec.bias:
            out[f"{name}.bias"] = ((shape[0],), "zeros", 0 if dim == 0 else None)

    for i in range(spec.num_layers):
        norm(f"L{i}.attn")
        linear(f"L{i}.attn.q", (q_out, h), 0)
        linear(f"L{i}.attn.k", (kv_out, h), 0)
        linear(f"L{i}.attn.v", (kv_out, h), 0)
        linear(f"L{i}.attn.o", (h, q_out), 1, "residual")
        norm(f"L{i}.mlp")
        if spec.gated_mlp:
            linear(f"L{i}.mlp.gate", (f, h), 0)
            linear(f"L{i}.mlp.up", (f, h), 0)
        else:
            linear(f"L{i}.mlp.fc1", (f, h), 0)
        linear(f"L{i}.mlp.fc2", (h, f), 1, "residual")
    norm("head")
    if not spec.tied_embeddings:
        out["head.weight"] = ((spec.vocab_size, h), "normal", 0)
    return out


def init_weights(spec: ModelSpec, seed: int) -> dict[str, torch.Tensor]:
    """Full (unsharded) fp32 weights of the model, identical for a given seed on every process."""
    gen = torch.Generator().manual_seed(seed)
    residual_std = INIT_STD / math.sqrt(2 * spec.num_layers)
    weights: dict[str, torch.Tensor] = {}
    for name, (shape, rule, _dim) in weight_layout(spec).items():
        if rule == "ones":
            weights[name] = torch.ones(shape)
        elif rule == "zeros":
            weights[name] = torch.zeros(shape)
        else:
            std = residual_std if rule == "residual" else INIT_STD
            weights[name] = torch.randn(shape, generator=gen) * std
    return weights

