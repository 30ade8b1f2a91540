"""The launcher: real multi-process gloo worlds, named groups, and bounded failures naming rank and op."""

from __future__ import annotations

import socket
import time

import pytest

pytest.importorskip("torch")

from executor.launch import ExecutionError, LaunchConfig, check_port_free, free_port, spawn_world
from tests.executor import launch_workers

pytestmark = [pytest.mark.torch, pytest.mark.slow, pytest.mark.timeout(90)]


def test_two_rank_world_all_reduces_and_creates_named_groups() -> None:
    """Sum of (rank+1) over 3 ranks is 6; the group {0, 2} sums to 1 + 3 = 4 on its members."""
    groups = {"world": (0, 1, 2), "pair": (0, 2), "solo": (1,)}
    out = spawn_world(launch_workers.all_reduce_rank_plus_one, None, LaunchConfig(world_size=3), groups)
    assert [r["sums"]["world"] for r in out] == [6.0, 6.0, 6.0]
    assert out[0]["sums"]["pair"] == 4.0 and out[2]["sums"]["pair"] == 4.0
    assert "pair" not in out[1]["sums"] and out[1]["sums"]["solo"] == 2.0
    assert all(r["threads"] >= 1 for r in out)


def test_raising_rank_is_named_with_its_op_and_nothing_hangs() -> None:
    """A rank that raises: the error names rank 1, its op text and the exception, well before the deadline."""
    start = time.monotonic()
    with pytest.raises(ExecutionError, match=r"rank 1 failed at op 'F s0 m0 b1:2'.*boom"):
        spawn_world(launch_workers.fail_on_rank_one, None, LaunchConfig(world_size=2, run_timeout_s=60))
    assert time.monotonic() - start < 30


def test_collective_exceeding_the_timeout_fails_on_the_waiting_rank() -> None:
    """Rank 0's all-reduce times out after comm_timeout_s; the error names rank 0 and the op."""
    config = LaunchConfig(world_size=2, comm_timeout_s=3, run_timeout_s=60)
    with pytest.raises(ExecutionError, match=r"rank 0 failed at op 'ALLREDUCE tp b3:fwd'"):
        spawn_world(launch_workers.stall_on_rank_one, 20.0, config)


def test_port_in_use_is_refused_before_launch() -> None:
    """A MASTER_PORT that is already bound gives a clear error and starts no process."""
    port = free_port()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind(("127.0.0.1", port))
        busy.listen()
        with pytest.raises(ExecutionError, match=f"MASTER_PORT {port} on 127.0.0.1 is not free"):
            check_port_free("127.0.0.1", port)
        with pytest.raises(ExecutionError, match="is not free"):
            spawn_world(launch_workers.all_reduce_rank_plus_one, None,
                        LaunchConfig(world_size=2, master_port=port))
