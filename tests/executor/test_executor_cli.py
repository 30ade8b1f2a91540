"""``simgrid-exec``: doctor's checks and fixes, and clear one-line errors for bad input."""

from __future__ import annotations

import socket

import pytest

pytest.importorskip("torch")

from executor.cli import doctor_checks, main
from executor.launch import free_port


def test_doctor_reports_gloo_and_a_busy_master_port(monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """gloo is found; a MASTER_PORT already bound fails with what to do; exit status 1."""
    port = free_port()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind(("127.0.0.1", port))
        busy.listen()
        monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
        monkeypatch.setenv("MASTER_PORT", str(port))
        checks = {name: (ok, detail) for name, ok, detail in doctor_checks()}
        assert checks["gloo backend"][0]
        ok, detail = checks[f"MASTER_PORT {port}"]
        assert not ok and "another process uses it; pick another port" in detail
        assert main(["doctor"]) == 1
    assert f"[FAIL] MASTER_PORT {port}" in capsys.readouterr().out


def test_doctor_flags_an_unresolvable_master_addr(monkeypatch: pytest.MonkeyPatch) -> None:
    """A host name that does not resolve is a failed check that says to fix MASTER_ADDR."""
    monkeypatch.setenv("MASTER_ADDR", "no-such-host.invalid")
    monkeypatch.delenv("MASTER_PORT", raising=False)
    checks = {name: (ok, detail) for name, ok, detail in doctor_checks()}
    ok, detail = checks["MASTER_ADDR no-such-host.invalid"]
    assert not ok and "set MASTER_ADDR" in detail


def test_validate_without_profile_says_to_calibrate(capsys: pytest.CaptureFixture[str]) -> None:
    """validate with a missing profile exits 2 and names the command that writes one."""
    assert main(["validate", "--dp", "2", "--profile", "/nonexistent/p.toml"]) == 2
    assert "run `simgrid-exec calibrate --out /nonexistent/p.toml` first" in capsys.readouterr().err


def test_run_with_an_invalid_layout_fails_before_launch(capsys: pytest.CaptureFixture[str]) -> None:
    """tp = 3 does not divide tiny-gpt's 4 heads: exit 2 with the layout rule, no process started."""
    assert main(["run", "--tp", "3"]) == 2
    assert "tp = 3 does not divide the 4 attention heads" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_run_a_saved_program_file_and_write_its_trace(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    """`run --program F.json --trace T --json` runs the saved Program and writes a Perfetto trace."""
    import json

    from simgrid.ir.jsonio import save_program
    from simgrid.layout.spec import Layout
    from simgrid.model.presets import get_model
    from simgrid.schedules import build_program

    program = build_program(get_model("tiny-gpt"), Layout(pp=2, global_batch_size=2, precision="fp32"))
    save_program(program, tmp_path / "p.json")
    trace = tmp_path / "trace.json"
    assert main(["run", "--program", str(tmp_path / "p.json"), "--steps", "2", "--trace", str(trace),
                 "--json"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["world_size"] == 2 and len(summary["losses"]) == 2
    assert summary["losses"][1] < summary["losses"][0]
    events = json.loads(trace.read_text())
    assert events["traceEvents"]


def test_version_help_and_no_abbreviations(capsys: pytest.CaptureFixture[str]) -> None:
    """`simgrid-exec --version` prints the version; every sub-command has a description and an example;
    abbreviated options are refused (`--step` is not `--steps`)."""
    import argparse

    from executor.cli import _parser
    from simgrid import __version__

    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0 and capsys.readouterr().out.strip() == f"simgrid-exec {__version__}"
    parser = _parser()
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert not parser.allow_abbrev and all(not p.allow_abbrev for p in subs.values())
    for name, sub in subs.items():
        assert sub.description and sub.epilog and "simgrid-exec " in sub.epilog, name
    with pytest.raises(SystemExit):
        main(["run", "--step", "2"])
    assert "unrecognized arguments: --step 2" in capsys.readouterr().err


def test_run_takes_the_order_of_a_torch_csv_and_marks_the_warm_up(tmp_path, capsys: pytest.CaptureFixture[str],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """`run --pipeline-csv F.csv` runs the file's order (an interleaved zero-bubble order on 2 ranks here);
    step 0 is marked as warm-up, in the text and in the JSON."""
    import json

    from simgrid.ir import actions_to_csv
    from simgrid.schedules.pipeline import pipeline_order

    path = tmp_path / "zb.csv"
    path.write_text(actions_to_csv(pipeline_order("interleaved-zb", 2, 4, 2)), newline="")
    assert main(["run", "--pipeline-csv", str(path), "--precision", "fp32", "--steps", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "(warm-up" in lines[0] and "warm-up" not in lines[1]
    assert lines[-1].startswith("step time") and "(step 1, after the warm-up)" in lines[-1]
    import executor.runner
    from executor.runner import RunResult

    def fake_run(program: object, **kwargs: object) -> RunResult:  # the JSON summary, without a second launch
        return RunResult(losses=[2.0, 1.0, 0.5], step_times_s=[9.0, 1.0, 3.0])

    monkeypatch.setattr(executor.runner, "run_program", fake_run)
    assert main(["run", "--pipeline-csv", str(path), "--precision", "fp32", "--steps", "3", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["warmup_steps"] == 1 and summary["world_size"] == 2 and summary["measured_step_s"] == 2.0
    assert main(["run", "--pipeline-csv", str(path), "--pp", "4"]) == 2
    assert "--pp 4 disagrees with --pipeline-csv" in capsys.readouterr().err


def test_run_with_tp_comm_overlap_is_refused_before_launch(capsys: pytest.CaptureFixture[str]) -> None:
    """--tp-comm-overlap is a simulator setting the executor does not run: exit 2, one line saying what to drop."""
    assert main(["run", "--tp", "2", "--sequence-parallel", "--tp-comm-overlap"]) == 2
    err = capsys.readouterr().err
    assert "executor: tp_comm_overlap = true" in err and "without --tp-comm-overlap" in err
    assert len(err.strip().splitlines()) == 1


def test_run_with_p2p_scatter_gather_is_refused_before_launch(capsys: pytest.CaptureFixture[str]) -> None:
    """--p2p-scatter-gather (pipeline tensors as 1/tp slices, all-gathered over tp) is priced, not run: exit 2."""
    assert main(["run", "--tp", "2", "--pp", "2", "--gbs", "4", "--p2p-order", "megatron-batched",
                 "--p2p-scatter-gather"]) == 2
    err = capsys.readouterr().err
    assert "executor: p2p_scatter_gather = true" in err and "without --p2p-scatter-gather" in err
    assert len(err.strip().splitlines()) == 1


def test_run_with_overlap_param_gather_is_refused_before_launch(capsys: pytest.CaptureFixture[str]) -> None:
    """--overlap-param-gather (ZeRO-1 gathers deferred to the next step) is simulator-only: exit 2, one line."""
    assert main(["run", "--dp", "2", "--zero", "1", "--overlap-param-gather"]) == 2
    err = capsys.readouterr().err
    assert "executor: overlap_param_gather = true" in err and "without --overlap-param-gather" in err
    assert len(err.strip().splitlines()) == 1


def test_run_with_fp8_is_refused_before_launch(capsys: pytest.CaptureFixture[str]) -> None:
    """--fp8 (Transformer Engine fp8 autocast) is simulator-only: exit 2, one line saying what to drop."""
    assert main(["run", "--dp", "2", "--fp8", "delayed"]) == 2
    err = capsys.readouterr().err
    assert "executor: fp8_recipe = 'delayed'" in err and "--fp8 none" in err
    assert len(err.strip().splitlines()) == 1
