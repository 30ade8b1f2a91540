"""Contention between concurrent collectives of different groups: flow mode shares NVLink ports and NICs.

Two nodes of four GPUs (NVLink 150 GB/s per port, one 25 GB/s NIC per GPU, no latency). A data-parallel
all-gather over all eight GPUs runs NCCL's four rail rings, so it moves S/8 per step through every
GPU's NVLink port while its NICs carry S/32: at these rates the ring is NIC-bound and keeps two thirds of
each port busy. A tensor-parallel all-reduce inside node 0 needs the ports. Issued together in flow mode they
share the ports max-min fairly: the NIC-bound ring keeps its pace and the all-reduce gets what is left of
the ports, so it takes longer than alone; fast mode prices each alone (its documented simplification).
"""

from __future__ import annotations

import pytest

from simgrid.engine import simulate_program
from simgrid.hardware import Cluster
from simgrid.ir import Collective, Program, Wait
from simgrid.topology import synthetic_cluster

S = 64_000_000


def _cluster() -> Cluster:
    return synthetic_cluster(num_gpus=8, gpus_per_node=4, intra_GBps=150, nic_GBps=25)


def _program(with_dp: bool, with_tp: bool) -> Program:
    groups = {"world": tuple(range(8)), "tp0": (0, 1, 2, 3), "tp1": (4, 5, 6, 7)}
    ranks = []
    for r in range(8):
        ops: list = []
        if with_dp:
            ops.append(Collective(kind="all_gather", group="world", bytes=S, purpose="zero-param", handle="ag"))
        if with_tp:
            ops.append(Collective(kind="all_reduce", group=f"tp{r // 4}", bytes=S, purpose="tp", handle="ar"))
        ops += [Wait(handle=h) for h, on in (("ag", with_dp), ("ar", with_tp)) if on]
        ranks.append(ops)
    return Program(groups=groups, ranks=ranks)


def _ends(program: Program, comm_model: str) -> dict[str, float]:
    result = simulate_program(program, _cluster(), mode="full", comm_model=comm_model)
    return {row.purpose: row.end_s for row in result.trace.rows if row.rank == 0 and row.kind != "WAIT"}


def test_alone_flow_and_fast_agree() -> None:
    """Each collective alone: flow mode (phases as fair-shared flows) equals the closed form."""
    for dp, tp in ((True, False), (False, True)):
        assert _ends(_program(dp, tp), "flow") == pytest.approx(_ends(_program(dp, tp), "fast"), rel=1e-9)


def test_tensor_and_data_parallel_collectives_share_nvlink_in_flow_mode() -> None:
    """Together in flow mode the all-reduce finishes well after its lone time (a third of each port is left
    to it while the ring runs) and the ring no earlier than alone; in fast mode each keeps its lone time."""
    dp_alone = _ends(_program(True, False), "flow")["zero-param"]
    tp_alone = _ends(_program(False, True), "flow")["tp"]
    both = _ends(_program(True, True), "flow")
    assert both["tp"] > 1.1 * tp_alone
    assert both["zero-param"] == pytest.approx(dp_alone, rel=1e-9)
    fast = _ends(_program(True, True), "fast")
    assert fast == pytest.approx({"zero-param": dp_alone, "tp": tp_alone}, rel=1e-9)


def test_ring_alone_is_nic_bound_with_spare_nvlink() -> None:
    """The all-gather alone: 7 steps of S/32 per NIC at 25 GB/s (the NVLink ports, S/8 per step at
    150 GB/s, would allow a third less): the premise of the test above."""
    assert _ends(_program(True, False), "fast")["zero-param"] == pytest.approx(7 * S / 32 / 25e9)
