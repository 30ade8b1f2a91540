"""The `simgrid` command: dispatch, the memory/profiles/models commands, errors as one line, the demo."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from simgrid.cli.main import main


def _json_of(capsys: pytest.CaptureFixture[str], argv: list[str]) -> object:
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_models_json_lists_presets_with_parameter_counts(capsys: pytest.CaptureFixture[str]) -> None:
    """`simgrid models --json` includes `params`; gpt2-small has its published 124M parameters."""
    models = {m["name"]: m for m in _json_of(capsys, ["models", "--json"])}  # type: ignore[union-attr]
    assert {"gpt3-175b", "llama2-7b", "megatron-1t", "tiny-gpt"} <= set(models)
    assert round(models["gpt2-small"]["params"] / 1e6) == 124


def test_profiles_json_lists_every_kind(capsys: pytest.CaptureFixture[str]) -> None:
    """`simgrid profiles --json` lists GPUs, nodes and clusters with their paths."""
    infos = _json_of(capsys, ["profiles", "--json"])
    kinds = {(i["kind"], i["name"]) for i in infos}  # type: ignore[union-attr]
    assert {("gpu", "a100-80gb-sxm"), ("node", "dgx-a100"), ("cluster", "ideal")} <= kinds


def test_memory_json_contract(capsys: pytest.CaptureFixture[str]) -> None:
    """`simgrid memory --json` has the documented keys and total = states + activations + buffers."""
    out = _json_of(capsys, ["memory", "--model", "gpt3-175b", "--tp", "8", "--pp", "8", "--dp", "16",
                            "--gbs", "1536", "--recompute", "full", "--gpu", "a100-80gb-sxm", "--json"])
    assert isinstance(out, dict)
    for key in ("model_states_bytes", "activations_bytes", "total_bytes", "breakdown", "fits"):
        assert key in out
    assert out["total_bytes"] == out["model_states_bytes"] + out["activations_bytes"] + out["buffers_bytes"]
    assert out["fits"] is True


def test_llama2_7b_full_finetune_does_not_fit_one_rtx4090(capsys: pytest.CaptureFixture[str]) -> None:
    """The README's question: no, because Adam states need ~16 bytes/param; suggestions that fit exist."""
    assert main(["memory", "--model", "llama2-7b", "--gpu", "rtx-4090"]) == 0
    text = capsys.readouterr().out
    assert "fit     NO" in text and "optimizer" in text
    out = _json_of(capsys, ["memory", "--model", "llama2-7b", "--gpu", "rtx-4090", "--json"])
    assert isinstance(out, dict)
    assert out["fits"] is False
    assert out["model_states_bytes"] >= 16 * 6.7e9
    assert out["suggestions"] and all(s["total_bytes"] <= 24 * 2**30 for s in out["suggestions"])


