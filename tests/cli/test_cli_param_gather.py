"""``--overlap-param-gather`` and ``--bucket-policy``: the flags reach the layout and the report; the overlap
without ZeRO-1 is one line, exit 2."""

from __future__ import annotations

import json

import pytest

from simgrid.cli.main import main


def test_overlap_param_gather_and_bucket_policy_reach_the_layout(capsys: pytest.CaptureFixture[str]) -> None:
    """The layout line names the overlap and the JSON layout carries both settings."""
    args = ["simulate", "--model", "tiny-gpt", "--cluster", "dgx-h100-ndr", "--gpus", "2", "--zero", "1",
            "--overlap-param-gather", "--bucket-policy", "megatron"]
    assert main(args) in (0, None)
    assert "param gather overlap" in capsys.readouterr().out
    assert main([*args, "--json"]) in (0, None)
    layout = json.loads(capsys.readouterr().out)["layout"]
    assert layout["overlap_param_gather"] is True and layout["bucket_policy"] == "megatron"


def test_overlap_param_gather_without_zero1_is_one_line_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    """Megatron's rule, said once: the deferred gather belongs to the distributed optimizer (ZeRO-1)."""
    code = main(["simulate", "--model", "tiny-gpt", "--cluster", "dgx-h100-ndr", "--gpus", "2",
                 "--overlap-param-gather"])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs zero = 1 with overlap_grad_reduce" in err[0]
