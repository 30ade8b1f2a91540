"""simgrid.simulation.simulate and the `simgrid simulate` command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simgrid.cli.main import main
from simgrid.errors import SimgridError, SimulationError
from simgrid.hardware import load_cluster
from simgrid.layout import Layout
from simgrid.model import get_model
from simgrid.simulation import SimulationResult, simulate

ISSUE_KEYS = {"step_time_s", "tokens_per_s", "tflops_per_gpu", "hw_tflops_per_gpu", "mfu", "hfu", "bubble_fraction",
              "peak_memory_bytes", "memory_capacity_bytes", "fits", "exposed_comm_s", "world_size", "wall_s"}

LAYOUT = Layout(dp=2, tp=2, pp=2, global_batch_size=8)


@pytest.fixture(scope="module")
def result() -> SimulationResult:
    """One small simulated step shared by the API tests."""
    return simulate("tiny-gpt", "dgx-a100-hdr", LAYOUT)


def test_json_has_the_issue_keys(result: SimulationResult) -> None:
    """to_json_dict carries every key issue 4 lists (plus descriptive fields), exposed comm by tp/pp/dp
    (and cp and ep, zero without context or expert parallelism)."""
    data = result.to_json_dict()
    assert set(data) >= ISSUE_KEYS
    assert set(data["exposed_comm_s"]) == {"tp", "cp", "ep", "pp", "dp"}
    assert data["exposed_comm_s"]["cp"] == 0.0 and data["exposed_comm_s"]["ep"] == 0.0
    assert data["world_size"] == 8 and data["model"] == "tiny-gpt" and data["cluster"] == "dgx-a100-hdr"
    json.dumps(data)  # JSON-serialisable as is


def test_metrics_are_consistent(result: SimulationResult) -> None:
    """Tokens/s = gbs * seq / step; MFU = model TFLOP/s over the A100's 312 TFLOP/s bf16 peak; the
    capacity is the A100-80GB's 80 GiB; step time equals the trace's makespan."""
    m = result.metrics
    assert m.step_time_s == result.trace.makespan_s > 0
    assert m.tokens_per_s == pytest.approx(8 * 32 / m.step_time_s)
    assert m.mfu == pytest.approx(m.tflops_per_gpu / 312.0)
    assert m.memory_capacity_bytes == 80 * 2**30
    assert 0 <= m.bubble_fraction < 1 and m.fits
    assert result.granularity == "block"  # auto: 8 ranks <= 64


def test_model_and_cluster_objects_are_accepted() -> None:
    """A ModelSpec and a sized Cluster give the same step as the names."""
    by_name = simulate("tiny-gpt", "dgx-a100-hdr", LAYOUT).metrics.step_time_s
    by_object = simulate(get_model("tiny-gpt"), load_cluster("dgx-a100-hdr", gpus=8), LAYOUT).metrics.step_time_s
    assert by_object == by_name


def test_auto_granularity_folds_large_worlds_into_stages() -> None:
    """Above 64 ranks "auto" picks stage granularity."""
    big = simulate("tiny-gpt", "dgx-a100-hdr", Layout(dp=64, tp=2, global_batch_size=64))
    assert big.granularity == "stage"


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"granularity": "layer"}, SimulationError, "granularity = 'layer'"),
    ({"mode": "half"}, SimulationError, "mode = 'half'"),
    ({"cluster": load_cluster("dgx-a100-hdr", gpus=4)}, SimulationError, "needs 8 GPUs"),
    ({"model": 7}, SimulationError, "model must be a preset name"),
])
def test_bad_arguments_raise_project_errors(kwargs: dict[str, object], error: type[Exception], match: str) -> None:
    """Bad input is a SimgridError naming the argument and the value."""
    args: dict[str, object] = {"model": "tiny-gpt", "cluster": "dgx-a100-hdr", "layout": LAYOUT}
    args.update(kwargs)
    with pytest.raises(error, match=match):
        simulate(**args)  # type: ignore[arg-type]


def test_cli_report_is_readable(capsys: pytest.CaptureFixture[str]) -> None:
    """The report lists model, layout, step time, MFU/HFU, bubble, exposed comm and a fit verdict."""
    code = main(["simulate", "--model", "tiny-gpt", "--cluster", "dgx-a100-hdr", "--gpus", "8", "--tp", "2",
                 "--pp", "2", "--mbs", "1", "--gbs", "8"])
    out = capsys.readouterr().out
    assert code == 0
    for label in ("model", "layout", "step time", "MFU / HFU", "pipeline bubble", "exposed comm", "peak memory"):
        assert label in out
    assert "dp 2, tp 2, pp 2" in out and ": fits" in out


def test_cli_json_trace_and_gantt(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--json prints the issue's keys; --trace writes Chrome trace JSON; --gantt writes a PNG."""
    trace_path, gantt_path = tmp_path / "t.json", tmp_path / "g.png"
    code = main(["simulate", "--model", "tiny-gpt", "--cluster", "dgx-a100-hdr", "--tp", "2", "--pp", "2",
                 "--dp", "2", "--gbs", "8", "--json", "--trace", str(trace_path), "--gantt", str(gantt_path)])
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data) >= ISSUE_KEYS
    assert "traceEvents" in json.loads(trace_path.read_text())
    assert gantt_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_errors_are_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    """A layout that does not fit the GPU count is one error line and exit code 2."""
    code = main(["simulate", "--model", "tiny-gpt", "--cluster", "dgx-a100-hdr", "--gpus", "8", "--tp", "3",
                 "--pp", "2", "--gbs", "8"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert err[-1].startswith("simgrid simulate: error: --gpus 8 is not divisible by tp * pp = 3 * 2")


def test_cli_help_has_an_example(capsys: pytest.CaptureFixture[str]) -> None:
    """--help ends with an example command line."""
    with pytest.raises(SystemExit):
        main(["simulate", "--help"])
    assert "simgrid simulate --model gpt3-175b" in capsys.readouterr().out


def test_simulation_errors_are_simgrid_errors() -> None:
    """SimulationError is caught by the CLI's SimgridError handler."""
    assert issubclass(SimulationError, SimgridError)
