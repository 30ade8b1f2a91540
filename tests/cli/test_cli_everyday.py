"""Everyday CLI use: one flag set, no abbreviations, saved and imported schedules, warnings, help."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from simgrid.cli.main import build_parser, main
from simgrid.ir import Action, actions_to_csv
from simgrid.schedules.pipeline import pipeline_order

SIM = ["simulate", "--model", "gpt2-small", "--cluster", "dgx-a100-hdr"]


def _json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_every_parser_refuses_abbreviations_and_gpu_never_means_gpus(capsys: pytest.CaptureFixture[str]) -> None:
    """allow_abbrev is off on the top parser and every sub-command; --gpu on simulate says what it is."""
    parser = build_parser()
    assert not parser.allow_abbrev
    assert all(not sub.allow_abbrev for sub in _subparsers(parser).values())
    with pytest.raises(SystemExit):
        main([*SIM, "--gp", "8"])
    assert "unrecognized arguments: --gp 8" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main([*SIM, "--gpu", "a100-80gb-sxm"])
    assert exc.value.code == 2
    assert "--gpu a100-80gb-sxm names one GPU profile" in capsys.readouterr().err


def test_every_sub_command_help_has_a_description_and_an_example() -> None:
    """`simgrid COMMAND --help` explains the command and ends with at least one example line."""
    for name, sub in _subparsers(build_parser()).items():
        assert sub.description and len(sub.description) > 30, name
        assert sub.epilog and "example" in sub.epilog and "simgrid " in sub.epilog, name


def test_simulate_memory_and_sweep_share_the_layout_and_hardware_flags() -> None:
    """The same layout flags (sweep's take comma lists) and --cluster/--gpus on all three commands."""
    subs = _subparsers(build_parser())
    layout = {"--tp", "--pp", "--cp", "--dp", "--vpp", "--zero", "--mbs", "--gbs", "--schedule", "--recompute",
              "--sequence-parallel", "--flash-attention", "--optimizer", "--precision", "--offload", "--dp-mode",
              "--no-overlap-grad-reduce", "--bucket-mb", "--cluster", "--gpus"}
    for name in ("simulate", "memory", "sweep"):
        assert layout <= set(subs[name]._option_string_actions), name
    assert subs["sweep"].parse_args(["--model", "m", "--cluster", "c", "--gpus", "8", "--gbs", "8", "--tp", "1,2",
                                     "--schedule", "1f1b,dualpipev", "--sequence-parallel"]).tp == (1, 2)


def test_sweep_searches_the_listed_degrees_and_schedules(capsys: pytest.CaptureFixture[str]) -> None:
    """--tp 1,2 --pp 2 --schedule 1f1b,dualpipev tries exactly those; fixed flags (precision) apply to all."""
    out = _json(capsys, ["sweep", "--model", "tiny-gpt", "--cluster", "dgx-a100-hdr", "--gpus", "4", "--gbs", "8",
                         "--tp", "1,2", "--pp", "2", "--schedule", "1f1b,dualpipev", "--zero", "0",
                         "--recompute", "none", "--mbs", "1", "--precision", "fp32", "--workers", "1", "--top", "50"])
    assert {(r["tp"], r["pp"], r["schedule"]) for r in out} == {(t, 2, s) for t in (1, 2) for s in ("1f1b", "dualpipev")}


def test_simulate_a_saved_program_gives_the_same_step(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`simgrid program --out F.json` then `simgrid simulate --program F.json` reproduces the step the
    flags give; model flags next to --program are refused."""
    flags = ["--tp", "2", "--pp", "2", "--gbs", "8", "--schedule", "interleaved-zb", "--vpp", "2"]
    direct = _json(capsys, [*SIM, *flags])
    assert main(["program", "--model", "gpt2-small", *flags, "--out", str(tmp_path / "p.json")]) == 0
    capsys.readouterr()
    saved = _json(capsys, ["simulate", "--program", str(tmp_path / "p.json"), "--cluster", "dgx-a100-hdr"])
    assert saved["step_time_s"] == pytest.approx(direct["step_time_s"])
    assert saved["layout"] == direct["layout"]
    assert main([*SIM, "--program", str(tmp_path / "p.json")]) == 2
    assert "carries its own model, layout and order; drop --model" in capsys.readouterr().err


def test_simulate_takes_the_pipeline_order_from_a_torch_csv(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A DualPipeV order written as torch's CSV (with idle cells and REDUCE_GRAD, as torch dumps them)
    simulates exactly like the dualpipev layout: pp, vpp, placement and m come from the file."""
    order = pipeline_order("dualpipev", 2, 5, 2)
    cells = [[None, *row, None] for row in order]
    cells[0].append(Action(0, "REDUCE_GRAD"))
    path = tmp_path / "dv.csv"
    path.write_text(actions_to_csv(cells), newline="")
    imported = _json(capsys, [*SIM, "--pipeline-csv", str(path)])
    native = _json(capsys, [*SIM, "--pp", "2", "--vpp", "2", "--schedule", "dualpipev", "--gbs", "5"])
    assert imported["step_time_s"] == pytest.approx(native["step_time_s"])
    assert (imported["layout"]["pp"], imported["layout"]["vpp"], imported["layout"]["global_batch_size"]) == (2, 2, 5)
    assert main([*SIM, "--pipeline-csv", str(path), "--pp", "4"]) == 2
    assert "--pp 4 disagrees with --pipeline-csv" in capsys.readouterr().err
    assert main([*SIM, "--pipeline-csv", str(path), "--gbs", "8"]) == 2
    assert "runs 5 micro-batches but the layout runs m = 8" in capsys.readouterr().err


def test_too_few_microbatches_warns_with_the_batch_that_fixes_it(capsys: pytest.CaptureFixture[str]) -> None:
    """pp 2 with the default global batch runs one micro-batch (a 50% bubble): the report warns and
    names --gbs 3 (m = 3 gives 1F1B's (p-1)/(m+p-1) = 25%); a layout with enough micro-batches does not."""
    out = _json(capsys, [*SIM, "--pp", "2"])
    assert out["bubble_fraction"] > 0.4
    assert any("only m = 1 micro-batch" in w and "--gbs 3 (m = 3)" in w for w in out["warnings"])
    assert _json(capsys, [*SIM, "--pp", "2", "--gbs", "16"])["warnings"] == []
    assert main([*SIM, "--pp", "2"]) == 0
    assert "warning" in capsys.readouterr().out


def test_hfu_below_mfu_is_explained(capsys: pytest.CaptureFixture[str]) -> None:
    """With FlashAttention at a long sequence the kernel skips masked tiles: the report says why HFU < MFU."""
    out = _json(capsys, [*SIM, "--flash-attention", "--seq", "8192"])
    assert out["hfu"] < out["mfu"]
    assert any("below MFU" in n and "causal mask" in n for n in out["notes"])


def test_memory_verdicts_keep_headroom_and_take_a_cluster(capsys: pytest.CaptureFixture[str]) -> None:
    """`simgrid memory` checks --cluster's GPU like --gpu, says tight near the edge, and --headroom-gib 0
    compares with the whole capacity."""
    base = ["memory", "--model", "llama2-7b", "--dp", "8", "--zero", "3", "--gbs", "8"]
    by_cluster = _json(capsys, [*base, "--cluster", "dgx-a100-hdr"])
    by_gpu = _json(capsys, [*base, "--gpu", "a100-80gb-sxm"])
    assert by_cluster["capacity_bytes"] == by_gpu["capacity_bytes"] and by_cluster["verdict"] == by_gpu["verdict"]
    total = by_gpu["total_bytes"]
    spare = by_gpu["capacity_bytes"] - total
    tight = _json(capsys, [*base, "--gpu", "a100-80gb-sxm", "--headroom-gib", str((spare - 2**30) / 2**30)])
    assert tight["verdict"] == "tight" and tight["fits"]
    assert main([*base, "--gpu", "a100-80gb-sxm", "--headroom-gib", str((spare - 2**30) / 2**30)]) == 0
    assert "fit     TIGHT" in capsys.readouterr().out
    assert main([*base, "--gpu", "a100-80gb-sxm", "--cluster", "dgx-a100-hdr"]) == 2
    assert "give one" in capsys.readouterr().err


def test_params_means_n(capsys: pytest.CaptureFixture[str]) -> None:
    """--params 7.5e9 builds 7.5e9 parameters to within the stated step."""
    out = _json(capsys, ["memory", "--params", "7.5e9"])
    assert abs(out["params"] - 7.5e9) < 2.4e6
    assert main(["memory", "--params", "7.5e9"]) == 0
    assert "7.50B parameters" in capsys.readouterr().out