def test_memory_by_parameter_count(capsys: pytest.CaptureFixture[str]) -> None:
    """`--params` builds a GPT-style model near that size; ZeRO-3 over 64 replicas shards states 64 ways."""
    out = _json_of(capsys, ["memory", "--params", "7.5e9", "--dp", "64", "--zero", "3", "--json"])
    assert isinstance(out, dict)
    assert 0.9 < out["params"] / 7.5e9 < 1.1
    assert out["model_states_bytes"] == pytest.approx(16 * out["params"] / 64, rel=0.02)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["memory", "--model", "gpt-5"], "unknown model 'gpt-5'"),
        (["memory", "--model", "gpt3-175b", "--tp", "7"], "tp = 7 does not divide the 96 attention heads"),
        (["memory", "--model", "gpt3-175b", "--gpu", "a200"], "a200"),
        (["memory", "--model", "gpt3-175b", "--dp", "2", "--mbs", "3", "--gbs", "4"], "not divisible"),
    ],
)
def test_bad_input_is_one_line_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    """Project errors print one line on stderr naming the problem, exit status 2, no traceback."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err
    assert err.startswith(f"simgrid {argv[0]}: error:")


def test_bad_flag_values_are_rejected_by_the_parser(capsys: pytest.CaptureFixture[str]) -> None:
    """Negative sizes are refused at parse time with the value named."""
    with pytest.raises(SystemExit) as exc:
        main(["memory", "--model", "gpt3-175b", "--tp", "-2"])
    assert exc.value.code == 2
    assert "'-2' must be a positive integer" in capsys.readouterr().err


def test_malformed_profile_file_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A broken TOML given by path names the file; no traceback."""
    bad = tmp_path / "broken.toml"
    bad.write_text('kind = "gpu"\nname = \n')
    assert main(["memory", "--model", "tiny-gpt", "--gpu", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "broken.toml" in err and "Traceback" not in err


def test_demo_writes_gantt_and_trace(tmp_path: Path) -> None:
    """README command 1: `simgrid demo` prints the report and writes a PNG and a Perfetto trace."""
    result = subprocess.run(
        [sys.executable, "-m", "simgrid", "demo", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "step time" in result.stdout and "MFU" in result.stdout
    assert (tmp_path / "gantt.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    trace = json.loads((tmp_path / "trace.json").read_text())
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    assert any(e.get("ph") == "X" for e in events)


def test_saved_trace_draws_memory_over_time(tmp_path: Path) -> None:
    """`simulate --trace` keeps the pipeline ranks' memory timeline, so `plot --kind memory` can draw it."""
    trace = tmp_path / "t.json"
    assert main(["simulate", "--model", "tiny-gpt", "--cluster", "dgx-a100-hdr", "--gpus", "4", "--pp", "2",
                 "--gbs", "8", "--trace", str(trace)]) == 0
    timeline = json.loads(trace.read_text())["otherData"]["memory_timeline"]
    assert set(timeline) == {"0", "2"}  # pipeline ranks of the first replica (tp fastest, then dp)
    assert max(timeline["0"]["total_bytes"]) > 0
    out = tmp_path / "memory.png"
    assert main(["plot", str(trace), "--kind", "memory", "--out", str(out)]) == 0
    assert out.read_bytes()[:4] == b"\x89PNG"


def test_memory_flag_flash_attention_drops_the_score_activations(capsys: pytest.CaptureFixture[str]) -> None:
    """`--flash-attention` reaches the layout: gpt3-175b's activations per layer (tp 8, pp 8, 1F1B keeps up
    to 8 micro-batches on the first stage) shrink by the 5 a s^2 b / t score bytes minus the statistics."""
    args = ["memory", "--model", "gpt3-175b", "--tp", "8", "--pp", "8", "--dp", "16", "--gbs", "1536",
            "--gpu", "a100-80gb-sxm", "--json"]
    plain, flash = _json_of(capsys, args), _json_of(capsys, [*args, "--flash-attention"])
    assert isinstance(plain, dict) and isinstance(flash, dict)
    assert flash["activations_bytes"] < plain["activations_bytes"]
    assert flash["model_states_bytes"] == plain["model_states_bytes"]


def test_attention_kernel_and_kernel_fusion_flags_change_the_step(capsys: pytest.CaptureFixture[str]) -> None:
    """On H100, FA2 runs the fused core slower than FA3, and eager element-wise kernels slower than fused."""
    base = ["simulate", "--model", "llama3-8b", "--cluster", "dgx-h100-ndr", "--gpus", "8", "--zero", "3",
            "--mbs", "1", "--gbs", "8", "--flash-attention", "--json"]

    def step(*extra: str) -> float:
        assert main([*base, *extra]) == 0
        return float(json.loads(capsys.readouterr().out)["step_time_s"])

    fa3 = step("--attention-kernel", "fa3")
    assert step("--attention-kernel", "fa2") > fa3
    assert step("--attention-kernel", "fa3", "--kernel-fusion", "eager") > fa3
    with pytest.raises(SystemExit) as info:  # argparse refuses an unknown kernel with status 2
        main([*base, "--attention-kernel", "fa9"])
    assert info.value.code == 2
