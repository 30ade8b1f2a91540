"""Search backends: a local 2-CPU Ray started by the test gives the local backend's results; a bad backend
name or an unreachable Ray address is one line on stderr and exit status 2.

Ray comes with the ``dev`` extra (and the ``cluster`` extra for users), so this test runs wherever the
suite does; the Ray instance lives only for this module.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
import ray

from simgrid.cli.main import main
from simgrid.sweep import SweepConstraints, sweep

SEARCH = ("small-gpt", "dgx-a100-hdr", 16, 64)
CONSTRAINTS = SweepConstraints(sequence_parallel=(False, True), max_mbs=4)
CLI = ["sweep", "--model", "tiny-gpt", "--cluster", "dgx-a100-hdr", "--gpus", "4", "--gbs", "8", "--no-progress"]


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        yield
    finally:
        ray.shutdown()


@pytest.mark.timeout(240)
def test_ray_backend_gives_the_local_backends_ranking(local_ray: None) -> None:
    """Two Ray actors and two local worker processes decide the same layouts: equal tables and counts."""
    on_ray = sweep(*SEARCH, constraints=CONSTRAINTS, workers=2, progress=False, backend="ray")
    local = sweep(*SEARCH, constraints=CONSTRAINTS, workers=2, progress=False, backend="local")
    assert on_ray.backend == "ray" and on_ray.workers == 2
    assert on_ray.table.to_dict("records") == local.table.to_dict("records")
    counts = ("enumerated", "memory_dropped", "dominated", "bounded", "simulated")
    assert [getattr(on_ray, c) for c in counts] == [getattr(local, c) for c in counts]
    assert not on_ray.failures
    assert ray.is_initialized()  # a Ray the caller started is left running


def test_unknown_backend_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    """--backend spark: exit 2, one line naming the choices."""
    assert main([*CLI, "--backend", "spark"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["simgrid sweep: error: --backend 'spark' is not one of local, ray"]


def test_unreachable_ray_address_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    """A port nobody listens on: refused at once (ray.init would retry for minutes), exit 2, one line."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    assert main([*CLI, "--backend", "ray", "--address", f"127.0.0.1:{port}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"--address 127.0.0.1:{port}: cannot reach a Ray cluster" in err[0], err
    assert main([*CLI, "--backend", "ray", "--address", "nonsense"]) == 2
    assert "is not HOST:PORT" in capsys.readouterr().err
    assert main([*CLI, "--address", "auto"]) == 2
    assert "--address is for --backend ray" in capsys.readouterr().err
