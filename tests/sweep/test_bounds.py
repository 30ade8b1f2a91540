"""The search's lower bounds (simgrid.sweep.bounds) never exceed the simulated step time.

Admissibility is what makes branch and bound exact: a layout is skipped only when its bound shows it
cannot enter the best K. Checked here over a few hundred layouts sampled from the searches of several
models, clusters and GPU counts (every schedule with its interleaving, ZeRO, recompute, sequence
parallelism, FlashAttention, TP comm overlap, deferred param gather, context parallelism, uneven stages, a
MoE model's expert parallelism), with
the step simulated by
:func:`simgrid.simulate` exactly as a user would, plus: the cheap bound is below the graph bound, the
bound is tight enough to prune (within 30% of the step on average), and the costs shared between layouts
give the same bounds as a fresh computation per layout.
"""

from __future__ import annotations

import dataclasses
import random
from functools import cache
from typing import Any

import pytest

from simgrid.engine import ClusterCostModel
from simgrid.hardware import load_cluster
from simgrid.layout import Layout
from simgrid.model import get_model
from simgrid.model.spec import ModelSpec
from simgrid.simulation import simulate
from simgrid.sweep import SweepConstraints, enumerate_layouts
from simgrid.sweep.bounds import BoundModel
from simgrid.sweep.constraints import ALL_PIPELINE_SCHEDULES
from simgrid.sweep.costcache import MemoCostModel

TINY_LLAMA = ModelSpec(name="tiny-llama", num_layers=6, hidden_size=64, num_heads=8, num_kv_heads=2,
                       ffn_hidden_size=176, gated_mlp=True, vocab_size=512, seq_length=64, tied_embeddings=False,
                       norm="rmsnorm", position="rope", bias=False)
EVERYTHING = SweepConstraints(schedules=ALL_PIPELINE_SCHEDULES, sequence_parallel=(False, True), flash_attention=(False, True),
                              tp_comm_overlap=(False, True), overlap_param_gather=(False, True),
                              context_parallel=(1, 2), allow_uneven_stages=True, max_mbs=2, max_vpp=3)
SEARCHES: tuple[tuple[ModelSpec, str, int, int], ...] = (
    (get_model("tiny-gpt"), "dgx-a100-hdr", 16, 32),
    (TINY_LLAMA, "rtx4090-10gbe", 8, 16),
    (get_model("small-gpt"), "dgx-h100-ndr", 16, 16),
    (get_model("gpt2-small"), "dgx-a100-hdr", 32, 64),
    (get_model("tiny-moe"), "dgx-a100-hdr", 16, 32),
)
PER_SEARCH = 60


@cache
def _cluster(name: str, gpus: int) -> Any:
    return load_cluster(name, gpus=gpus)


def _bound_model(model: ModelSpec, cluster: Any, granularity: str = "stage") -> BoundModel:
    memo: dict[tuple[str, str], MemoCostModel] = {}

    def cost(dtype: str, attention_kernel: str = "auto") -> MemoCostModel:
        if (dtype, attention_kernel) not in memo:
            memo[dtype, attention_kernel] = MemoCostModel(
                ClusterCostModel(cluster, dtype=dtype, attention_kernel=attention_kernel))
        return memo[dtype, attention_kernel]

    return BoundModel(model, cluster, granularity=granularity, cost_model=cost)


def _samples() -> list[tuple[ModelSpec, str, int, list[Layout]]]:
    rng = random.Random(7)
    out = []
    for model, cluster, gpus, gbs in SEARCHES:
        layouts = enumerate_layouts(model, _cluster(cluster, gpus), gpus=gpus, global_batch=gbs, constraints=EVERYTHING)
        out.append((model, cluster, gpus, rng.sample(layouts, min(PER_SEARCH, len(layouts)))))
    return out


