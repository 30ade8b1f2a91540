"""`simgrid serve`: the report, JSON, load tables, capacity search, files written, and one-line errors (exit 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simgrid.cli.main import main

BASE = ["serve", "--model", "llama2-7b", "--cluster", "dgx-a100-hdr"]
SMALL = ["--requests", "40", "--prompt-tokens", "100-400", "--output-tokens", "10-60"]


def test_report_of_one_rate(capsys: pytest.CaptureFixture[str]) -> None:
    """The text report names the deployment and prints TTFT/TPOT/E2E percentiles and throughput per GPU."""
    assert main([*BASE, "--tp", "2", "--rate", "4", *SMALL]) == 0
    out = capsys.readouterr().out
    assert "2 GPUs = tp 2 x pp 1 x 1 replica(s)" in out
    for line in ("TTFT ", "TPOT ", "end-to-end ", "throughput ", "KV cache ", "GPU busy "):
        assert line in out


def test_json_contract(capsys: pytest.CaptureFixture[str]) -> None:
    """--json has the latency percentiles, per-GPU throughput (total / GPUs) and the KV figures."""
    assert main([*BASE, "--replicas", "2", "--rate", "4", *SMALL, "--kv-dtype", "fp8", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc["ttft_s"]) == {"p50", "p90", "p99", "mean"}
    assert doc["output_tokens_per_s_per_gpu"] == pytest.approx(doc["output_tokens_per_s"] / 2)
    assert doc["layout"] == {"tp": 1, "pp": 1, "replicas": 2}
    assert doc["kv_bytes_per_token_per_gpu"] == 32 * 2 * 32 * 128 * 1  # fp8: one byte per element
    assert doc["rate_per_s"] == 4 and doc["requests"] == 40


def test_load_sweep_table_plot_and_records(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Several rates print one row each (with the targets each misses); the plots and records are written."""
    load, kv, rec = tmp_path / "load.png", tmp_path / "kv.png", tmp_path / "rec.csv"
    assert main([*BASE, "--rate", "2,64", *SMALL, "--tpot-p99", "0.015", "--latency-plot", str(load),
                 "--kv-plot", str(kv), "--records", str(rec)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[0] == "rate/s" and len(lines) == 3
    assert lines[1].endswith("met") and "tpot_p99" in lines[2]
    assert load.stat().st_size > 0 and kv.stat().st_size > 0
    assert rec.read_text().splitlines()[0].startswith("id,replica,arrival_s")
    assert len(rec.read_text().splitlines()) == 41


def test_trace_file_replay(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A trace is served as recorded; its arrivals appear in the report."""
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,100,5\n0.5,200,8\n")
    assert main([*BASE, "--trace", str(trace), "--batching", "static"]) == 0
    out = capsys.readouterr().out
    assert f"trace {trace}" in out and "2 requests" in out and "static batching" in out


def test_capacity_search_from_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--gpus with targets searches every layout and names the best; --json has it too."""
    plot = tmp_path / "cap.png"
    assert main([*BASE, "--gpus", "2", "--tpot-p99", "0.008", *SMALL, "--capacity-plot", str(plot)]) == 0
    out = capsys.readouterr().out
    assert "best           tp2 pp1 x1" in out and plot.stat().st_size > 0
    assert main([*BASE, "--tp", "2", "--tpot-p99", "0.008", *SMALL, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["best"]["layout"] == {"tp": 2, "pp": 1, "replicas": 1} and len(doc["layouts"]) == 1


@pytest.mark.parametrize(("argv", "message"), [
    (["--rate", "-1"], "--rate '-1' must be > 0 requests/s"),
    (["--rate", "2,0"], "--rate '0' must be > 0"),
    ([], "give an arrival rate"),
    (["--rate", "1", "--prompt-tokens", "4000", "--output-tokens", "200"], "longer than the model's context of 4096"),
    (["--rate", "1", "--kv-budget-gib", "0.01"], "KV budget too small for one request"),
    (["--gpus", "4", "--rate", "1"], "--gpus searches layouts for latency targets"),
    (["--gpus", "4", "--tp", "2", "--ttft-p90", "1"], "drop --tp"),
    (["--rate", "1", "--tp", "3"], "tp = 3 does not divide the 32 attention heads"),
    (["--rate", "1", "--memory-utilization", "2"], "memory_utilization = 2.0 must be in"),
    (["--rate", "1", "--prompt-tokens", "9-3"], "must be positive token counts with LOW <= HIGH"),
    (["--rate", "1", "--dtype", "fp8"], "no peak rate for dtype 'fp8'"),
])
def test_bad_input_is_one_line_and_exit_2(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Bad rates, lengths, budgets and layouts: exit status 2 and the reason on stderr, no traceback."""
    with pytest.raises(SystemExit) as exc:
        raise SystemExit(main([*BASE, *argv]))
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "Traceback" not in err and err.count("\n") == 0


def test_empty_trace_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A trace with a header and no rows: exit 2, one line."""
    trace = tmp_path / "empty.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n")
    assert main([*BASE, "--trace", str(trace)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no requests" in err
