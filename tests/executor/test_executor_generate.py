"""Greedy generation with a KV cache: one process, TP2, PP2 and TP2xPP2 on gloo give the tokens of a
single-process reference that re-runs the whole sequence through the training forward (no cache)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from executor.generate import generate, generate_local, reference_generate, stage_groups  # noqa: E402
from executor.launch import LaunchConfig  # noqa: E402
from simgrid.errors import LayoutError  # noqa: E402
from simgrid.model.spec import ModelSpec  # noqa: E402

#: GPT recipe (learned positions, LayerNorm, biases), untied head so greedy tokens vary.
GPT = ModelSpec(name="g-gpt", num_layers=2, hidden_size=32, num_heads=4, vocab_size=64, seq_length=24,
                tied_embeddings=False)
#: Llama recipe: RoPE, RMSNorm, SwiGLU, grouped-query attention (2 KV heads for 4 query heads).
LLAMA = ModelSpec(name="g-llama", num_layers=2, hidden_size=32, num_heads=4, num_kv_heads=2, ffn_hidden_size=64,
                  gated_mlp=True, vocab_size=64, seq_length=24, tied_embeddings=False, norm="rmsnorm",
                  position="rope", bias=False)
NEW = 8


def _prompt(spec: ModelSpec, length: int = 5) -> torch.Tensor:
    return torch.randint(0, spec.vocab_size, (2, length), generator=torch.Generator().manual_seed(1))


def _config(world: int) -> LaunchConfig:
    return LaunchConfig(world_size=world, run_timeout_s=240, comm_timeout_s=60)


@pytest.mark.parametrize("spec", [GPT, LLAMA], ids=["gpt", "llama"])
def test_kv_cache_generation_matches_the_cacheless_reference(spec: ModelSpec) -> None:
    """One process with a KV cache: the same greedy tokens as re-running the whole sequence every step; the
    tokens vary (the check is not passed by a model that repeats one token)."""
    ref = reference_generate(spec, _prompt(spec), NEW)
    result = generate_local(spec, _prompt(spec), NEW)
    assert result.tokens == ref
    assert len({t for row in ref for t in row}) > 4
    assert len(result.step_s) == NEW and result.ttft_s > 0 and result.tpot_s > 0


@pytest.mark.slow
@pytest.mark.parametrize(("spec", "tp", "pp"), [(LLAMA, 2, 1), (GPT, 1, 2), (LLAMA, 2, 2)],
                         ids=["tp2-llama", "pp2-gpt", "tp2pp2-llama"])
def test_distributed_generation_matches_the_reference(spec: ModelSpec, tp: int, pp: int) -> None:
    """Real ranks on gloo: Megatron shards with all-reduces (TP2, GQA heads split), stages handing hidden
    states forward and token ids back (PP2), and both (4 ranks): the reference's tokens, timed at rank 0.
    Recorded (for calibration): every rank's steps, and per step and rank the embedding's and two
    all-reduces per layer of its stage and the logits' all-gather (tp > 1), one receive per stage but the
    first's (which receives the token ids) and one send per stage, each stamped inside its step."""
    result = generate(spec, _prompt(spec), NEW, tp=tp, pp=pp, config=_config(tp * pp), record=True)
    assert result.tokens == reference_generate(spec, _prompt(spec), NEW)
    assert len(result.step_s) == NEW and all(t > 0 for t in result.step_s)
    assert [t.rank for t in result.timelines] == list(range(tp * pp))
    for line in result.timelines:
        stage = line.rank // tp
        assert len(line.steps) == NEW
        for step, (start, end) in enumerate(line.steps):
            calls = [c for c in line.calls if c.step == step]
            assert all(start <= c.start_s <= c.end_s <= end for c in calls)
            kinds = sorted(c.kind for c in calls)
            expected = []
            if tp > 1:
                layers = spec.num_layers // pp
                expected += ["all_reduce"] * (2 * layers + (stage == 0)) + ["all_gather"] * (stage == pp - 1)
            if pp > 1:
                expected += ["recv", "send"]
            assert kinds == sorted(expected), (line.rank, step)


def test_stage_groups_put_tensor_ranks_fastest() -> None:
    """rank = t + tp * stage: stage 0 holds ranks 0, 1 and stage 1 ranks 2, 3 for TP2xPP2."""
    assert stage_groups(2, 2) == {"world": (0, 1, 2, 3), "tp/s0": (0, 1), "tp/s1": (2, 3)}


def test_bad_generation_requests_are_refused() -> None:
    """A tp that does not divide the heads, and a prompt that overflows the context, name the problem."""
    with pytest.raises(LayoutError, match="tp = 3 does not divide the 4 attention heads"):
        generate(GPT, _prompt(GPT), 2, tp=3)
    with pytest.raises(LayoutError, match="must fit the context of 24"):
        generate_local(GPT, _prompt(GPT, 20), 5)
