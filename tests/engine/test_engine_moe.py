"""Simulating MoE programs: all-to-alls priced on the fabric, symmetric mode exact, imbalance, traces."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from simgrid import Layout, simulate
from simgrid.engine import simulate_program
from simgrid.hardware import load_cluster
from simgrid.metrics import exposed_comm_by_kind
from simgrid.model import get_model
from simgrid.model.moe_spec import MoESpec
from simgrid.model.spec import ModelSpec
from simgrid.plots import plot_gantt
from simgrid.schedules import build_program

# A small Mixtral-like model whose all-to-alls are large enough to see bandwidth rather than latency.
TOY = ModelSpec(name="toy-moe", num_layers=4, hidden_size=1024, num_heads=8, num_kv_heads=8, ffn_hidden_size=1024,
                gated_mlp=True, vocab_size=4096, seq_length=1024, tied_embeddings=False, norm="rmsnorm",
                position="rope", bias=False,
                moe=MoESpec(num_experts=8, top_k=2, expert_ffn_hidden_size=1024))


def _a2a_durations(layout: Layout) -> list[float]:
    result = simulate(TOY, "dgx-h100-ndr", layout)
    return [r.end_s - r.start_s for r in result.trace.timing_rows if r.kind == "all_to_all"]


def test_all_to_all_across_nodes_is_slower_than_inside_one() -> None:
    """The same dispatch (same bytes per rank) within one NVLink node (ep 8, etp 1: ranks 0-7) and spanning
    two nodes over InfiniBand (ep 8 strided by etp 2: ranks 0, 2, ..., 14): the second takes longer."""
    inside = _a2a_durations(Layout(dp=16, ep=8, etp=1, global_batch_size=16))
    across = _a2a_durations(Layout(dp=16, ep=8, etp=2, global_batch_size=16))
    assert inside and across
    assert min(across) > 2 * max(inside)


def test_symmetric_mode_equals_full_mode_for_moe() -> None:
    """A MoE program (ep 2, etp 2, pp 2, ZeRO-1) is simulated exactly by one representative per stage."""
    program = build_program(TOY, Layout(dp=4, pp=2, ep=2, etp=2, zero=1, global_batch_size=8))
    cluster = load_cluster("dgx-h100-ndr", gpus=8)
    sym = simulate_program(program, cluster, mode="symmetric")
    full = simulate_program(program, cluster, mode="full")
    assert sym.mode == "symmetric"
    assert sym.makespan_s == pytest.approx(full.makespan_s, rel=1e-9)
    assert exposed_comm_by_kind(sym.trace)["ep"] == pytest.approx(exposed_comm_by_kind(full.trace)["ep"], rel=1e-9)


def test_flow_mode_runs_moe_all_to_alls_as_link_flows() -> None:
    """Flow mode (contention between concurrent flows) simulates the all-to-alls as well; it is no faster
    than the closed form of one collective alone."""
    layout = Layout(dp=16, ep=8, etp=2, global_batch_size=16)
    fast = simulate(TOY, "dgx-h100-ndr", layout)
    flow = simulate(TOY, "dgx-h100-ndr", layout, mode="full", comm_model="flow")
    assert flow.metrics.exposed_comm_s["ep"] >= fast.metrics.exposed_comm_s["ep"] * 0.999


def test_load_imbalance_slows_the_step() -> None:
    """The busiest rank receiving 1.5x the mean makes the experts and all-to-alls longer; MFU counts only the
    balanced model FLOPs, so it drops."""
    layout = Layout(dp=8, ep=8, global_batch_size=8)
    balanced = simulate(TOY, "dgx-h100-ndr", layout).metrics
    skewed_model = dataclasses.replace(TOY, moe=dataclasses.replace(TOY.moe, load_imbalance=1.5))  # type: ignore[arg-type]
    skewed = simulate(skewed_model, "dgx-h100-ndr", layout).metrics
    assert skewed.step_time_s > balanced.step_time_s
    assert skewed.exposed_comm_s["ep"] > balanced.exposed_comm_s["ep"]
    assert skewed.mfu < balanced.mfu


def test_trace_and_gantt_show_the_all_to_alls(tmp_path: Path) -> None:
    """Perfetto events of category ep on their ep group's stream; the Gantt legend has an ep row."""
    result = simulate(get_model("tiny-moe"), "dgx-h100-ndr", Layout(dp=2, ep=2, global_batch_size=2))
    path = tmp_path / "trace.json"
    result.trace.to_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    a2a = [e for e in events if e.get("cat") == "ep" and e.get("ph") == "X"]
    assert a2a and all("all_to_all" in e["name"] or "WAIT" in e["name"] for e in a2a)
    fig = plot_gantt(result.trace)
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert "ep comm" in legend
