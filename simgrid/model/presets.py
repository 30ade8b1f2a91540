"""Named model presets and a GPT-style shape for a bare parameter count.

Sources of the shapes:

* ``gpt3-175b``: Brown et al. 2020, Table 2.1 (96 layers, h = 12288, 96 heads), with Megatron-LM's
  padded vocabulary 51200 and s = 2048, as trained in Narayanan et al. SC'21 and Korthikanti et al. 2022.
* ``gpt3-125m``, ``gpt3-350m``, ``gpt3-1.3b``, ``gpt3-2.7b``: Brown et al. 2020, Table 2.1 (layers and
  d_model: 12/768, 24/1024, 24/2048, 32/2560) with the GPT-3 recipe above (V = 51200, s = 2048); heads 12,
  16, 16 and 32 as in EleutherAI gpt-neox ``configs/125M.yml``, ``350M.yml``, ``1-3B.yml`` and ``2-7B.yml``
  (Table 2.1 lists 24 heads of width 128 for 1.3B, which does not divide d_model = 2048). The single-GPU
  accuracy benchmark (``benchmarks/gpu_accuracy.py``) trains these four.
* ``megatron-*``: every row of Narayanan et al. SC'21 Table 1 (``shared/reference/megatron_sc21_table1.csv``):
  GPT recipe with LayerNorm, biases, learned positions, tied embeddings, f = 4h, V = 51200, s = 2048.
* ``megatron-h100-*``: the GPT models of Megatron-LM's H100 weak-scaling table (README "Training Speed and
  Scalability", images/model_table.png, commit f2e5db4 of 2024-07-15, Megatron-Core r0.8.0): layers, hidden
  size and heads from the table; V = 131072 and s = 4096 from the README text; untied input and output
  embeddings, because only then do the shapes add up to the table's sizes (e.g. 24 * 12 * 2048^2 +
  2 * 131072 * 2048 = 1.75e9 for "1.7B", 112 * 12 * 18432^2 + 2 * 131072 * 18432 = 461.4e9 for "462B").
* ``korthikanti-22b``: Korthikanti et al. 2022 Table 3 (48 layers, h = 6144, 64 heads). Its 175B, 530B
  and 1T models have exactly the shapes of ``gpt3-175b``, ``megatron-529.6b`` and ``megatron-1t``; the
  aliases ``korthikanti-175b``, ``korthikanti-530b`` and ``korthikanti-1t`` name them.
* ``llama2-*``: Touvron et al. 2023 (Llama 2), Table 1 and the released configs (``config.json``).
* ``llama3-*``: Llama Team 2024 ("The Llama 3 Herd of Models"), Table 3 and the released configs.
* ``gpt2-small``: Radford et al. 2019 / the released 124M checkpoint (vocabulary 50257, s = 1024).
* ``tiny-gpt``: a made-up GPT small enough for CPU executor tests (layers and heads divisible by 2 and 4).
* ``mixtral-8x7b``: Jiang et al. 2024, "Mixtral of Experts" (arXiv:2401.04088), Table 1, and the released
  ``mistralai/Mixtral-8x7B-v0.1/config.json`` (32 layers, h 4096, 32 heads, 8 KV heads, expert width 14336,
  8 experts, top-2, vocabulary 32000); Mistral AI's announcement gives 46.7B parameters, 12.9B per token.
* ``mixtral-8x22b``: ``mistralai/Mixtral-8x22B-v0.1/config.json`` (56 layers, h 6144, 48 heads, 8 KV heads,
  expert width 16384, 8 experts, top-2, vocabulary 32768); Mistral AI's announcement: 141B, 39B active.
* ``qwen2-57b-a14b``: ``Qwen/Qwen2-57B-A14B/config.json`` (28 layers, h 3584, 28 heads, 4 KV heads, 64
  experts of width 2560, top-8 without renormalisation, a shared expert of width 20480 with a sigmoid gate,
  vocabulary 151936); Qwen2 technical report (Yang et al. 2024, arXiv:2407.10671): 57B total, 14B active.
  Its Q/K/V biases (0.13M parameters) are not modelled.
* ``qwen3-30b-a3b``: ``Qwen/Qwen3-30B-A3B/config.json`` (48 layers, h 2048, 32 heads of width 128, 4 KV
  heads, 128 experts of width 768, top-8 renormalised, vocabulary 151936); model card: 30.5B total, 3.3B
  activated. Its per-head Q/K norms (12K parameters) are not modelled.
  The MoE presets train at s = 4096, the sequence length of Megatron-Core's MoE benchmarks (Megatron-LM
  ``megatron/core/transformer/moe/README.md``, "Reference Best Parallel Mapping"). DeepSeek-V3 is not a preset:
  its multi-head latent attention (low-rank compressed K/V) is not modelled (docs/moe.md).
* ``tiny-moe``: a made-up Llama-style MoE for CPU executor tests (4 experts, top-2, first layer dense).
* ``small-gpt``: a made-up GPT for validating predictions on a CPU (``benchmarks/executor_accuracy.py``):
  large enough that a step is compute (hundreds of ms per step on one core per rank), not Python dispatch
  and gloo wake-up jitter (0.3-4 ms per collective on a 2-core host), yet small enough to run in seconds.
"""

