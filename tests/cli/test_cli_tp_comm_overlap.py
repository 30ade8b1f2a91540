"""``--tp-comm-overlap``: the flag reaches the layout and the report; without sequence parallelism it is one
line, exit 2."""

from __future__ import annotations

import pytest

from simgrid.cli.main import main


def test_tp_comm_overlap_reaches_the_report(capsys: pytest.CaptureFixture[str]) -> None:
    """The layout line says the step was lowered with TE's overlap."""
    code = main(["simulate", "--model", "tiny-gpt", "--cluster", "dgx-h100-ndr", "--gpus", "2", "--tp", "2",
                 "--sequence-parallel", "--tp-comm-overlap"])
    assert code in (0, None)
    assert "SP, TP comm overlap" in capsys.readouterr().out


def test_tp_comm_overlap_without_sequence_parallel_is_one_line_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    """Megatron's rule, said once: the overlap needs tp > 1 and --sequence-parallel."""
    code = main(["simulate", "--model", "tiny-gpt", "--cluster", "dgx-h100-ndr", "--gpus", "2", "--tp", "2",
                 "--tp-comm-overlap"])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs tp > 1 with sequence parallelism" in err[0]
