"""Grouped pipeline transfers (``Send.grouped`` / ``Recv.grouped``, an NCCL group such as Megatron-LM's
``batch_isend_irecv``): a group's send and receive to one peer run at once on their own direction streams, while
ungrouped ones share the peer pair's stream in issue order. Both engines agree; in flow mode the links price it
(a full-duplex pair of directed links moves both at full rate, one shared link halves each)."""

from __future__ import annotations

import pytest
from engine_helpers import UniformCost

from simgrid.engine import simulate_program
from simgrid.ir import P2PKey, Program, Recv, Send, Wait
from simgrid.topology.link import Link

BYTES = 10**9  # 1 s on UniformCost's 1 GB/s links
FWD = P2PKey(src_stage=0, dst_stage=1, microbatch=0, direction="F")
BWD = P2PKey(src_stage=1, dst_stage=0, microbatch=0, direction="B")


def _exchange(grouped: bool) -> Program:
    """Rank 0 sends an activation to rank 1 and receives a gradient from it in one call, waited for at once."""
    r0 = [Send(peer=1, bytes=BYTES, key=FWD, handle="s", grouped=grouped),
          Recv(peer=1, bytes=BYTES, key=BWD, handle="r", grouped=grouped), Wait(handle="s"), Wait(handle="r")]
    r1 = [Recv(peer=0, bytes=BYTES, key=FWD, handle="r", grouped=grouped),
          Send(peer=0, bytes=BYTES, key=BWD, handle="s", grouped=grouped), Wait(handle="r"), Wait(handle="s")]
    return Program(ranks=[r0, r1])


@pytest.mark.parametrize("engine", ["simpy", "fast"])
def test_a_group_runs_its_send_and_receive_to_one_peer_at_once(engine: str) -> None:
    """Ungrouped, the two 1 s transfers queue on p2p:<peer> (2 s); grouped they overlap (1 s), on streams
    p2p:1:send / p2p:1:recv."""
    times = {}
    for grouped in (False, True):
        res = simulate_program(_exchange(grouped), cost_model=UniformCost(), mode="full", engine=engine)
        times[grouped] = res.makespan_s
        streams = {row.stream for row in res.trace.rows if row.rank == 0 and row.kind in ("SEND", "RECV")}
        assert streams == ({"p2p:1:send", "p2p:1:recv"} if grouped else {"p2p:1"})
    assert times == {False: pytest.approx(2.0), True: pytest.approx(1.0)}


def test_flow_mode_prices_a_group_by_its_links() -> None:
    """Directed links (a NIC's send and receive sides) carry both directions at full rate: 1 s; one link shared by
    both directions halves each flow: 2 s."""
    duplex = simulate_program(_exchange(True), cost_model=UniformCost(), mode="full", comm_model="flow")
    shared_link = Link("half-duplex", 1e9, 0.0)
    shared = simulate_program(_exchange(True), cost_model=UniformCost(route_fn=lambda s, d: (shared_link,)),
                              mode="full", comm_model="flow")
    assert (duplex.makespan_s, shared.makespan_s) == (pytest.approx(1.0), pytest.approx(2.0))