from __future__ import annotations

import dataclasses
import difflib
import math

from simgrid.errors import ModelError
from simgrid.model.moe_spec import MoESpec
from simgrid.model.params import param_count
from simgrid.model.spec import MAX_SIZES, ModelSpec


def _gpt(name: str, layers: int, hidden: int, heads: int, *, vocab: int = 51200, seq: int = 2048) -> ModelSpec:
    return ModelSpec(name=name, num_layers=layers, hidden_size=hidden, num_heads=heads, vocab_size=vocab,
                     seq_length=seq)


def _llama(name: str, layers: int, hidden: int, heads: int, kv_heads: int, ffn: int, *, vocab: int,
           seq: int) -> ModelSpec:
    return ModelSpec(name=name, num_layers=layers, hidden_size=hidden, num_heads=heads, num_kv_heads=kv_heads,
                     ffn_hidden_size=ffn, gated_mlp=True, vocab_size=vocab, seq_length=seq,
                     tied_embeddings=False, norm="rmsnorm", position="rope", bias=False)


def _moe(name: str, layers: int, hidden: int, heads: int, kv_heads: int, *, vocab: int, moe: MoESpec,
         ffn: int | None = None, kv_channels: int | None = None, seq: int = 4096) -> ModelSpec:
    """A Llama-recipe model (RMSNorm, RoPE, SwiGLU, no biases, untied head) with MoE layers."""
    return ModelSpec(name=name, num_layers=layers, hidden_size=hidden, num_heads=heads, num_kv_heads=kv_heads,
                     ffn_hidden_size=ffn if ffn is not None else moe.expert_ffn_hidden_size, gated_mlp=True,
                     vocab_size=vocab, seq_length=seq, tied_embeddings=False, norm="rmsnorm", position="rope",
                     bias=False, kv_channels=kv_channels, moe=moe)


#: (name, layers, hidden, heads) of Narayanan et al. SC'21 Table 1; the name is the published size.
MEGATRON_TABLE1_SHAPES: tuple[tuple[str, int, int, int], ...] = (
    ("megatron-1.7b", 24, 2304, 24),
    ("megatron-3.6b", 30, 3072, 32),
    ("megatron-7.5b", 36, 4096, 32),
    ("megatron-18.4b", 40, 6144, 48),
    ("megatron-39.1b", 48, 8192, 64),
    ("megatron-76.1b", 60, 10240, 80),
    ("megatron-145.6b", 80, 12288, 96),
    ("megatron-310.1b", 96, 16384, 128),
    ("megatron-529.6b", 105, 20480, 128),
    ("megatron-1t", 128, 25600, 160),
)

#: (name, layers, hidden, heads) of Megatron-LM's H100 weak-scaling table (README, model_table.png).
MEGATRON_H100_SHAPES: tuple[tuple[str, int, int, int], ...] = (
    ("megatron-h100-1.7b", 24, 2048, 16),
    ("megatron-h100-7.1b", 30, 4096, 32),
    ("megatron-h100-16b", 32, 6144, 48),
    ("megatron-h100-32b", 48, 7168, 56),
    ("megatron-h100-70b", 84, 8192, 64),
    ("megatron-h100-119b", 92, 10240, 80),
    ("megatron-h100-177b", 96, 12288, 96),
    ("megatron-h100-314b", 96, 16384, 128),
    ("megatron-h100-462b", 112, 18432, 144),
)


def _gpt_untied(name: str, layers: int, hidden: int, heads: int, *, vocab: int, seq: int) -> ModelSpec:
    return ModelSpec(name=name, num_layers=layers, hidden_size=hidden, num_heads=heads, vocab_size=vocab,
                     seq_length=seq, tied_embeddings=False)


