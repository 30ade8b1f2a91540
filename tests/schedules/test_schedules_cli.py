"""`simgrid schedule`, `simgrid program` and `simgrid validate-program` from the command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simgrid.cli.main import main
from simgrid.ir.jsonio import load_program
from simgrid.ir.torch_csv import actions_from_csv


def test_schedule_grid_shows_ranks_bubbles_and_idle_fraction(capsys: pytest.CaptureFixture[str]) -> None:
    """The default grid has one row per rank and the textbook idle fraction 3/11 for pp 4, m 8."""
    assert main(["schedule", "--schedule", "1f1b", "--pp", "4", "--microbatches", "8"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("rank")]
    assert len(rows) == 4 and rows[3].split()[2] == "..."
    assert "idle fraction 0.273" in out


def test_schedule_torch_csv_reads_back_as_the_order(capsys: pytest.CaptureFixture[str]) -> None:
    """torch-csv is torch's compute-only format: one row per rank in the action grammar."""
    assert main(["schedule", "--schedule", "zbv", "--pp", "2", "--microbatches", "3", "--format", "torch-csv"]) == 0
    rows = actions_from_csv(capsys.readouterr().out)
    assert len(rows) == 2 and str(rows[0][0]) == "0F0" and {a.stage for a in rows[1]} == {1, 2}


def test_schedule_json_and_csv_write_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--out writes the compute-only program JSON (loadable) or our op CSV."""
    path = tmp_path / "order.json"
    assert main(["schedule", "--schedule", "gpipe", "--pp", "2", "--microbatches", "2", "--format", "json",
                 "--out", str(path)]) == 0
    program = load_program(path)
    assert program.world_size == 2 and program.num_ops == 8
    assert "wrote json order of gpipe" in capsys.readouterr().out
    csv_path = tmp_path / "order.csv"
    assert main(["schedule", "--schedule", "gpipe", "--pp", "2", "--microbatches", "2", "--format", "csv",
                 "--out", str(csv_path)]) == 0
    assert csv_path.read_text().splitlines()[0].startswith("F stage=0 mb=0")


def test_schedule_rule_violation_is_one_line_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    """Interleaving with m split into unequal rounds: one-line error naming the rule, exit code 2."""
    code = main(["schedule", "--schedule", "interleaved-1f1b", "--pp", "4", "--vpp", "2", "--microbatches", "9"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "rounds of equal size" in err


def test_program_then_validate_program(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`program` writes a full program; `validate-program` summarises ranks, ops, groups and dry run."""
    path = tmp_path / "tiny.json"
    assert main(["program", "--model", "tiny-gpt", "--dp", "2", "--tp", "2", "--pp", "2", "--gbs", "8",
                 "--out", str(path)]) == 0
    assert load_program(path).world_size == 8
    capsys.readouterr()
    assert main(["validate-program", str(path)]) == 0
    out = capsys.readouterr().out
    assert "ranks     8" in out and "SEND 32" in out and "dry run   makespan" in out and "valid     yes" in out


def test_validate_program_reports_a_broken_file_in_one_line(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """A program whose RECV lost its SEND fails validation with exit 2 and a one-line message."""
    path = tmp_path / "tiny.json"
    main(["program", "--model", "tiny-gpt", "--pp", "2", "--gbs", "2", "--out", str(path)])
    data = json.loads(path.read_text())
    data["ranks"][0] = [line for line in data["ranks"][0] if not line.startswith("SEND")]
    path.write_text(json.dumps(data))
    capsys.readouterr()
    assert main(["validate-program", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "failed validation" in err
    (tmp_path / "junk.json").write_text("{not json")
    assert main(["validate-program", str(tmp_path / "junk.json")]) == 2
    assert "not valid JSON" in capsys.readouterr().err


def test_help_has_examples(capsys: pytest.CaptureFixture[str]) -> None:
    """Each command's --help shows an example."""
    for command in ("schedule", "program", "validate-program"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        assert "example" in capsys.readouterr().out


def test_pipeline_csv_is_drawn_and_written_back_byte_for_byte(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`schedule --pipeline-csv F` draws a torch CSV (transfers, REDUCE_GRAD and idle cells included) in
    unit time, and `--format torch-csv` writes the very bytes back."""
    dump = "0F0,0SEND_F0,,0RECV_B0,0B0,0REDUCE_GRAD\r\n,1RECV_F0,1F0,1B0,1SEND_B0,1REDUCE_GRAD\r\n"
    src = tmp_path / "t.csv"
    src.write_bytes(dump.encode())
    assert main(["schedule", "--pipeline-csv", str(src)]) == 0
    grid = capsys.readouterr().out
    assert "rank 1" in grid and "makespan 6 units" in grid
    out = tmp_path / "back.csv"
    assert main(["schedule", "--pipeline-csv", str(src), "--format", "torch-csv", "--out", str(out)]) == 0
    assert out.read_bytes() == dump.encode()
    assert main(["schedule", "--pipeline-csv", str(src), "--pp", "2"]) == 2
    assert "drop --schedule, --pp and --microbatches" in capsys.readouterr().err
