"""Flow mode: max-min fair link sharing and collectives as phases of flows."""

from __future__ import annotations

import math

import pytest
import simpy
from engine_helpers import UniformCost, allreduce, fwd, recv, send

from simgrid.engine import FlowNetwork, simulate_program
from simgrid.ir import Program, Wait
from simgrid.topology.link import Link


def _run_flows(specs: list[tuple[tuple[Link, ...], float]]) -> list[float]:
    """Start every (route, bytes) flow at t=0; return each one's completion time."""
    env = simpy.Environment()
    net = FlowNetwork(env)
    done = [math.nan] * len(specs)
    for i, (route, nbytes) in enumerate(specs):
        net.start(route, nbytes, lambda i=i: done.__setitem__(i, env.now))
    env.run()
    return done


def test_two_equal_flows_on_one_link_each_take_twice_as_long() -> None:
    """One 1 GB flow on a 1 GB/s link takes 1 s; two at once share it and each takes 2 s."""
    link = Link("l", 1e9, 0.0)
    assert _run_flows([((link,), 1e9)]) == pytest.approx([1.0], rel=1e-12)
    assert _run_flows([((link,), 1e9), ((link,), 1e9)]) == pytest.approx([2.0, 2.0], rel=1e-12)


def test_max_min_fair_rates_follow_progressive_filling() -> None:
    """Flows a (link x), b (links x, y), c (link y) with x = 10 B/s and y = 4 B/s: y is the bottleneck
    (b = c = 2 B/s), then a gets the rest of x (8 B/s). Sized 8, 2 and 2 bytes, all end at 1 s."""
    x, y = Link("x", 10.0, 0.0), Link("y", 4.0, 0.0)
    assert _run_flows([((x,), 8.0), ((x, y), 2.0), ((y,), 2.0)]) == pytest.approx([1.0, 1.0, 1.0], rel=1e-12)


def test_rates_are_recomputed_when_a_flow_ends() -> None:
    """Two flows share a 1 B/s link: 1 B and 3 B. Both run at 0.5 until the small one ends at 2 s; the
    big one has 2 B left and then runs alone at 1 B/s, ending at 4 s."""
    link = Link("l", 1.0, 0.0)
    assert _run_flows([((link,), 1.0), ((link,), 3.0)]) == pytest.approx([2.0, 4.0], rel=1e-12)


def test_infinite_links_and_empty_routes_finish_at_once() -> None:
    """A flow over only infinite-bandwidth links (or no links) completes at its start time."""
    assert _run_flows([((Link("inf", math.inf, 0.0),), 1e12), ((), 5.0)]) == [0.0, 0.0]


@pytest.mark.parametrize("n", [2, 4, 8])
def test_isolated_ring_all_reduce_in_flow_mode_matches_closed_form(n: int) -> None:
    """A ring all-reduce of S bytes over n ranks with dedicated links (B, a) takes
    2(n-1)/n * S/B + 2(n-1) * a when it runs alone as phases of flows."""
    size, bw, lat = 64 * 2**20, 25e9, 5e-6
    ranks = tuple(range(n))
    program = Program(groups={"g": ranks}, ranks=[[allreduce("g", size, "a"), Wait(handle="a")] for _ in ranks])
    result = simulate_program(program, cost_model=UniformCost(bw=bw, lat=lat), comm_model="flow", mode="full")
    expected = 2 * (n - 1) / n * size / bw + 2 * (n - 1) * lat
    assert result.makespan_s == pytest.approx(expected, rel=1e-9)


def test_dp_traffic_meeting_pp_traffic_on_a_nic_slows_both() -> None:
    """Ranks 0 and 1 all-reduce while rank 0 also sends to rank 2; every route out of rank 0 crosses
    one NIC. Alone, the 2-rank all-reduce of S moves S/2 twice (2 * 0.5 s) and the send of S takes 1 s;
    together, each of the all-reduce's steps and the send share the NIC, so both end later."""
    nic = Link("node0/nic", 1e9, 0.0)

    def route(src: int, dst: int) -> tuple[Link, ...]:
        own = Link(f"{src}->{dst}", 1e9, 0.0)
        return (nic, own) if src == 0 else (own,)

    size = 10**9

    def run(with_send: bool, with_allreduce: bool) -> dict[str, float]:
        r0: list = []
        r1: list = []
        r2: list = []
        if with_allreduce:
            r0 += [allreduce("dp", size, "a")]
            r1 += [allreduce("dp", size, "a"), Wait(handle="a")]
        if with_send:
            r0 += [send(2, size, "s")]
            r2 += [recv(0, size, "r"), Wait(handle="r")]
        r0 += [Wait(handle=h) for h, on in (("a", with_allreduce), ("s", with_send)) if on]
        program = Program(groups={"dp": (0, 1)}, ranks=[r0, r1, r2])
        res = simulate_program(program, cost_model=UniformCost(route_fn=route), comm_model="flow", mode="full")
        return {row.kind: row.end_s for row in res.trace.timing_rows if row.rank == 0 and row.kind != "WAIT"}

    alone_ar = run(False, True)["all_reduce"]
    alone_send = run(True, False)["SEND"]
    both = run(True, True)
    assert alone_ar == pytest.approx(1.0, rel=1e-9)
    assert alone_send == pytest.approx(1.0, rel=1e-9)
    assert both["all_reduce"] > alone_ar * 1.2
    assert both["SEND"] > alone_send * 1.2


def test_flow_mode_reports_link_utilisation() -> None:
    """A 1 GB send over a 1 GB/s link that is the whole step uses that link 100%."""
    program = Program(ranks=[[send(1, 10**9, "s"), Wait(handle="s")], [recv(0, 10**9, "r"), Wait(handle="r")]])
    res = simulate_program(program, cost_model=UniformCost(), comm_model="flow", mode="full")
    assert res.link_utilisation() == pytest.approx({"0->1": 1.0})


def test_fast_mode_uses_closed_form_for_point_to_point() -> None:
    """Fast mode: a send costs latency + bytes / bandwidth, after the compute issued before it."""
    program = Program(ranks=[[fwd(1e12), send(1, 10**9, "s"), Wait(handle="s")], [recv(0, 10**9, "r"), Wait(handle="r")]])
    res = simulate_program(program, cost_model=UniformCost(lat=1e-3), mode="full")
    assert res.makespan_s == pytest.approx(1.0 + 1e-3 + 1.0, rel=1e-12)


@pytest.mark.parametrize(("cluster_name", "gpus"), [("dgx-a100-hdr", 8), ("dgx-a100-hdr", 32)])
def test_real_topology_ring_flow_mode_equals_fast_mode(cluster_name: str, gpus: int) -> None:
    """On a real topology an isolated all-reduce simulated as flows takes the closed-form time the
    fast mode charges (simgrid.costs documents the two as equal for one collective alone)."""
    from simgrid.hardware import load_cluster

    cluster = load_cluster(cluster_name, gpus=gpus)
    ranks = tuple(range(gpus))
    program = Program(groups={"g": ranks}, ranks=[[allreduce("g", 256 * 2**20, "a"), Wait(handle="a")]
                                                   for _ in ranks])
    fast = simulate_program(program, cluster, comm_model="fast", mode="full").makespan_s
    flow = simulate_program(program, cluster, comm_model="flow", mode="full").makespan_s
    assert flow == pytest.approx(fast, rel=1e-9)