_PRESETS: tuple[ModelSpec, ...] = (
    _gpt("gpt3-175b", 96, 12288, 96),
    _gpt("gpt3-125m", 12, 768, 12),
    _gpt("gpt3-350m", 24, 1024, 16),
    _gpt("gpt3-1.3b", 24, 2048, 16),
    _gpt("gpt3-2.7b", 32, 2560, 32),
    *(_gpt(name, layers, hidden, heads) for name, layers, hidden, heads in MEGATRON_TABLE1_SHAPES),
    _gpt("korthikanti-22b", 48, 6144, 64),
    # NeMo Framework Launcher 24.07 GPT-3 configs (conf/training/gpt3/{5b,20b,175b}.yaml): GPT-2 BPE vocabulary
    # (50257) padded to make_vocab_size_divisible_by 128 x TP (Megatron's _vocab_size_with_padding) at the TP of the
    # NeMo 24.07 performance table (1, 2, 4); learned positions, LayerNorm, GeLU, biases, tied embeddings.
    _gpt("nemo-gpt3-5b", 24, 4096, 32, vocab=50304),
    _gpt("nemo-gpt3-20b", 44, 6144, 48, vocab=50432),
    _gpt("nemo-gpt3-175b", 96, 12288, 96, vocab=50688),
    *(_gpt_untied(name, layers, hidden, heads, vocab=131072, seq=4096)
      for name, layers, hidden, heads in MEGATRON_H100_SHAPES),
    _llama("llama2-7b", 32, 4096, 32, 32, 11008, vocab=32000, seq=4096),
    _llama("llama2-13b", 40, 5120, 40, 40, 13824, vocab=32000, seq=4096),
    _llama("llama2-70b", 80, 8192, 64, 8, 28672, vocab=32000, seq=4096),
    _llama("llama3-8b", 32, 4096, 32, 8, 14336, vocab=128256, seq=8192),
    _llama("llama3-70b", 80, 8192, 64, 8, 28672, vocab=128256, seq=8192),
    _llama("llama3-405b", 126, 16384, 128, 8, 53248, vocab=128256, seq=8192),
    _gpt("gpt2-small", 12, 768, 12, vocab=50257, seq=1024),
    _gpt("tiny-gpt", 4, 64, 4, vocab=256, seq=32),
    _moe("mixtral-8x7b", 32, 4096, 32, 8, vocab=32000,
         moe=MoESpec(num_experts=8, top_k=2, expert_ffn_hidden_size=14336)),
    _moe("mixtral-8x22b", 56, 6144, 48, 8, vocab=32768,
         moe=MoESpec(num_experts=8, top_k=2, expert_ffn_hidden_size=16384)),
    _moe("qwen2-57b-a14b", 28, 3584, 28, 4, vocab=151936, ffn=18944,
         moe=MoESpec(num_experts=64, top_k=8, expert_ffn_hidden_size=2560, shared_expert_ffn_hidden_size=20480,
                     shared_expert_gate=True, normalize_top_k=False)),
    _moe("qwen3-30b-a3b", 48, 2048, 32, 4, vocab=151936, ffn=6144, kv_channels=128,
         moe=MoESpec(num_experts=128, top_k=8, expert_ffn_hidden_size=768)),
    _moe("tiny-moe", 4, 64, 4, 2, vocab=256, seq=32, ffn=96,
         moe=MoESpec(num_experts=4, top_k=2, expert_ffn_hidden_size=32, first_dense_layers=1)),
    _gpt("small-gpt", 4, 256, 4, vocab=2048, seq=256),
)

#: Other names of the same shapes (Korthikanti et al. 2022 Table 3 reuses the SC'21 models).
MODEL_ALIASES: dict[str, str] = {
    "korthikanti-175b": "gpt3-175b",
    "korthikanti-530b": "megatron-529.6b",
    "korthikanti-1t": "megatron-1t",
}

_BY_NAME: dict[str, ModelSpec] = {m.name: m for m in _PRESETS}


def list_models() -> list[ModelSpec]:
    """Every preset, in a stable order (aliases not repeated)."""
    return list(_PRESETS)


def model_names() -> list[str]:
    """Preset names followed by the aliases."""
    return [m.name for m in _PRESETS] + list(MODEL_ALIASES)


def get_model(name: str) -> ModelSpec:
    """The preset called ``name`` (case-insensitive; aliases accepted)."""
    key = str(name).strip().lower()
    key = MODEL_ALIASES.get(key, key)
    if key in _BY_NAME:
        return _BY_NAME[key]
    names = model_names()
    close = difflib.get_close_matches(key, names, n=3, cutoff=0.6)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise ModelError(f"unknown model {name!r}{hint} Known models: {', '.join(names)}")


