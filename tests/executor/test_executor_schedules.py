"""The pipeline schedules torch has and the first executor tests did not cover, run for real on gloo.

Interleaved 1F1B with a micro-batch count that is not a multiple of pp (torch's flexible rounds, as
Llama 3 trained), interleaved 1F1B with Megatron-Core's p2p posting (``p2p_order = "megatron-core"``), 1F1B and interleaved 1F1B
with Megatron-LM's batched p2p (``"megatron-batched"``),
interleaved zero bubble (vpp >= 2), looped BFS, DualPipeV (its OVERLAP_F_B units run
as forward then full backward, as torch's runtime does) and an order imported from a torch CSV: one
step of each, on 2 and 4 ranks, must give the single-process reference's loss and updated weights.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from executor.launch import LaunchConfig  # noqa: E402
from executor.model import init_weights  # noqa: E402
from executor.reference import reference_training  # noqa: E402
from executor.runner import Job, RunResult, run_programs  # noqa: E402
from simgrid.ir import actions_to_csv  # noqa: E402
from simgrid.layout.spec import Layout  # noqa: E402
from simgrid.model.presets import get_model  # noqa: E402
from simgrid.model.spec import ModelSpec  # noqa: E402
from simgrid.schedules import build_program  # noqa: E402
from simgrid.schedules.imported import layout_for_order, read_pipeline_csv  # noqa: E402
from simgrid.schedules.pipeline import pipeline_order  # noqa: E402
from tests.executor.reference_checks import (  # noqa: E402
    TOL,
    UPDATE_TOL,
    assert_each_weight_matches,
    global_relative_error,
    update_relative_error,
)

pytestmark = [pytest.mark.torch, pytest.mark.slow, pytest.mark.timeout(400)]

TINY = get_model("tiny-gpt")
EIGHT = ModelSpec(name="tiny-gpt-8", num_layers=8, hidden_size=64, num_heads=4, vocab_size=256, seq_length=32)
SGD = {"optimizer": "sgd", "precision": "fp32", "micro_batch_size": 1}

TWO_RANK: dict[str, tuple[ModelSpec, Layout]] = {
    "interleaved-1f1b-m3": (TINY, Layout(pp=2, vpp=2, schedule="interleaved-1f1b", global_batch_size=3, **SGD)),
    "interleaved-zb": (TINY, Layout(pp=2, vpp=2, schedule="interleaved-zb", global_batch_size=4, **SGD)),
    "looped-bfs": (TINY, Layout(pp=2, vpp=2, schedule="looped-bfs", global_batch_size=3, **SGD)),
    "dualpipev": (TINY, Layout(pp=2, vpp=2, schedule="dualpipev", global_batch_size=5, **SGD)),
    # Megatron-Core's overlapped p2p posting (p2p_order "megatron-core"); m = pp runs every forward first
    "interleaved-1f1b-megatron-core-m4": (TINY, Layout(pp=2, vpp=2, schedule="interleaved-1f1b", global_batch_size=4,
                                                       p2p_order="megatron-core", **SGD)),
    "interleaved-1f1b-megatron-core-m2": (TINY, Layout(pp=2, vpp=2, schedule="interleaved-1f1b", global_batch_size=2,
                                                       p2p_order="megatron-core", **SGD)),
    "1f1b-megatron-batched": (TINY, Layout(pp=2, schedule="1f1b", global_batch_size=3, p2p_order="megatron-batched",
                                           **SGD)),
}
FOUR_RANK: dict[str, tuple[ModelSpec, Layout]] = {
    "pp4-interleaved-1f1b-m6": (EIGHT, Layout(pp=4, vpp=2, schedule="interleaved-1f1b", global_batch_size=6, **SGD)),
    "pp4-interleaved-1f1b-megatron-core-m8": (EIGHT, Layout(pp=4, vpp=2, schedule="interleaved-1f1b",
                                                            global_batch_size=8, p2p_order="megatron-core", **SGD)),
    "pp4-interleaved-1f1b-megatron-batched-m8": (EIGHT, Layout(pp=4, vpp=2, schedule="interleaved-1f1b",
                                                               global_batch_size=8, p2p_order="megatron-batched",
                                                               **SGD)),
    "pp4-dualpipev": (EIGHT, Layout(pp=4, vpp=2, schedule="dualpipev", global_batch_size=8, **SGD)),
    "dp2xpp2-interleaved-zb": (TINY, Layout(dp=2, pp=2, vpp=2, schedule="interleaved-zb", global_batch_size=8,
                                            **SGD)),
}


def _imported(tmp_dir: object) -> tuple[ModelSpec, Layout, object]:
    """A DualPipeV order written as torch's CSV and read back: the program lowers the file's order."""
    path = tmp_dir / "dualpipev.csv"  # type: ignore[operator]
    path.write_text(actions_to_csv(pipeline_order("dualpipev", 2, 4, 2)), newline="")
    order = read_pipeline_csv(path)
    return TINY, layout_for_order(order, Layout(**SGD)), order


def _run(cases: dict[str, tuple[ModelSpec, Layout]], world: int, extra: dict[str, object] | None = None
         ) -> dict[str, RunResult]:
    jobs = [Job(program=build_program(model, layout)) for model, layout in cases.values()]
    jobs += [Job(program=program) for program in (extra or {}).values()]  # type: ignore[misc]
    results = run_programs(jobs, config=LaunchConfig(world_size=world, run_timeout_s=360, comm_timeout_s=120))
    return dict(zip([*cases, *(extra or {})], results, strict=True))


@pytest.fixture(scope="module")
def imported_case(tmp_path_factory: pytest.TempPathFactory) -> tuple[ModelSpec, Layout, object]:
    return _imported(tmp_path_factory.mktemp("csv"))


@pytest.fixture(scope="module")
def two_rank_results(imported_case: tuple[ModelSpec, Layout, object]) -> dict[str, RunResult]:
    model, layout, order = imported_case
    return _run(TWO_RANK, 2, {"imported-dualpipev": build_program(model, layout, order=order)})  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def four_rank_results() -> dict[str, RunResult]:
    return _run(FOUR_RANK, 4)


def _check(name: str, model: ModelSpec, layout: Layout, result: RunResult) -> None:
    ref = reference_training(model, layout)
    assert result.losses[0] == pytest.approx(ref.losses[0], rel=TOL), name
    assert set(result.weights) == set(ref.weights)
    assert global_relative_error(result.weights, ref.weights) <= TOL, name
    start = init_weights(model, 0)
    assert update_relative_error(result.weights, ref.weights, start) <= UPDATE_TOL, name
    assert_each_weight_matches(name, result.weights, ref.weights)


@pytest.mark.parametrize("name", list(TWO_RANK))
def test_two_rank_schedule_matches_single_process_reference(name: str, two_rank_results: dict[str, RunResult]) -> None:
    """Each new schedule on 2 ranks: the reference's loss and SGD-updated weights (rel <= 1e-5)."""
    model, layout = TWO_RANK[name]
    _check(name, model, layout, two_rank_results[name])


def test_order_imported_from_a_torch_csv_runs_and_matches(
        imported_case: tuple[ModelSpec, Layout, object], two_rank_results: dict[str, RunResult]) -> None:
    """A program lowered from a torch CSV's order trains like the reference too."""
    model, layout, _ = imported_case
    assert (layout.pp, layout.vpp, layout.num_microbatches) == (2, 2, 4)
    _check("imported-dualpipev", model, layout, two_rank_results["imported-dualpipev"])


@pytest.mark.parametrize("name", list(FOUR_RANK))
def test_four_rank_schedule_matches_single_process_reference(name: str,
                                                             four_rank_results: dict[str, RunResult]) -> None:
    """pp 4 interleaving with m = 6, pp 4 DualPipeV and DP2 x interleaved ZB on 4 ranks match as well."""
    model, layout = FOUR_RANK[name]
    _check(name, model, layout, four_rank_results[name])
