"""The model's full weights: every parameter's name, shape, initialisation and tensor-parallel shard dimension.

Names follow the blocks of :mod:`executor.model` (``embed.wte``, ``L{i}.attn.q.weight``, ``head.norm.weight``,
...); a MoE layer's MLP is ``L{i}.moe.*``: its norm, ``router.weight`` (``E x h``), every expert as
``experts.{e}.gate|up|fc1|fc2`` and the shared expert as ``shared.*`` with its gate ``shared_gate.weight``. Everything is fp32; initialisation is deterministic from a seed and identical on every process (GPT-2
recipe: normal with std 0.02, residual output projections scaled by ``1/sqrt(2L)``, Radford et al. 2019,
section 2.3), so every rank cuts its shards from the same full tensors as the single-process reference.
"""

from __future__ import annotations

import math
from typing import Any

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

    def linear(name: str, shape: tuple[int, int], dim: int | None, rule: str = "normal", *, bias: bool = True) -> None:
        out[f"{name}.weight"] = (shape, rule, dim)
        if spec.bias and bias:
            out[f"{name}.bias"] = ((shape[0],), "zeros", 0 if dim == 0 else None)

    for i in range(spec.num_layers):
        norm(f"L{i}.attn")
        linear(f"L{i}.attn.q", (q_out, h), 0)
        linear(f"L{i}.attn.k", (kv_out, h), 0)
        linear(f"L{i}.attn.v", (kv_out, h), 0)
        linear(f"L{i}.attn.o", (h, q_out), 1, "residual")
        if spec.moe is not None and i >= spec.moe.first_dense_layers:
            moe_weights(spec, f"L{i}.moe", norm, linear)
            continue
        norm(f"L{i}.mlp")
        mlp(spec, f"L{i}.mlp", f, linear)
    norm("head")
    if not spec.tied_embeddings:
        out["head.weight"] = ((spec.vocab_size, h), "normal", 0)
    return out


def mlp(spec: ModelSpec, prefix: str, width: int, linear: Any, *, split: bool = True) -> None:
    """An MLP's matrices: gate and up (SwiGLU) or fc1 (GeLU), column-parallel, then fc2, row-parallel
    (``split=False``: not tensor-parallel, as a routed expert under MoE parallel folding with etp 1)."""
    h = spec.hidden_size
    if spec.gated_mlp:
        linear(f"{prefix}.gate", (width, h), 0 if split else None)
        linear(f"{prefix}.up", (width, h), 0 if split else None)
    else:
        linear(f"{prefix}.fc1", (width, h), 0 if split else None)
    linear(f"{prefix}.fc2", (h, width), 1 if split else None, "residual")


def moe_weights(spec: ModelSpec, prefix: str, norm: Any, linear: Any) -> None:
    """A MoE layer's MLP sub-block: norm, router, routed experts, shared expert and its gate."""
    moe = spec.moe
    assert moe is not None
    h = spec.hidden_size
    norm(prefix)
    linear(f"{prefix}.router", (moe.num_experts, h), None, bias=False)
    for e in range(moe.num_experts):
        mlp(spec, f"{prefix}.experts.{e}", moe.expert_ffn_hidden_size, linear, split=False)
    if moe.shared_expert_ffn_hidden_size:
        mlp(spec, f"{prefix}.shared", moe.shared_expert_ffn_hidden_size, linear)
    if moe.shared_expert_gate:
        linear(f"{prefix}.shared_gate", (1, h), None, bias=False)


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

