"""Memory advice ranking: recipes within the user's GPU count come first, the fewest changes first."""

from __future__ import annotations

from dataclasses import dataclass

from simgrid.layout import Layout
from simgrid.memory import estimate_memory, suggest_layouts
from simgrid.model import get_model


@dataclass(frozen=True)
class _GPU:
    name: str
    memory_bytes: int


A100_80GB = _GPU("a100-80gb", 80 * 2**30)
RTX_4090 = _GPU("rtx-4090", 24 * 2**30)
LLAMA2_7B = get_model("llama2-7b")


def test_a_user_with_eight_gpus_hears_first_what_fits_on_eight() -> None:
    """llama2-7b at s = 16384 on 8 A100s with ZeRO-1 needs ~600 GiB of activations: the first advice keeps
    the 8 GPUs and changes one setting, rather than offering one GPU with CPU offload; every recipe within
    the budget comes before any that needs more GPUs, and the within-budget ones never add changes."""
    base = Layout(dp=8, zero=1, global_batch_size=8)
    model = LLAMA2_7B.with_seq_length(16384)
    assert not estimate_memory(model, base, A100_80GB).fits
    advice = suggest_layouts(model, base, A100_80GB, max_gpus=64, limit=20)
    assert advice and advice[0].layout.world_size == 8 and advice[0].description.count(",") == 0
    sizes = [s.layout.world_size for s in advice]
    within = [s for s in advice if s.layout.world_size <= 8]
    assert sizes[: len(within)] == [s.layout.world_size for s in within]  # budget first
    changes = [s.description.count(",") for s in within]
    assert changes == sorted(changes)


def test_without_a_budget_to_spare_the_fewest_gpus_come_first() -> None:
    """One RTX 4090 cannot hold llama2-7b at all: every recipe needs more GPUs, cheapest hardware first."""
    advice = suggest_layouts(LLAMA2_7B, Layout(), RTX_4090, max_gpus=8, limit=10)
    sizes = [s.layout.world_size for s in advice]
    assert sizes and min(sizes) > 1 and sizes == sorted(sizes)


def test_one_data_parallel_rank_is_never_offered_a_different_zero_stage() -> None:
    """ZeRO shards over the data- and context-parallel ranks; with dp = cp = 1 a changed stage would be a
    duplicate recipe."""
    base = Layout(dp=8, zero=1, global_batch_size=8)
    model = LLAMA2_7B.with_seq_length(16384)
    advice = suggest_layouts(model, base, A100_80GB, max_gpus=64, limit=50)
    assert all(s.layout.zero == base.zero for s in advice if s.layout.dp * s.layout.cp == 1)


def test_long_sequences_are_offered_context_parallelism_on_the_same_gpus() -> None:
    """llama3-8b at 128K tokens with flash attention and full recompute on 8 GPUs of 80 GiB: activations
    dominate, and the first advice keeps the 8 GPUs by trading data for context parallelism (cp 8)."""
    model = get_model("llama3-8b").with_seq_length(131072)
    base = Layout(dp=8, zero=1, global_batch_size=8, flash_attention=True, recompute="full")
    advice = suggest_layouts(model, base, A100_80GB, max_gpus=64, limit=10)
    assert advice[0].layout.cp == 8 and advice[0].layout.world_size == 8
    assert advice[0].description == "8 GPUs: dp=1, cp=8"
    assert all(estimate_memory(model, s.layout, A100_80GB).fits for s in advice)


def test_context_parallelism_is_not_offered_when_model_states_dominate() -> None:
    """A 70B model at 4K tokens is too big because of its states, not its activations: no cp recipe."""
    base = Layout(dp=8, global_batch_size=8, recompute="full")
    advice = suggest_layouts(get_model("llama2-70b"), base, A100_80GB, max_gpus=64, limit=20)
    assert advice and all(s.layout.cp == 1 for s in advice)