# Shapes (hidden, heads) that model_from_params chooses among: GPT-2 small/medium/large and the
# SC'21 Table 1 rows, i.e. widths people actually train at each size.
_WIDTH_FAMILY: tuple[tuple[int, int, int], ...] = (
    (12, 768, 12),
    (24, 1024, 16),
    (36, 1280, 20),
    *((layers, hidden, heads) for _, layers, hidden, heads in MEGATRON_TABLE1_SHAPES),
)

#: Smallest count :func:`model_from_params` accepts: below it the embedding alone dominates.
MIN_PARAMS_FOR_SHAPE = 50_000_000


#: MLP-width step :func:`model_from_params` moves in: 16 keeps the width divisible by every tensor-parallel
#: degree up to 16 (two 8-GPU nodes; the layout search keeps tp within a node).
FFN_STEP = 16


def model_from_params(n_params: float) -> ModelSpec:
    """A GPT-style model (Megatron recipe, V = 51200, s = 2048) with ``n_params`` parameters, as closely as
    its shape allows.

    Rule: take the reference shape (GPT-2 small/medium/large or an SC'21 Table 1 row) whose own parameter
    count is nearest to ``n_params`` on a log scale, keep its width and head count, and choose the layer
    count (at least 1) that brings the total closest to ``n_params``; then move the MLP width off ``4h`` in
    steps of :data:`FFN_STEP` to close the rest. What is left is at most half of
    :func:`params_granularity` (``L * 16 * (2h + 1)`` parameters: 0.03% of 7.5B) instead of half a layer
    (``12 h^2``: 2.7% of 7.5B). ``--params 7.5e9`` is 7,500,820,416 parameters (MLP width 16496), not
    the 7.47B of the SC'21 row whose width and depth it borrows.
    """
    if isinstance(n_params, bool) or not isinstance(n_params, (int, float)) or not math.isfinite(n_params):
        raise ModelError(f"--params = {n_params!r} must be a number of parameters such as 7e9")
    if n_params < MIN_PARAMS_FOR_SHAPE:
        raise ModelError(
            f"--params = {n_params:.3g} is too small to size a GPT shape (minimum {MIN_PARAMS_FOR_SHAPE:.0e}); "
            "use --model tiny-gpt or a preset"
        )
    widest = _gpt("probe", MAX_SIZES["num_layers"], *_WIDTH_FAMILY[-1][1:])
    if n_params > param_count(widest):
        raise ModelError(
            f"--params = {n_params:.3g} is above the largest model this can size ({param_count(widest):.2g} "
            f"parameters: {MAX_SIZES['num_layers']:,} layers of width {widest.hidden_size:,}); give a smaller count"
        )
    best = min(
        _WIDTH_FAMILY,
        key=lambda shape: abs(math.log(param_count(_gpt("probe", *shape)) / n_params)),
    )
    _, hidden, heads = best
    one_layer = _gpt("probe", 1, hidden, heads)
    two_layers = _gpt("probe", 2, hidden, heads)
    per_layer = param_count(two_layers) - param_count(one_layer)
    fixed = param_count(one_layer) - per_layer
    layers = max(1, round((n_params - fixed) / per_layer))
    base = _gpt(f"gpt-{_short(n_params)}", layers, hidden, heads)
    step = params_granularity(base)
    ffn = 4 * hidden + FFN_STEP * round((n_params - param_count(base)) / step)
    return dataclasses.replace(base, ffn_hidden_size=max(FFN_STEP, ffn))


def params_granularity(model: ModelSpec) -> int:
    """Parameters one :data:`FFN_STEP` of MLP width adds to ``model`` (the resolution of ``--params``)."""
    wider = dataclasses.replace(model, ffn_hidden_size=model.ffn_size + FFN_STEP)
    return param_count(wider) - param_count(model)


def params_note(model: ModelSpec, asked: float) -> str:
    """How close ``model`` is to the ``asked`` count, and the step the shape moves in."""
    count = param_count(model)
    return (f"asked {asked:.4g}: off by {count - asked:+,.0f} ({(count - asked) / asked:+.3%}); the shape "
            f"moves in steps of {params_granularity(model):,} (MLP width {model.ffn_size} in steps of {FFN_STEP})")


def _short(n_params: float) -> str:
    for scale, suffix in ((1e12, "t"), (1e9, "b"), (1e6, "m")):
        if n_params >= scale:
            return f"{n_params / scale:.3g}{suffix}"
    return f"{n_params:.3g}"
