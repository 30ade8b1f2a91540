"""The fast engine (simgrid.engine.fast) against the SimPy interpreter: same trace, row for row, bit for bit.

The fast loop is a transcription of the interpreter without SimPy; these tests are what keeps it one. Over
hundreds of generated layouts (several models, clusters and world sizes; every pipeline schedule with its
interleaving, ZeRO 0-3, context parallelism, recompute, FlashAttention, sequence parallelism, optimizer
offload, parameter server, overlapped or not gradient sync, every ZeRO-3 implementation and apex's ZeRO-1, a MoE model's
expert parallelism, block and stage granularity, symmetric and full mode, stragglers) both engines run the same program and must give equal trace rows (same order,
same floats), memory events, step time, mode and notes; the metrics the fast loop aggregates without rows
must equal :func:`simgrid.metrics.compute_metrics` of the SimPy trace exactly.
"""

from __future__ import annotations

import dataclasses
import random
from functools import cache
from typing import Any

import pytest

from simgrid.engine import simulate_program
from simgrid.engine.fast import UnsupportedProgram, simulate_step, summary_metrics
from simgrid.errors import LayoutError, ScheduleError, SimulationError
from simgrid.hardware import load_cluster
from simgrid.ir import Compute, Program, Recv, Wait
from simgrid.layout import Layout, check_layout
from simgrid.layout.spec import ZERO_IMPLS
from simgrid.metrics import compute_metrics
from simgrid.model import get_model
from simgrid.model.spec import ModelSpec
from simgrid.schedules import build_program
from simgrid.schedules.pipeline import check_schedule
from simgrid.sweep.constraints import ALL_PIPELINE_SCHEDULES

TINY_LLAMA = ModelSpec(name="tiny-llama", num_layers=6, hidden_size=64, num_heads=8, num_kv_heads=2,
                       ffn_hidden_size=176, gated_mlp=True, vocab_size=512, seq_length=64, tied_embeddings=False,
                       norm="rmsnorm", position="rope", bias=False)
MODELS = (get_model("tiny-gpt"), get_model("small-gpt"), TINY_LLAMA, get_model("tiny-moe"))
CLUSTERS = ("dgx-a100-hdr", "dgx-h100-ndr", "rtx4090-10gbe", "dgx1-v100-edr")
SCHEDULES = ALL_PIPELINE_SCHEDULES
CASES = 300


