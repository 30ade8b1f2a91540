"""The block-split transformer equals a monolithic one, and I + W backward equals B."""

from __future__ import annotations

import dataclasses
import math

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

from executor.blockrun import BlockRun  # noqa: E402
from executor.model import build_blocks, init_weights, owned_parameters  # noqa: E402
from executor.reference import drive_local, run_forward_backward  # noqa: E402
from executor.tp import TPContext  # noqa: E402
from simgrid.model.spec import ModelSpec  # noqa: E402

GPT = ModelSpec(name="t-gpt", num_layers=2, hidden_size=32, num_heads=4, vocab_size=64, seq_length=8)
LLAMA = ModelSpec(name="t-llama", num_layers=2, hidden_size=32, num_heads=4, num_kv_heads=2,
                  ffn_hidden_size=48, gated_mlp=True, vocab_size=64, seq_length=8, tied_embeddings=False,
                  norm="rmsnorm", position="rope", bias=False)


def monolithic_loss(spec: ModelSpec, w: dict[str, torch.Tensor], tokens: torch.Tensor,
                    targets: torch.Tensor) -> torch.Tensor:
    """A plain [batch, seq, hidden] implementation written independently of executor.model."""
    x = tokens.t()  # [b, s]
    b, s = x.shape
    h = F.embedding(x, w["embed.wte"])
    if spec.position == "learned":
        h = h + w["embed.wpe"][:s]

    def norm(t: torch.Tensor, prefix: str) -> torch.Tensor:
        if spec.norm == "layernorm":
            return F.layer_norm(t, (t.shape[-1],), w[f"{prefix}.norm.weight"], w[f"{prefix}.norm.bias"], 1e-5)
        return t / torch.sqrt(t.pow(2).mean(-1, keepdim=True) + 1e-5) * w[f"{prefix}.norm.weight"]

    def lin(t: torch.Tensor, name: str) -> torch.Tensor:
        return F.linear(t, w[f"{name}.weight"], w.get(f"{name}.bias"))

    d, a, kv = spec.head_dim, spec.num_heads, spec.kv_heads
    pos = torch.arange(s, dtype=torch.float64)
    freqs = 1.0 / 10000 ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = torch.outer(pos, freqs)
    cos, sin = torch.cat([ang, ang], -1).cos().float(), torch.cat([ang, ang], -1).sin().float()

    def rope(t: torch.Tensor) -> torch.Tensor:  # [b, heads, s, d]
        x1, x2 = t[..., : d // 2], t[..., d // 2:]
        return t * cos + torch.cat([-x2, x1], -1) * sin

    for i in range(spec.num_layers):
        n = norm(h, f"L{i}.attn")
        q = lin(n, f"L{i}.attn.q").view(b, s, a, d).transpose(1, 2)
        k = lin(n, f"L{i}.attn.k").view(b, s, kv, d).transpose(1, 2)
        v = lin(n, f"L{i}.attn.v").view(b, s, kv, d).transpose(1, 2)
        if spec.position == "rope":
            q, k = rope(q), rope(k)
        k, v = k.repeat_interleave(a // kv, 1), v.repeat_interleave(a // kv, 1)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        h = h + lin(att.transpose(1, 2).reshape(b, s, a * d), f"L{i}.attn.o")
        n = norm(h, f"L{i}.mlp")
        if spec.gated_mlp:
            inner = F.silu(lin(n, f"L{i}.mlp.gate")) * lin(n, f"L{i}.mlp.up")
        else:
            inner = F.gelu(lin(n, f"L{i}.mlp.fc1"))
        h = h + lin(inner, f"L{i}.mlp.fc2")
    head_w = w["embed.wte"] if spec.tied_embeddings else w["head.weight"]
    logits = F.linear(norm(h, "head"), head_w)
    return F.cross_entropy(logits.reshape(-1, spec.vocab_size), targets.t().reshape(-1))


@pytest.mark.parametrize("flash", [False, True], ids=["unfused-core", "flash-attention-core"])
@pytest.mark.parametrize("spec", [GPT, LLAMA], ids=["gpt-layernorm-learned", "llama-rms-rope-gqa-swiglu"])
def test_block_split_model_matches_monolithic_loss_and_grads(spec: ModelSpec, flash: bool) -> None:
    """Loss and every weight gradient of the segmented blocks equal a monolithic implementation, with the
    attention core materialising its scores or fused (the layout's flash_attention)."""
    weights = init_weights(spec, seed=3)
    tokens = torch.randint(0, spec.vocab_size, (spec.seq_length, 2), generator=torch.Generator().manual_seed(1))
    targets = torch.roll(tokens, -1, 0)
    modules = build_blocks(spec, list(range(2 * spec.num_layers + 2)), weights, TPContext(), flash_attention=flash)
    loss = run_forward_backward(modules, tokens, targets, 1.0)
    ref_w = {k: v.clone().requires_grad_(True) for k, v in weights.items()}
    ref_loss = monolithic_loss(spec, ref_w, tokens, targets)
    ref_loss.backward()
    assert loss == pytest.approx(float(ref_loss.detach()), rel=1e-6)
    assert loss == pytest.approx(math.log(spec.vocab_size), rel=0.05)  # near-uniform predictions at init
    grads = {name: p.grad for m in modules.values() for name, p in owned_parameters(m)}
    assert set(grads) == set(weights)
    for name, g in grads.items():
        ref = ref_w[name].grad
        assert g is not None and ref is not None
        assert torch.allclose(g, ref, rtol=1e-4, atol=1e-7), name


def test_init_is_deterministic_and_seed_dependent() -> None:
    """The same seed gives identical weights; another seed gives different ones; std is 0.02."""
    a, b, c = init_weights(GPT, 1), init_weights(GPT, 1), init_weights(GPT, 2)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["embed.wte"], c["embed.wte"])
    assert float(a["embed.wte"].std()) == pytest.approx(0.02, rel=0.1)


def test_input_grad_then_weight_grad_equals_full_backward() -> None:
    """Zero-bubble split: I (input grads) then W (weight grads) accumulate exactly what B does."""
    spec = dataclasses.replace(GPT, num_layers=1)
    weights = init_weights(spec, seed=5)
    tokens = torch.randint(0, spec.vocab_size, (spec.seq_length, 2), generator=torch.Generator().manual_seed(2))
    targets = torch.roll(tokens, -1, 0)
    results = {}
    for mode in ("B", "IW"):
        modules = build_blocks(spec, list(range(4)), weights, TPContext())
        runs, x = [], tokens
        for index in sorted(modules):
            run = BlockRun(modules[index], 0, x, targets if index == 3 else None)
            drive_local(run, forward=True)
            runs.append(run)
            x = run.output
        grad = torch.tensor(1.0)
        for run in reversed(runs):
            run.set_output_grad(grad)
            assert run.backward("B" if mode == "B" else "I") is None
            if run.input_grad is not None:
                grad = run.input_grad
        if mode == "IW":
            assert all(p.grad is None for m in modules.values() for p in m.parameters())
            for run in runs:
                run.weight_backward()
        results[mode] = {n: p.grad.clone() for m in modules.values() for n, p in owned_parameters(m)}
    for name in results["B"]:
        assert torch.allclose(results["B"][name], results["IW"][name], rtol=1e-6, atol=1e-9), name
