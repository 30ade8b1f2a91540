"""benchmarks/gpu_accuracy.py without a GPU: it refuses to measure (exit 2, one line), and --dry-run builds
every case's programs, datasheet and calibrated predictions and the tables with empty measured columns."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest
from script_modules import load_benchmark

torch = pytest.importorskip("torch")

from simgrid.layout.spec import Layout  # noqa: E402
from simgrid.model.presets import get_model  # noqa: E402
from simgrid.schedules import build_program  # noqa: E402
from simgrid.trace import TraceRow  # noqa: E402

pytestmark = [pytest.mark.torch]


def _load() -> ModuleType:
    return load_benchmark("gpu_accuracy", "gpu_accuracy_benchmark")


def test_cases_span_125m_to_2_7b_with_three_variants() -> None:
    """Four GPT-3 shapes from 126M to 2.65B parameters, each unfused, fused (SDPA) and fused with full recompute,
    on one GPU in bf16."""
    bench = _load()
    from simgrid.model import param_count

    sizes = sorted(param_count(get_model(m)) for m in bench.MODELS)
    assert len(sizes) == 4 and 1.2e8 < sizes[0] < 1.3e8 and 2.6e9 < sizes[-1] < 3.1e9
    cases = bench.cases(list(bench.MODELS), list(bench.VARIANTS))
    assert len(cases) == 12 and all(c.layout.world_size == 1 and c.layout.precision == "bf16" for c in cases)
    assert {(c.layout.flash_attention, c.layout.recompute) for c in cases} == {
        (False, "none"), (True, "none"), (True, "full")}


def test_without_cuda_it_exits_2_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    """No GPU, no --dry-run: one line naming what is needed and the dry run."""
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert _load().main(["--models", "gpt3-125m"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "needs a CUDA GPU" in err and "--dry-run" in err


def test_bad_flags_exit_2_naming_the_fix(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """An unknown variant, a missing calibrated profile and an unknown device each give one line and exit 2."""
    bench = _load()
    assert bench.main(["--dry-run", "--variants", "sdpa,fast"]) == 2
    assert "unknown ['fast']" in capsys.readouterr().err
    assert bench.main(["--dry-run", "--profile", str(tmp_path / "none.toml")]) == 2
    assert "simgrid-exec calibrate --device cuda" in capsys.readouterr().err
    assert bench.main(["--dry-run", "--device-name", "NVIDIA L4"]) == 2
    assert "--datasheet" in capsys.readouterr().err


def test_dry_run_predicts_every_case_on_both_profiles(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """--dry-run on an H200 name with a calibrated profile (here a copy of the datasheet cluster, so both
    predictions agree exactly): every case has a step prediction, per-op groups and MFU on both profiles, and
    the measured columns are empty."""
    from simgrid.hardware import load_cluster_spec, write_profile

    bench = _load()
    write_profile(load_cluster_spec("hgx-h200-ndr"), tmp_path / "cal.toml")
    out = tmp_path / "acc.json"
    code = bench.main(["--dry-run", "--device-name", "NVIDIA H200", "--models", "gpt3-125m,gpt3-350m",
                       "--profile", str(tmp_path / "cal.toml"), "--json", str(out)])
    assert code == 0
    text = capsys.readouterr().out
    assert "datasheet hgx-h200-ndr" in text and text.count("== gpt3-") == 6 and "summary" in text
    data = json.loads(out.read_text())
    assert data["environment"] == {"device": "NVIDIA H200"} and len(data["cases"]) == 6
    for case in data["cases"]:
        sheet, cal = case["predictions"]
        assert (sheet["label"], cal["label"]) == ("datasheet", "calibrated")
        assert sheet["step_s"] == pytest.approx(cal["step_s"]) and sheet["step_s"] > 0
        assert {"F attn", "B mlp", "OPT"} <= set(sheet["per_op_s"]) and case["measured_step_s"] is None


def test_per_op_groups_average_rows_over_the_programs_ops() -> None:
    """Row time per (kind, block type) is divided by the number of the program's ops in that group; deferred
    segment rows of an op count towards its group, rows of other kinds are ignored."""
    bench = _load()
    model = get_model("tiny-gpt")
    program = build_program(model, Layout(global_batch_size=1))
    rows = [TraceRow(0, "compute", "F stage=0 mb=0 chunk=0 blocks=1:2 flops=1", "F", "compute", 0.0, 0.004),
            TraceRow(0, "compute", "F stage=0 mb=0 chunk=0 blocks=3:4 flops=1  # deferred segment", "F", "compute",
                     0.004, 0.006),
            TraceRow(0, "compute", "OPT stage=-1 mb=-1 chunk=0 blocks=0:10", "OPT", "compute", 0.006, 0.016),
            TraceRow(0, "dp", "all_reduce", "all_reduce", "dp-grad", 0.0, 1.0)]
    per_op = bench.per_op_seconds(rows, program, model)
    assert per_op["F attn"] == pytest.approx(0.006 / model.num_layers)
    assert per_op["OPT"] == pytest.approx(0.010) and per_op["F mlp"] == 0.0
    assert bench.op_group("B", "B stage=0 mb=0 chunk=0 blocks=9:10", model) == "B head"
    assert bench.op_group("F", "F stage=0 mb=0 chunk=0 blocks=0:1", model) == "F embed"
