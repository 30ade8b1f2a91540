"""`simgrid plot`: draw saved traces (simgrid or Chrome JSON) and sweep CSVs; one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from simgrid.cli.cmd_plot import trace_from_chrome
from simgrid.cli.main import main
from simgrid.trace import Trace, TraceRow


def _trace() -> Trace:
    rows = [
        TraceRow(0, "compute", "0F0", "F", "compute", 0.0, 1.0, 0, 1.0, 0, 0),
        TraceRow(0, "compute", "0B0", "B", "compute", 2.0, 4.0, 0, 2.0, 0, 0),
        TraceRow(1, "compute", "1F0", "F", "compute", 1.0, 2.0, 0, 1.0, 1, 0),
        TraceRow(1, "compute", "1B0", "B", "compute", 2.0, 3.0, 0, 2.0, 1, 0),
        TraceRow(0, "comm:tp", "ar", "all_reduce", "tp", 0.5, 0.8, 64),
    ]
    return Trace(rows, {"world_size": 2})


def _sweep_csv(path: Path) -> Path:
    pd.DataFrame([
        {"dp": 2, "tp": 2, "pp": 1, "vpp": 1, "zero": 0, "mbs": 1, "schedule": "none", "recompute": "none",
         "step_time_s": 1.0, "tokens_per_s": 10.0, "mfu": 0.4, "peak_memory_bytes": 2**30, "fits": True},
        {"dp": 1, "tp": 2, "pp": 2, "vpp": 1, "zero": 0, "mbs": 1, "schedule": "1f1b", "recompute": "none",
         "step_time_s": 2.0, "tokens_per_s": 5.0, "mfu": 0.2, "peak_memory_bytes": 2**29, "fits": True},
    ]).to_csv(path, index=False)
    return path


def test_gantt_from_a_simgrid_trace_file(tmp_path: Path) -> None:
    """A Trace.save file is drawn to the requested PNG."""
    src = _trace().save(tmp_path / "t.json")
    out = tmp_path / "g.png"
    assert main(["plot", str(src), "--kind", "gantt", "--out", str(out)]) == 0
    assert out.read_bytes()[:4] == b"\x89PNG"


def test_chrome_trace_reads_back_into_the_same_rows(tmp_path: Path) -> None:
    """to_chrome_trace -> trace_from_chrome keeps rank, stream, kind, stage, micro-batch and times."""
    original = _trace()
    back = trace_from_chrome(original.to_chrome_trace())
    key = lambda r: (r.rank, r.stream, r.kind, r.stage, r.microbatch, round(r.start_s, 9), round(r.end_s, 9))  # noqa: E731
    assert sorted(map(key, back.rows)) == sorted(map(key, original.rows))
    assert {r.purpose for r in back.rows if r.kind == "all_reduce"} == {"tp"}
    path = tmp_path / "chrome.json"
    original.to_chrome_trace(path)
    assert main(["plot", str(path), "--out", str(tmp_path / "c.svg")]) == 0


def test_sweep_csv_ranking_and_heatmap(tmp_path: Path) -> None:
    """A sweep CSV draws as a ranking (default) and as a heat map; default output name is FILE_KIND.png."""
    csv = _sweep_csv(tmp_path / "sweep.csv")
    assert main(["plot", str(csv)]) == 0
    assert (tmp_path / "sweep_ranking.png").exists()
    assert main(["plot", str(csv), "--kind", "heatmap", "--out", str(tmp_path / "h.png")]) == 0
    assert (tmp_path / "h.png").exists()


@pytest.mark.parametrize(
    ("content", "name", "args", "match"),
    [
        (None, "missing.json", [], "does not exist"),
        ("{", "bad.json", [], "not valid JSON"),
        ('{"x": 1}', "other.json", [], "neither a simgrid trace"),
        ("a,b\n1,2\n", "bad.csv", [], "lacks column"),
        ("a,b\n1,2\n", "s.csv", ["--kind", "gantt"], "--kind gantt needs a trace .json"),
        (None, "t.json", ["--kind", "memory"], "holds no memory timeline"),
        (None, "t.json", ["--out", "x.jpg"], "use one of .png, .svg"),
    ],
)
def test_bad_inputs_are_one_line_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | None,
                                       name: str, args: list[str], match: str) -> None:
    """Missing, malformed or mismatched files give exit 2 and one line naming the problem."""
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    elif name == "t.json":
        _trace().save(path)
    out_args = [a if a != "x.jpg" else str(tmp_path / "x.jpg") for a in args]
    assert main(["plot", str(path), *out_args]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err
    assert match in err


def test_memory_timeline_from_trace_meta(tmp_path: Path) -> None:
    """A trace whose meta carries memory_timeline {rank: {times_s, total_bytes}} draws memory over time."""
    trace = _trace()
    trace.meta["memory_timeline"] = {"0": {"times_s": [0, 1, 2], "total_bytes": [1, 5, 2]},
                                     "1": {"times_s": [0, 2], "total_bytes": [3, 0]}}
    src = trace.save(tmp_path / "m.json")
    assert json.loads(src.read_text())["meta"]["memory_timeline"]["0"]["total_bytes"] == [1, 5, 2]
    assert main(["plot", str(src), "--kind", "memory", "--out", str(tmp_path / "m.png")]) == 0


def test_saved_traces_reproduce_the_runs_metrics_and_name_it_in_the_title(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A simulated step saved as a simgrid trace or as Chrome JSON carries its model, layout and metrics
    inputs: reading either back gives the run's own bubble, MFU and step time (the Chrome file used to
    drop the exposed part of each WAIT, which turned exposed communication into bubble), and
    `simgrid plot` titles the chart with the model and the layout."""
    import matplotlib.pyplot as plt

    from simgrid import Layout, simulate
    from simgrid.cli.cmd_plot import load_any_trace
    from simgrid.metrics import metrics_from_trace

    result = simulate("gpt2-small", "dgx-a100-hdr", Layout(dp=2, tp=2, pp=2, global_batch_size=16))
    assert result.metrics.bubble_fraction > 0 and any(r.exposed_s > 0 for r in result.trace.timing_rows)
    chrome, saved = tmp_path / "chrome.json", tmp_path / "saved.json"
    result.trace.to_chrome_trace(chrome)
    result.trace.save(saved)
    for path in (chrome, saved):
        back = metrics_from_trace(load_any_trace(path))
        assert back is not None
        for field in ("bubble_fraction", "mfu", "hfu", "step_time_s", "tokens_per_s"):
            assert getattr(back, field) == pytest.approx(getattr(result.metrics, field), rel=1e-9), field
        assert back.exposed_comm_s == pytest.approx(result.metrics.exposed_comm_s)
    created: list[object] = []
    original = plt.Figure.savefig

    def keep(fig: object, *args: object, **kwargs: object) -> None:
        created.append(fig)
        original(fig, *args, **kwargs)  # type: ignore[arg-type]

    plt.Figure.savefig = keep  # type: ignore[method-assign]
    try:
        assert main(["plot", str(chrome), "--out", str(tmp_path / "g.png")]) == 0
    finally:
        plt.Figure.savefig = original  # type: ignore[method-assign]
    err = capsys.readouterr().err
    assert f"bubble {result.metrics.bubble_fraction:.1%}" in err
    title = created[0].axes[0].get_title()  # type: ignore[attr-defined]
    assert title.startswith("gpt2-small, dp 2, tp 2, pp 2, mbs 1, gbs 16 (m = 8), 1f1b")
    assert f"bubble {result.metrics.bubble_fraction:.1%}" in title


def test_a_trace_without_a_run_description_has_no_metrics() -> None:
    """Hand-made rows carry no model or layout: metrics_from_trace says None rather than guessing."""
    from simgrid.metrics import metrics_from_trace

    assert metrics_from_trace(_trace()) is None
