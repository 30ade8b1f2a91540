"""`simgrid sweep`: table and JSON output, CSV file, memory-drop account, flag errors."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from simgrid.cli.main import main
from simgrid.sweep import enumerate_layouts

TINY = ["--model", "tiny-gpt", "--cluster", "dgx-a100-hdr", "--gpus", "4", "--gbs", "8",
        "--recompute", "none", "--zero", "0", "--schedules", "1f1b", "--max-mbs", "2", "--workers", "1"]


def test_json_lists_the_issue_keys_best_first(capsys: pytest.CaptureFixture[str]) -> None:
    """--json prints a list of objects with exactly the contract keys (plus cp, the context-parallel degree,
    a layout field too), sorted by step time."""
    assert main(["sweep", *TINY, "--json", "--top", "5"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert 1 <= len(data) <= 5
    keys = {"dp", "tp", "pp", "vpp", "zero", "mbs", "schedule", "recompute", "cp", "step_time_s", "mfu",
            "peak_memory_bytes"}
    assert all(set(entry) == keys for entry in data)
    steps = [entry["step_time_s"] for entry in data]
    assert steps == sorted(steps)
    assert all(e["dp"] * e["tp"] * e["pp"] * e["cp"] == 4 for e in data)


def test_table_output_and_csv_cover_every_simulated_layout(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The text report counts layouts; --out writes one ranked CSV row per enumerated layout."""
    out = tmp_path / "sweep.csv"
    assert main(["sweep", *TINY, "--top", "3", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    # tiny-gpt: 4 GPUs, 1F1B, zero 0, mbs in {1, 2} dividing 8/dp: the enumeration is the brute-force truth.
    from simgrid.model import get_model
    from simgrid.sweep import SweepConstraints

    expected = enumerate_layouts(
        get_model("tiny-gpt"), 8, gpus=4, global_batch=8,
        constraints=SweepConstraints(recompute=("none",), zero_stages=(0,), schedules=("1f1b",), max_mbs=2),
    )
    assert f"valid layouts: {len(expected)}" in text
    assert "step s" in text and "MFU" in text
    df = pd.read_csv(out)
    assert len(df) == len(expected)
    assert list(df["step_time_s"]) == sorted(df["step_time_s"])


def test_layouts_that_cannot_fit_are_reported_with_the_dominant_category(capsys: pytest.CaptureFixture[str]) -> None:
    """gpt3-175b on 8 GPUs without ZeRO-3: 175e9 params x 16 B/8 GPUs = 350 GB > 80 GB, so nothing fits."""
    code = main(["sweep", "--model", "gpt3-175b", "--cluster", "dgx-a100-hdr", "--gpus", "8", "--gbs", "8",
                 "--recompute", "full", "--zero", "0", "--schedules", "1f1b", "--mbs", "1", "--workers", "1"])
    captured = capsys.readouterr()
    assert code == 1
    assert "simulated: 0" in captured.out
    line = next(li for li in captured.out.splitlines() if li.startswith("dropped for memory"))
    assert "dominant in" in line
    assert "no layout could be simulated" in captured.err


@pytest.mark.parametrize(
    ("flags", "match"),
    [
        (["--schedules", "1f1b,warp"], "use a comma-separated subset of"),
        (["--zero", "5"], "use a comma-separated subset of"),
        (["--mbs", "0"], "must be a positive integer"),
        (["--tp-comm-overlap", "maybe"], "argument --tp-comm-overlap: invalid choice: 'maybe'"),
        (["--overlap-param-gather", "yes"], "argument --overlap-param-gather: invalid choice: 'yes'"),
    ],
)
def test_bad_flags_are_one_line_errors(flags: list[str], match: str, capsys: pytest.CaptureFixture[str]) -> None:
    """argparse rejects malformed constraint lists with a message naming the value."""
    with pytest.raises(SystemExit) as exc:
        main(["sweep", *TINY, *flags])
    assert exc.value.code == 2
    assert match in capsys.readouterr().err


def test_contradicting_constraints_are_a_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    """--tp 8 --max-tp 4 is refused by SweepConstraints; main prints one line and exits 2."""
    assert main(["sweep", *TINY, "--tp", "8", "--max-tp", "4"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert "tp = 8 and max_tp = 4 contradict" in err


def test_help_has_an_example(capsys: pytest.CaptureFixture[str]) -> None:
    """--help shows an example command line."""
    with pytest.raises(SystemExit):
        main(["sweep", "--help"])
    assert "simgrid sweep --model gpt3-175b" in capsys.readouterr().out


def test_reduce_dtype_and_zero_impl_reach_every_searched_layout(capsys: pytest.CaptureFixture[str]) -> None:
    """--reduce-dtype fp32 doubles the data-parallel gradient bytes of the searched ZeRO-1 layouts (it was
    accepted and then ignored): the ranked steps differ from the default's; with --zero-impl fsdp2 kept too,
    ZeRO-3 layouts with fp32 are valid and ranked."""
    flags = ["--model", "tiny-gpt", "--cluster", "dgx-a100-hdr", "--gpus", "4", "--gbs", "8", "--recompute", "none",
             "--schedules", "1f1b", "--max-mbs", "2", "--workers", "1", "--dp", "4", "--json", "--top", "3"]
    assert main(["sweep", *flags, "--zero", "1"]) == 0
    default = json.loads(capsys.readouterr().out)
    assert main(["sweep", *flags, "--zero", "1", "--reduce-dtype", "fp32"]) == 0
    fp32 = json.loads(capsys.readouterr().out)
    assert [e["step_time_s"] for e in fp32] != [e["step_time_s"] for e in default]
    assert main(["sweep", *flags, "--zero", "1,3", "--reduce-dtype", "fp32", "--zero-impl", "fsdp2"]) == 0
    assert any(e["zero"] == 3 for e in json.loads(capsys.readouterr().out))


OVERLAPS = ["--model", "tiny-gpt", "--cluster", "dgx-a100-hdr", "--gpus", "4", "--gbs", "8", "--recompute", "none",
            "--schedules", "1f1b", "--mbs", "2", "--workers", "1", "--exhaustive", "--no-progress"]


def test_tp_comm_overlap_both_reaches_the_simulated_layouts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--tp-comm-overlap both simulates an overlapped twin of every tp > 1 layout with sequence parallelism
    (and only those): the CSV names the setting, the twins' steps differ (TE's chunked pipelines were
    built), the table marks them "tpo", and the JSON gains the key."""
    out = tmp_path / "sweep.csv"
    flags = [*OVERLAPS, "--zero", "0", "--sequence-parallel", "both", "--tp-comm-overlap", "both"]
    assert main(["sweep", *flags, "--top", "50", "--out", str(out)]) == 0
    assert " tpo " in capsys.readouterr().out
    df = pd.read_csv(out)
    on = df[df["tp_comm_overlap"]]
    applies = df[(df["tp"] > 1) & df["sequence_parallel"] & ~df["tp_comm_overlap"]]
    assert len(on) == len(applies) > 0 and ((on["tp"] > 1) & on["sequence_parallel"]).all()
    keys = ["dp", "tp", "pp", "mbs", "sequence_parallel"]
    twins = on.merge(df[~df["tp_comm_overlap"]], on=keys, suffixes=("_on", "_off"))
    assert len(twins) == len(on)
    assert (twins["step_time_s_on"] != twins["step_time_s_off"]).all()
    assert main(["sweep", *flags, "--json", "--top", "50"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {e["tp_comm_overlap"] for e in data} == {False, True} and "overlap_param_gather" not in data[0]


def test_overlap_param_gather_on_sets_it_on_zero1_layouts_only(tmp_path: Path) -> None:
    """--overlap-param-gather on turns the deferred gather on for every ZeRO-1 layout and leaves ZeRO 0 as it
    was (not refused); the ZeRO-1 steps differ from a run with the flag off (small buckets: with one bucket
    the first forward op waits for the whole gather either way)."""
    flags = [*OVERLAPS, "--zero", "0,1", "--dp", "2,4", "--bucket-mb", "0.05"]
    on_csv, off_csv = tmp_path / "on.csv", tmp_path / "off.csv"
    assert main(["sweep", *flags, "--overlap-param-gather", "on", "--out", str(on_csv)]) == 0
    assert main(["sweep", *flags, "--out", str(off_csv)]) == 0
    on, off = pd.read_csv(on_csv), pd.read_csv(off_csv)
    assert len(on) == len(off)
    assert (on["overlap_param_gather"] == (on["zero"] == 1)).all() and (on["zero"] == 1).any()
    assert not off["overlap_param_gather"].any()
    keys = ["dp", "tp", "pp", "zero", "mbs"]
    pairs = on.merge(off, on=keys, suffixes=("_on", "_off"))
    zero1 = pairs[pairs["zero"] == 1]
    assert (zero1["step_time_s_on"] != zero1["step_time_s_off"]).all()
    zero0 = pairs[pairs["zero"] == 0]
    assert (zero0["step_time_s_on"] == zero0["step_time_s_off"]).all()