@pytest.mark.slow
def test_bounds_never_exceed_the_simulated_step() -> None:
    """quick <= dag <= simulate().step_time_s for every sampled layout (stage granularity, as the search
    simulates), and the dag bound recovers most of the step (it is useful, not just admissible)."""
    ratios = []
    covered: set[str] = set()
    for model, cluster_name, gpus, layouts in _samples():
        cluster = _cluster(cluster_name, gpus)
        bounds = _bound_model(model, cluster)
        for layout in layouts:
            step = simulate(model, cluster, layout, granularity="stage").metrics.step_time_s
            quick, dag = bounds.quick(layout), bounds.dag(layout)
            assert quick <= dag * (1 + 1e-12), (layout, quick, dag)
            assert dag <= step, (model.name, cluster_name, layout, dag, step)
            ratios.append(dag / step)
            covered |= {str(layout.schedule), f"zero{layout.zero}", f"rc-{layout.recompute}"}
            covered |= {n for n, on in (("cp", layout.cp > 1), ("sp", layout.sequence_parallel),
                                        ("flash", layout.flash_attention), ("ep", layout.ep > 1),
                                        ("tpo", layout.tp_comm_overlap), ("opg", layout.overlap_param_gather),
                                        ("etp", layout.expert_tp > 1)) if on}
    assert {*ALL_PIPELINE_SCHEDULES, "none", "zero0", "zero1", "zero3",
            "rc-none", "rc-selective", "rc-full", "cp", "sp", "flash", "ep", "etp", "tpo", "opg"} <= covered
    assert sum(ratios) / len(ratios) > 0.7


def test_block_granularity_bounds_are_admissible_too() -> None:
    """A search asked to simulate at block granularity bounds with block-granularity actions."""
    model, cluster = TINY_LLAMA, _cluster("dgx-a100-hdr", 8)
    bounds = _bound_model(model, cluster, granularity="block")
    layouts = enumerate_layouts(model, cluster, gpus=8, global_batch=16, constraints=EVERYTHING)
    for layout in random.Random(3).sample(layouts, 25):
        step = simulate(model, cluster, layout, granularity="block").metrics.step_time_s
        assert bounds.quick(layout) <= bounds.dag(layout) * (1 + 1e-12) <= step * (1 + 1e-12), layout


@pytest.mark.parametrize("search", [SEARCHES[2], SEARCHES[4]], ids=["dense", "moe"])
def test_shared_costs_give_the_bounds_of_a_fresh_computation(search: tuple[ModelSpec, str, int, int]) -> None:
    """One bound model over a whole search (costs shared across layouts of a cost class) gives exactly the
    bounds a fresh model gives for each layout alone."""
    model, cluster_name, gpus, gbs = search
    cluster = _cluster(cluster_name, gpus)
    layouts = enumerate_layouts(model, cluster, gpus=gpus, global_batch=gbs, constraints=EVERYTHING)
    shared = _bound_model(model, cluster)
    together = [(shared.quick(lay), shared.dag(lay)) for lay in layouts]
    for layout, pair in random.Random(5).sample(list(zip(layouts, together, strict=True)), 60):
        fresh = _bound_model(model, cluster)
        assert (fresh.quick(layout), fresh.dag(layout)) == pair, layout


@pytest.mark.parametrize("cluster_name", ["dgx-h100-ndr", "dgx-a100-hdr"])
def test_tp_comm_overlap_bound_is_below_the_overlapped_step(cluster_name: str) -> None:
    """With tp_comm_overlap the bound lowers the actions the way the program builder does (GEMM chunks with
    their collectives beside them): llama2-7b at tp 8 hides enough TP communication that the bound of the
    same layout without the overlap (every TP collective serial) is above the overlapped step, so that
    bound would prune layouts that belong in the best K."""
    model, cluster = get_model("llama2-7b"), _cluster(cluster_name, 8)
    bounds = _bound_model(model, cluster)
    layout = Layout(dp=1, tp=8, global_batch_size=8, micro_batch_size=1, sequence_parallel=True,
                    tp_comm_overlap=True, recompute="full", flash_attention=True)
    step = simulate(model, cluster, layout, granularity="stage").metrics.step_time_s
    assert bounds.quick(layout) <= bounds.dag(layout) * (1 + 1e-12) <= step * (1 + 1e-12)
    assert bounds.dag(dataclasses.replace(layout, tp_comm_overlap=False)) > step