@cache
def _cluster(name: str, gpus: int) -> Any:
    return load_cluster(name, gpus=gpus)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _random_case(rng: random.Random) -> tuple[ModelSpec, str, Layout, str, str, dict[int, float]]:
    """A valid (model, cluster, layout, granularity, mode, speed factors), drawn until one is valid."""
    while True:
        model = rng.choice(MODELS)
        cluster = rng.choice(CLUSTERS)
        world = rng.choice((1, 2, 4, 8, 16))
        tp = rng.choice([d for d in _divisors(world) if d <= 4 and model.num_heads % d == 0])
        cp = rng.choice([c for c in (1, 2) if (world // tp) % c == 0])
        pp = rng.choice(_divisors(world // (tp * cp)))
        dp = world // (tp * cp * pp)
        schedule = "none" if pp == 1 else rng.choice(SCHEDULES)
        vpp = {"interleaved-1f1b": rng.choice((2, 3)), "interleaved-zb": 2, "looped-bfs": rng.choice((1, 2)),
               "zbv": 2, "dualpipev": 2}.get(schedule, 1)
        mbs = rng.choice((1, 2))
        m = rng.choice((1, 2, 3, 4, 6, 8)) if "interleaved" not in schedule else pp * rng.choice((1, 2))
        zero = rng.choice((0, 1) if pp > 1 else (0, 1, 2, 3))
        recompute = rng.choice(("none", "selective", "full"))
        flash = rng.random() < 0.3 and recompute != "selective"
        dp_mode = "parameter-server" if zero == 0 and rng.random() < 0.1 else "allreduce"
        experts: dict[str, Any] = {}
        if model.moe is not None:  # expert parallelism folds over the stage's tp * cp * dp ranks
            experts = {"ep": rng.choice([e for e in (1, 2, 4) if model.moe.num_experts % e == 0]),
                       "etp": rng.choice((None, 1, tp))}
        precision = "fp16" if cluster == "dgx1-v100-edr" else rng.choice(("bf16", "bf16", "fp32"))
        overlap = rng.random() < 0.8
        try:
            layout = Layout(dp=dp, tp=tp, pp=pp, cp=cp, vpp=vpp, zero=zero, micro_batch_size=mbs,
                            global_batch_size=dp * mbs * m, schedule=schedule, recompute=recompute,
                            sequence_parallel=tp > 1 and (model.moe is not None or rng.random() < 0.5),
                            flash_attention=flash,
                            precision=precision, offload_optimizer=rng.random() < 0.15, dp_mode=dp_mode,
                            overlap_grad_reduce=overlap, bucket_size_MB=rng.choice((0.05, 25.0)),
                            overlap_param_gather=zero == 1 and overlap and rng.random() < 0.5,
                            zero_impl=rng.choice(ZERO_IMPLS), **experts)
            check_layout(model, layout)
            check_schedule(schedule, pp, layout.num_microbatches, vpp)
        except (LayoutError, ScheduleError):
            continue
        granularity = rng.choice(("block", "stage"))
        mode = rng.choice(("symmetric", "symmetric", "full"))
        speeds = {rng.randrange(world): rng.choice((0.5, 0.8))} if world > 1 and rng.random() < 0.15 else {}
        return model, cluster, layout, granularity, mode, speeds


def _cases() -> list[tuple[ModelSpec, str, Layout, str, str, dict[int, float]]]:
    rng = random.Random(20261124)
    return [_random_case(rng) for _ in range(CASES)]


@pytest.mark.slow
def test_fast_engine_equals_simpy_on_generated_layouts() -> None:
    """300 generated layouts: identical rows, memory, step time, mode and notes; summary metrics equal."""
    features: set[str] = set()
    for model, cluster_name, layout, granularity, mode, speeds in _cases():
        program = build_program(model, layout, granularity=granularity)  # type: ignore[arg-type]
        cluster = _cluster(cluster_name, layout.world_size)
        ref = simulate_program(program, cluster, mode=mode, speed_factors=speeds, engine="simpy")
        fast = simulate_program(program, cluster, mode=mode, speed_factors=speeds, engine="fast")
        what = f"{model.name} on {cluster_name}: {layout} ({granularity}, {mode}, speeds {speeds})"
        assert fast.trace.timing_rows == ref.trace.timing_rows, what
        assert fast.makespan_s == ref.makespan_s, what
        assert (fast.mode, fast.notes, dict(fast.multiplicity)) == (ref.mode, ref.notes, dict(ref.multiplicity)), what
        assert {r: t.events for r, t in fast.memory.timelines.items()} == \
            {r: t.events for r, t in ref.memory.timelines.items()}, what
        summary = simulate_step(program, cluster, mode=mode, speed_factors=speeds)
        peak = cluster.gpu.peak_flops(layout.precision)
        expected = compute_metrics(ref.trace, model=model, layout=layout, peak_flops_per_gpu=peak,
                                   peak_memory_bytes=ref.memory.peak_bytes,
                                   memory_capacity_bytes=ref.memory.capacity_bytes)
        got = summary_metrics(summary, model=model, layout=layout, peak_flops_per_gpu=peak,
                              memory_capacity_bytes=cluster.gpu.memory_bytes)
        # The loop's reductions are the rows' own, in the same order: the metrics are equal, not close.
        assert got == expected, what
        features |= {layout.schedule or "none", f"zero{layout.zero}", f"rc-{layout.recompute}", ref.mode, granularity}
        if layout.zero == 3 or layout.zero_impl == "apex":
            features.add(f"zero{layout.zero}-{layout.zero_impl}")
        features |= {name for name, on in (("cp", layout.cp > 1), ("sp", layout.sequence_parallel),
                                           ("flash", layout.flash_attention), ("offload", layout.offload_optimizer),
                                           ("ps", layout.dp_mode == "parameter-server" and layout.dp > 1),
                                           ("no-overlap", not layout.overlap_grad_reduce), ("straggler", bool(speeds)),
                                           ("ep", layout.ep > 1), ("etp", layout.expert_tp > 1),
                                           ("inter-node", layout.world_size > 8)) if on}
    # The generator must actually have covered what the module docstring promises.
    expected_features = {*SCHEDULES, "none", "zero0", "zero1", "zero2", "zero3", *(f"zero3-{i}" for i in ZERO_IMPLS if i != "apex"),
                             "zero1-apex",
                         "rc-none", "rc-selective",
                         "rc-full", "symmetric", "full", "block", "stage", "cp", "sp", "flash", "offload", "ps",
                         "no-overlap", "straggler", "inter-node", "ep", "etp"}
    assert expected_features <= features, expected_features - features


@pytest.mark.parametrize("granularity", ["block", "stage"])
def test_fast_engine_equals_simpy_on_apex_interleaved_sync(granularity: str) -> None:
    """NeMo's apex sync under the interleaved schedule (per-chunk gathers launched ahead by pipeline rank, per-chunk
    reduce-scatters), which the generator rarely draws: equal rows and step time."""
    layout = Layout(dp=2, pp=2, vpp=3, zero=1, zero_impl="apex", schedule="interleaved-1f1b", global_batch_size=8,
                    bucket_size_MB=0.05, overlap_param_gather=True, tp=2, sequence_parallel=True)
    model = dataclasses.replace(get_model("tiny-gpt"), name="tiny-gpt-6l", num_layers=6)
    program = build_program(model, layout, granularity=granularity)  # type: ignore[arg-type]
    cluster = _cluster("dgx-h100-ndr", layout.world_size)
    ref = simulate_program(program, cluster, mode="full", engine="simpy")
    fast = simulate_program(program, cluster, mode="full", engine="fast")
    assert fast.trace.timing_rows == ref.trace.timing_rows
    assert fast.makespan_s == ref.makespan_s


@pytest.mark.parametrize(("schedule", "vpp", "gather"), [("1f1b", 1, False), ("interleaved-1f1b", 2, True),
                                                      ("1f1b", 1, True)])
def test_fast_engine_equals_simpy_on_batched_p2p_groups(schedule: str, vpp: int, gather: bool) -> None:
    """Megatron-LM's batched p2p: grouped transfers on their direction streams, with or without the scatter-gather
    all-gathers over tp, which the generator does not draw: equal rows and step time."""
    layout = Layout(dp=1, tp=2, pp=2, vpp=vpp, schedule=schedule, global_batch_size=4, p2p_order="megatron-batched",
                    p2p_scatter_gather=gather)
    model = dataclasses.replace(get_model("tiny-gpt"), name="tiny-gpt-4l", num_layers=4)
    program = build_program(model, layout, granularity="block")
    cluster = _cluster("dgx-a100-hdr", layout.world_size)
    ref = simulate_program(program, cluster, mode="full", engine="simpy")
    fast = simulate_program(program, cluster, mode="full", engine="fast")
    assert fast.trace.timing_rows == ref.trace.timing_rows
    assert fast.makespan_s == ref.makespan_s
    assert any(r.stream == "p2p:2:send" for r in ref.trace.rows)


@pytest.mark.parametrize(("model_name", "granularity", "recipe"), [
    ("tiny-moe", "block", "delayed"), ("tiny-moe", "stage", "current"), ("tiny-gpt", "block", "current")])
def test_fast_engine_equals_simpy_under_fp8(model_name: str, granularity: str, recipe: str) -> None:
    """fp8 programs (fp8 GEMM lists; a MoE model's fp8 experts beside its 16-bit router and all-to-alls), which the
    generator above never draws: equal rows, step time and memory events."""
    layout = Layout(dp=2, pp=2, tp=2, sequence_parallel=True, zero=1, schedule="1f1b", global_batch_size=8,
                    fp8_recipe=recipe, ep=2 if model_name == "tiny-moe" else 1)  # type: ignore[arg-type]
    program = build_program(get_model(model_name), layout, granularity=granularity)  # type: ignore[arg-type]
    assert any(isinstance(o, Compute) and o.fp8_gemms for o in program.ranks[0])
    cluster = _cluster("dgx-h100-ndr", layout.world_size)
    ref = simulate_program(program, cluster, mode="full", engine="simpy")
    fast = simulate_program(program, cluster, mode="full", engine="fast")
    assert fast.trace.timing_rows == ref.trace.timing_rows
    assert fast.makespan_s == ref.makespan_s
    assert {r: t.events for r, t in fast.memory.timelines.items()} == \
        {r: t.events for r, t in ref.memory.timelines.items()}


def test_fast_engine_reports_a_deadlock_as_simpy_does() -> None:
    """Two ranks each waiting on a receive the other never sends: the same one-line error from both."""
    from simgrid.ir import P2PKey

    key = P2PKey(src_stage=0, dst_stage=1, microbatch=0, direction="F")
    ranks = (
        (Recv(peer=1, bytes=8, key=key, handle="r"), Wait(handle="r")),
        (Recv(peer=0, bytes=8, key=key, handle="r"), Wait(handle="r")),
    )
    program = Program(groups={"world": (0, 1)}, ranks=ranks)
    cluster = _cluster("dgx-a100-hdr", 2)
    messages = []
    for engine in ("simpy", "fast"):
        with pytest.raises(SimulationError, match="deadlocked") as info:
            simulate_program(program, cluster, mode="full", engine=engine)
        messages.append(str(info.value))
    assert messages[0] == messages[1]


def test_fast_engine_refuses_an_op_it_does_not_know_and_auto_falls_back() -> None:
    """An op class outside the IR: engine='fast' raises UnsupportedProgram naming it; 'auto' leaves the
    program to SimPy, which raises its own error for it (no silent wrong answer either way)."""

    class Mystery(Compute):
        pass

    plain = Compute(kind="F", stage=0, microbatch=0, chunk=0, block_start=0, block_end=1, flops=1e9, hbm_bytes=0.0)
    program = Program(groups={"world": (0,)}, ranks=((plain,),))
    object.__setattr__(program, "ranks", ((Mystery(**plain.__dict__),),))  # past the constructor's type check
    cluster = _cluster("dgx-a100-hdr", 1)
    with pytest.raises(UnsupportedProgram, match="Mystery"):
        simulate_program(program, cluster, mode="full", engine="fast")
    with pytest.raises(SimulationError, match="is not an IR op the engine knows"):
        simulate_program(program, cluster, mode="full", engine="auto")


def test_flow_mode_is_refused_by_the_fast_engine() -> None:
    """engine='fast' with the flow comm model is an error that says to use SimPy."""
    program = build_program(get_model("tiny-gpt"), Layout(dp=2, global_batch_size=2))
    with pytest.raises(SimulationError, match="engine 'fast' needs comm_model 'fast'"):
        simulate_program(program, _cluster("dgx-a100-hdr", 2), comm_model="flow", engine="fast")
    with pytest.raises(SimulationError, match="engine = 'turbo'"):
        simulate_program(program, _cluster("dgx-a100-hdr", 2), engine="turbo")
