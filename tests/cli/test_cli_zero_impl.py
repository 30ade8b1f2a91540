"""``--zero-impl``: the ZeRO-3 implementation flag reaches the layout; a bad value is one line, exit 2."""

from __future__ import annotations

import subprocess
import sys

import pytest

from simgrid.cli.main import main


def test_zero_impl_reaches_the_report(capsys: pytest.CaptureFixture[str]) -> None:
    """The layout line names the implementation the step was lowered with."""
    code = main(["simulate", "--model", "tiny-gpt", "--cluster", "dgx-a100-hdr", "--gpus", "2", "--zero", "3",
                 "--zero-impl", "fsdp2"])
    assert code in (0, None)
    assert "ZeRO-3 (fsdp2)" in capsys.readouterr().out


def test_bad_zero_impl_is_one_line_and_exit_2() -> None:
    """An unknown implementation exits 2 with a single stderr line naming the field, value and choices."""
    run = subprocess.run([sys.executable, "-m", "simgrid", "simulate", "--model", "tiny-gpt", "--cluster",
                          "dgx-a100-hdr", "--gpus", "2", "--zero", "3", "--zero-impl", "megatron"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "zero_impl = 'megatron' is not one of deepspeed, fsdp2" in lines[0]


def test_reduce_dtype_reaches_the_report_and_needs_fsdp2(capsys: pytest.CaptureFixture[str]) -> None:
    """``--reduce-dtype fp32`` (torchtitan's FSDP2 default) shows in the layout line; with DeepSpeed it is one
    error line naming the setting and the fix, exit 2."""
    code = main(["simulate", "--model", "tiny-gpt", "--cluster", "dgx-a100-hdr", "--gpus", "2", "--zero", "3",
                 "--zero-impl", "fsdp2", "--reduce-dtype", "fp32"])
    assert code in (0, None)
    assert "ZeRO-3 (fsdp2, fp32 reduce)" in capsys.readouterr().out
    run = subprocess.run([sys.executable, "-m", "simgrid", "simulate", "--model", "tiny-gpt", "--cluster",
                          "dgx-a100-hdr", "--gpus", "2", "--zero", "3", "--reduce-dtype", "fp32"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "reduce_dtype 'fp32' with zero 3 is FSDP2's" in lines[0]
    assert "zero_impl 'fsdp2'" in lines[0]


def test_reduce_dtype_fp32_with_zero1_is_accepted_and_named(capsys: pytest.CaptureFixture[str]) -> None:
    """``--reduce-dtype fp32`` with ``--zero 1`` (Megatron's fp32 main_grad) runs and the layout line says so."""
    code = main(["simulate", "--model", "tiny-gpt", "--cluster", "dgx-a100-hdr", "--gpus", "2", "--zero", "1",
                 "--reduce-dtype", "fp32"])
    assert code in (0, None)
    assert "ZeRO-1, fp32 grads" in capsys.readouterr().out


def test_memory_with_fp32_grads_doubles_the_gradient_line(capsys: pytest.CaptureFixture[str]) -> None:
    """``simgrid memory --zero 1 --reduce-dtype fp32``: the grads line is twice the default's (4-byte
    gradients, Megatron's fp32 main_grad), weights and optimizer lines unchanged, the layout line names it."""
    def lines(extra: list[str]) -> dict[str, str]:
        assert main(["memory", "--model", "llama2-7b", "--gpus", "16", "--tp", "2", "--zero", "1", "--gbs", "64",
                     "--mbs", "1", *extra]) in (0, None)
        out = capsys.readouterr().out
        found = {ln.split()[0]: ln.split()[1] for ln in out.splitlines() if ln.startswith("  ") and ln.split()}
        found["layout"] = next(ln for ln in out.splitlines() if ln.startswith("layout"))
        return found

    plain, fp32 = lines([]), lines(["--reduce-dtype", "fp32"])
    assert float(fp32["grads"]) == pytest.approx(2 * float(plain["grads"]), abs=0.01)
    assert (fp32["weights"], fp32["optimizer"]) == (plain["weights"], plain["optimizer"])
    assert "reduce_dtype=fp32" in fp32["layout"] and "reduce_dtype" not in plain["layout"]
