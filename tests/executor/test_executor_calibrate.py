"""Calibration: the compute fit recovers known rates, and the written profile loads back for the engine."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")

from executor.calibrate import HOST_DRIFT_WARNING, ComputeFit, build_profile, fit_compute, host_drift
from executor.gencal import GenerationFit
from simgrid.hardware import load_cluster
from simgrid.ir.ops import Collective, Compute
from simgrid.serving.insitu import LAUNCH_KEY, MATRIX_KEY


def _op(flops: float, hbm: float, kernels: int) -> Compute:
    return Compute(kind="F", stage=0, microbatch=0, chunk=0, block_start=1, block_end=2, flops=flops,
                   hbm_bytes=hbm, kernels=kernels)


def test_fit_recovers_rates_of_synthetic_ops() -> None:
    """Times made from 10 GFLOP/s, 2 GB/s and 30 us/kernel are fitted back to those figures."""
    ops = [_op(f, b, k) for f in (1e6, 5e6, 2e7) for b in (1e5, 8e5) for k in (3, 8)]
    samples = [(op, op.flops / 10e9 + op.hbm_bytes / 2e9 + op.kernels * 30e-6) for op in ops]
    fit = fit_compute(samples)
    assert fit.peak_flops == pytest.approx(10e9, rel=1e-6)
    assert fit.bandwidth_Bps == pytest.approx(2e9, rel=1e-6)
    assert fit.overhead_s == pytest.approx(30e-6, rel=1e-6)
    assert fit.mean_abs_error < 1e-9


def test_fit_names_a_dropped_term_instead_of_an_infinite_rate() -> None:
    """Ops whose time follows bytes and launches only: the fit drops the FLOP term, and its one-line
    description says so rather than printing 'inf GFLOP/s'; a kept term prints its rate."""
    ops = [_op(f, b, k) for f in (1e6, 5e6, 2e7) for b in (1e5, 8e5) for k in (3, 8)]
    fit = fit_compute([(op, op.hbm_bytes / 2e9 + op.kernels * 30e-6) for op in ops])
    assert fit.peak_flops == float("inf")
    assert fit.describe().startswith("no FLOP term, 2.00 GB/s, 30.0 us per op (fit over 12 ops")
    full = fit_compute([(op, op.flops / 10e9 + op.hbm_bytes / 2e9 + op.kernels * 30e-6) for op in ops])
    assert full.describe().startswith("10.00 GFLOP/s, 2.00 GB/s, 30.0 us per op")


def test_written_profile_loads_with_measured_tables(tmp_path: Path) -> None:
    """A profile built from measurements is self-contained: it loads and returns the measured times."""
    from simgrid.hardware import write_profile

    comm = {"collectives": [("all_reduce", 256, 100e-6), ("all_reduce", 65536, 400e-6),
                            ("reduce_scatter", 256, 120e-6)],
            "p2p": [(256, 50e-6), (65536, 150e-6)], "memory_Bps": 5e9}
    fit = ComputeFit(peak_flops=8e9, bandwidth_Bps=3e9, overhead_s=20e-6, samples=10, mean_abs_error=0.05)
    spec = build_profile(name="test-host", world_size=2, comm=comm, fit=fit, compute_rows=[("F:b1", 123.0)])
    path = write_profile(spec, tmp_path / "host.toml")
    cluster = load_cluster(path, gpus=2)
    measured = cluster.spec.measured
    assert measured is not None
    assert measured.collective_time_us("all_reduce", 2, 256) == pytest.approx(100.0)
    assert measured.collective_time_us("all_reduce", 2, 32896) == pytest.approx(250.0)  # midway, linear
    assert measured.p2p_time_us(256) == pytest.approx(50.0)
    assert cluster.gpu.peak_flops("fp32") == pytest.approx(8e9)
    assert cluster.gpu.kernel_overhead_us == pytest.approx(20.0)
    # Send/recv bandwidth from the two sizes: (65536 - 256) B / 100 us.
    assert cluster.node.intra_link.bandwidth_GBps == pytest.approx((65536 - 256) / 100e-6 / 1e9)


def test_program_message_sizes_are_the_models_own_messages() -> None:
    """The sizes measured besides the grid are those the programs issue: tiny-gpt's TP activation
    all-reduce is one micro-batch's hidden states, b * s * h * 4 bytes = 1 * 32 * 64 * 4, and its PP
    send is the same tensor."""
    from executor.calibrate import calibration_programs, program_message_sizes
    from simgrid.layout.spec import Layout
    from simgrid.model.presets import get_model

    model = get_model("tiny-gpt")
    sizes = program_message_sizes(calibration_programs(model, [
        Layout(tp=2, global_batch_size=1, precision="fp32"),
        Layout(pp=2, schedule="gpipe", global_batch_size=2, precision="fp32")]))
    assert 1 * 32 * 64 * 4 in sizes["all_reduce"]
    assert sizes["send"] == (1 * 32 * 64 * 4,)


@pytest.mark.timeout(120)
def test_communication_is_measured_at_the_sizes_asked_per_kind() -> None:
    """measure_communication times each kind at its own sizes (the grid for the others) in a real
    2-rank gloo world, and send/recv at the "send" sizes."""
    from executor.calibrate import measure_communication

    comm = measure_communication(2, sizes=(256,), sizes_by_kind={"all_reduce": (256, 4096), "send": (1024,)})
    by_kind: dict[str, list[int]] = {}
    for kind, nbytes, seconds in comm["collectives"]:
        assert seconds > 0
        by_kind.setdefault(kind, []).append(nbytes)
    assert by_kind["all_reduce"] == [256, 4096]
    assert all(sizes == [256] for kind, sizes in by_kind.items() if kind != "all_reduce")
    assert [nbytes for nbytes, _ in comm["p2p"]] == [1024]


def test_insitu_synchronous_collectives_replace_the_micro_benchmark_at_their_size() -> None:
    """In-situ samples of a synchronous collective (mean of 2, 3 and 4 ms = 3 ms) replace the
    micro-benchmark's row of the same kind and size, add a row at a size the grid lacks, and leave
    other kinds, other sizes and non-communication samples alone."""
    from executor.calibrate import insitu_collective_key, merge_insitu_collectives

    bench = [("all_reduce", 256, 1e-3), ("all_reduce", 4096, 2e-3), ("all_gather", 4096, 5e-3)]
    samples = [(insitu_collective_key("all_reduce", 4096), t, False) for t in (2e-3, 3e-3, 4e-3)]
    samples += [(insitu_collective_key("all_reduce", 1000), 7e-3, False), ("F:blocks=1-2:flops=10", 9.0, False)]
    rows = {(k, b): t for k, b, t in merge_insitu_collectives(bench, samples)}
    assert rows == pytest.approx({("all_reduce", 256): 1e-3, ("all_reduce", 1000): 7e-3,
                                  ("all_reduce", 4096): 3e-3, ("all_gather", 4096): 5e-3})


@pytest.mark.timeout(120)
def test_insitu_run_times_tensor_parallel_all_reduces_as_synchronous_collectives() -> None:
    """In a real 2-rank TP run the calibration interpreter records each all-reduce waited right after its
    issue under its kind and size (tiny-gpt's activations: b * s * h * 4 = 8192 bytes), with positive
    times, next to the compute samples."""
    from executor.calibrate import insitu_collective_key, insitu_samples
    from simgrid.layout.spec import Layout
    from simgrid.model.presets import get_model
    from simgrid.schedules import build_program

    program = build_program(get_model("tiny-gpt"), Layout(tp=2, global_batch_size=1, precision="fp32"))
    samples = insitu_samples([program], steps=2)
    tp_times = [sec for key, sec, _ in samples if key == insitu_collective_key("all_reduce", 1 * 32 * 64 * 4)]
    assert tp_times and all(sec > 0 for sec in tp_times)
    assert any(key.startswith("F:") for key, _, _ in samples)


def test_calibrate_builds_each_calibration_program_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """calibrate() builds the Program of each calibration layout exactly once and hands the same programs to
    the message sizes, the in-situ runs and the op table. Measurements are stubbed (no processes): each
    compute op "takes" 1 ms per MFLOP + 1 ms per MB + 10 us per kernel, so the fit must recover 1 GFLOP/s,
    1 GB/s and 10 us, the table holds one row per compute op signature of the layouts' programs (built
    independently here) plus the host-speed probe and generation's rows (stubbed; priced on the profile
    calibrated so far, and skipped with ``generation=False``), and the communication grid includes the
    programs' sizes."""
    import executor.calibrate as cal
    from executor.costmodel import compute_key
    from simgrid.ir.jsonio import program_from_json
    from simgrid.model.presets import get_model
    from simgrid.schedules import build_program

    model = get_model("tiny-gpt")
    built: list[object] = []

    def counting_build(model_: object, layout: object) -> object:
        built.append(layout)
        return build_program(model_, layout)  # type: ignore[arg-type]

    def op_seconds(op: Compute) -> float:
        return op.flops / 1e9 + op.hbm_bytes / 1e9 + op.kernels * 10e-6

    def fake_spawn(worker: object, payload: list[tuple[str, int]], config: object) -> list[object]:
        assert worker is cal._insitu_worker
        programs = [program_from_json(text) for text, _ in payload]
        return [[(compute_key(op), op_seconds(op), False) for program in programs for op in program.ranks[rank]
                 if isinstance(op, Compute) and op.device == "gpu"] for rank in range(len(programs[0].ranks))]

    asked: dict[str, tuple[int, ...]] = {}

    def fake_comm(world_size: int, *, sizes_by_kind: dict[str, tuple[int, ...]], **_: object) -> dict[str, object]:
        asked.update(sizes_by_kind)
        return {"collectives": [(k, b, 1e-4 + b * 1e-9) for k, sizes in sizes_by_kind.items() if k != "send"
                                for b in sizes],
                "p2p": [(b, 5e-5 + b * 1e-9) for b in sizes_by_kind["send"]], "memory_Bps": 5e9}

    monkeypatch.setattr(cal, "build_program", counting_build)
    monkeypatch.setattr(cal, "spawn_world", fake_spawn)
    monkeypatch.setattr(cal, "measure_communication", fake_comm)
    monkeypatch.setattr(cal, "measure_slowdown", lambda world_size: 0.1)
    monkeypatch.setattr(cal, "measure_probe", lambda world_size: 0.02)
    priced_on: list[object] = []

    def fake_generation(model_: object, spec_: object, *, world_size: int) -> GenerationFit:
        priced_on.append(spec_)
        return GenerationFit(launch_us=12.0, matrix_gflops=40.0, decode_samples=3, prefill_samples=1,
                             rows=((LAUNCH_KEY, 12e-6), (MATRIX_KEY, 1 / 40)))

    monkeypatch.setattr(cal, "calibrate_generation", fake_generation)

    spec, fit = cal.calibrate(model, world_size=2)

    layouts = cal.calibration_layouts(2)
    assert built == layouts  # once each, in order
    programs = [build_program(model, layout) for layout in layouts]
    keys = {compute_key(op) for p in programs for ops in p.ranks for op in ops
            if isinstance(op, Compute) and op.device == "gpu"}
    measured = spec.measured
    assert measured is not None
    assert {row.key for row in measured.compute} == keys | {cal.PROBE_KEY, LAUNCH_KEY, MATRIX_KEY}
    # Generation is priced on the profile the training calibration wrote (its rows, not yet its own).
    assert len(priced_on) == 1
    first = priced_on[0].measured  # type: ignore[attr-defined]
    assert {row.key for row in first.compute} == keys | {cal.PROBE_KEY}
    assert fit.generation_summary.startswith("generation in situ: 12.0 us per kernel")
    without, _ = cal.calibrate(model, world_size=2, generation=False)
    assert without.measured is not None and {row.key for row in without.measured.compute} == keys | {cal.PROBE_KEY}
    assert len(priced_on) == 1
    assert fit.peak_flops == pytest.approx(1e9, rel=1e-6)
    assert fit.bandwidth_Bps == pytest.approx(1e9, rel=1e-6)
    assert fit.overhead_s == pytest.approx(10e-6, rel=1e-6)
    all_reduce_sizes = {max(1, op.bytes // max(1, op.count)) for p in programs for ops in p.ranks for op in ops
                        if isinstance(op, Collective) and op.kind == "all_reduce"}
    assert all_reduce_sizes and all_reduce_sizes <= set(asked["all_reduce"])
    assert set(cal.COLLECTIVE_SIZES_BYTES) <= set(asked["all_reduce"])
    assert fit.host_drift == 0.0 and fit.drift_warning() == ""  # the stub probe never moves


def test_host_drift_is_the_slower_probe_over_the_faster_one() -> None:
    """20 ms then 25 ms (or 25 then 20): the host moved by 25% during calibration, either way round."""
    assert host_drift(0.020, 0.025) == pytest.approx(0.25)
    assert host_drift(0.025, 0.020) == pytest.approx(0.25)
    assert host_drift(0.020, 0.020) == 0.0


def test_an_unsteady_host_gets_a_warning_that_names_the_drift_and_the_fix() -> None:
    """Above the 15% threshold the fit says so in one line; at or below it, nothing."""
    fit = ComputeFit(peak_flops=1e9, bandwidth_Bps=1e9, overhead_s=1e-5, samples=10, mean_abs_error=0.1,
                     host_drift=0.4)
    assert not fit.host_was_steady
    assert "probe changed by 40% while calibrating" in fit.drift_warning()
    assert "calibrate again on a quiet machine" in fit.drift_warning()
    steady = ComputeFit(peak_flops=1e9, bandwidth_Bps=1e9, overhead_s=1e-5, samples=10, mean_abs_error=0.1,
                        host_drift=HOST_DRIFT_WARNING)
    assert steady.host_was_steady and steady.drift_warning() == ""



def test_measured_series_are_made_non_decreasing_in_size_by_pooling_the_noisy_run() -> None:
    """A 4 ms gloo tick drawn at a small size would make a larger message look faster; the calibration
    pools each violating run to its mean (least-squares monotone fit) per kind, so the written profile
    passes the loader's monotonicity rule. Values worked by hand."""
    from executor.commbench import monotone_in_size

    rows = [("reduce", 4096, 1.2e-3), ("all_reduce", 1024, 1e-4), ("reduce", 1024, 2e-4),
            ("reduce", 16384, 3e-4), ("reduce", 65536, 9e-4), ("all_reduce", 4096, 2e-4)]
    fitted = monotone_in_size(rows)
    assert fitted == [
        ("reduce", 1024, 2e-4),
        ("reduce", 4096, pytest.approx(7.5e-4)),  # (1.2e-3 + 3e-4) / 2
        ("reduce", 16384, pytest.approx(7.5e-4)),
        ("reduce", 65536, 9e-4),
        ("all_reduce", 1024, 1e-4),
        ("all_reduce", 4096, 2e-4),
    ]
