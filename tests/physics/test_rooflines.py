"""Physics over a few hundred random layouts: no simulated op beats its roofline and no step is shorter than
any resource's busy time.

Each case draws (seeded) a model preset cut to a few layers, a cluster and a layout (tp, pp, vpp, dp, cp,
ZeRO stage, micro-batch size and count, schedule, recompute, sequence parallelism, FlashAttention and its
kernel, fused or eager element-wise kernels); a further set on the fp8 GPUs (H100, H200) adds Transformer
Engine fp8 (delayed or current scaling). In every simulated trace:

* a compute op lasts at least its FLOPs at the dtype's peak (its fp8 GEMMs' at the fp8 peak) and its
  memory-bound bytes at the HBM line rate (the two ceilings of the roofline; Williams, Waterman & Patterson 2009);
* a collective over ``n`` ranks moves at least ``(n - 1) / n`` of its bytes in or out of each member (the
  reduce-scatter / all-gather lower bound, which in-switch reduction does not beat either), at most at the
  sum of the GPU's NVLink, NIC share and PCIe line rates; a send or receive moves its bytes at most at the
  fastest of those links;
* each stream of each simulated rank (compute, every communication stream) is busy for no longer than the
  step lasts, since a stream runs its ops one after another.
"""

from __future__ import annotations

import dataclasses
import random
from collections import defaultdict

import pytest

from simgrid.errors import SimgridError
from simgrid.hardware import load_cluster
from simgrid.ir import Collective, Compute, Recv, Send, parse_op
from simgrid.layout import Layout, check_layout
from simgrid.model import get_model
from simgrid.simulation import simulate

MODELS = ("gpt2-small", "megatron-1.7b", "llama2-7b", "llama3-8b", "gpt3-175b")
CLUSTERS = ("dgx-a100-hdr", "dgx-h100-ndr", "hgx-h200-ndr", "dgx-a100-40gb-hdr", "dgx1-v100-edr", "rtx4090-10gbe")
CASES = 240
FP8_CASES = 40
"""Extra cases, drawn after the others, on the fp8 clusters with an fp8 recipe."""
FP8_CLUSTERS = ("dgx-h100-ndr", "hgx-h200-ndr")
TOL = 1e-9


def _draw(rng: random.Random) -> tuple[object, str, Layout] | None:
    """One random (model, cluster, layout), or None when the draw breaks a layout rule."""
    base = get_model(rng.choice(MODELS))
    model = dataclasses.replace(base, num_layers=rng.choice((2, 4, 8)), seq_length=rng.choice((512, 1024, 2048)))
    cluster = rng.choice(CLUSTERS)
    tp = rng.choice((1, 2, 4, 8))
    pp = rng.choice((1, 1, 2, 4))
    schedule = "none" if pp == 1 else rng.choice(("gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zbv"))
    vpp = 2 if schedule in ("interleaved-1f1b", "zbv") else 1
    dp = rng.choice((1, 2, 4))
    cp = rng.choice((1, 1, 1, 2))
    mbs = rng.choice((1, 2))
    micro = rng.choice((1, 2, 4, 8)) * (pp if vpp > 1 else 1)
    flash = rng.random() < 0.5
    recompute = rng.choice(("none", "full") if flash else ("none", "selective", "full"))
    zero = rng.choice((0, 1) if pp > 1 else (0, 1, 2, 3))
    precision = "fp16" if cluster == "dgx1-v100-edr" else "bf16"
    try:
        layout = Layout(tp=tp, pp=pp, vpp=vpp, dp=dp, cp=cp, zero=zero, micro_batch_size=mbs,
                        global_batch_size=mbs * dp * micro, schedule=schedule, recompute=recompute,  # type: ignore[arg-type]
                        sequence_parallel=tp > 1 and rng.random() < 0.5, flash_attention=flash,
                        attention_kernel=rng.choice(("auto", "fa2", "fa3")) if cluster in ("dgx-h100-ndr", "hgx-h200-ndr")
                        else "auto", kernel_fusion=rng.choice(("fused", "eager", "eager-fused-norm")),  # type: ignore[arg-type]
                        precision=precision)  # type: ignore[arg-type]
        check_layout(model, layout)
        if cluster == "rtx4090-10gbe" and layout.world_size > 48 * 2:
            return None
    except SimgridError:
        return None
    return model, cluster, layout


def _cases() -> list[tuple[object, str, Layout]]:
    rng = random.Random(20240712)
    out: list[tuple[object, str, Layout]] = []
    while len(out) < CASES:
        case = _draw(rng)
        if case is not None:
            out.append(case)
    fp8 = 0
    while fp8 < FP8_CASES:
        case = _draw(rng)
        if case is not None and case[1] in FP8_CLUSTERS:
            recipe = ("delayed", "current")[fp8 % 2]
            out.append((case[0], case[1], dataclasses.replace(case[2], fp8_recipe=recipe)))
            fp8 += 1
    return out


def _op(row: object) -> object:
    op = row.op  # type: ignore[attr-defined]
    return parse_op(op) if isinstance(op, str) else op


def _link_rates_Bps(cluster_name: str, gpus: int) -> tuple[float, float]:
    """(sum, max) of one GPU's line rates into NVLink/PCIe fabric, its NIC share and PCIe, in bytes/s."""
    node = load_cluster(cluster_name, gpus=gpus).node
    nic = node.nic_link.bandwidth_GBps * node.nics_per_node / node.gpus_per_node
    rates = [node.intra_link.bandwidth_GBps, nic, node.pcie_link.bandwidth_GBps]
    return sum(rates) * 1e9, max(rates) * 1e9


@pytest.mark.parametrize("chunk", range(4))
def test_no_op_beats_its_roofline_and_no_stream_outlasts_the_step(chunk: int) -> None:
    """A quarter of the random cases per test (so a failure names a smaller set); see the module docstring."""
    cases = _cases()[chunk::4]
    for model, cluster, layout in cases:
        result = simulate(model, cluster, layout)  # type: ignore[arg-type]
        gpu = load_cluster(cluster, gpus=layout.world_size).gpu
        peak = gpu.peak_flops(layout.precision)
        peak_fp8 = gpu.peak_tflops.get("fp8", 0.0) * 1e12
        hbm = gpu.hbm_bandwidth_GBps * 1e9
        total_rate, best_rate = _link_rates_Bps(cluster, layout.world_size)
        step = result.metrics.step_time_s
        where = f"{model.name} (L={model.num_layers}, s={model.seq_length}) on {cluster}: {layout}"  # type: ignore[attr-defined]
        fp8_ops = 0
        for rank in result.trace.ranks():
            busy: dict[str, float] = defaultdict(float)
            for row in result.trace.rows_of(rank):
                if row.kind == "WAIT":
                    continue
                busy[row.stream] += row.duration_s
                op = _op(row)
                if isinstance(op, Compute) and op.device == "gpu":
                    fp8_flops = sum(2.0 * m * n * k * c for m, n, k, c in op.fp8_gemms + op.fp8_accumulate_gemms)
                    tensor = (op.flops - fp8_flops) / peak + (fp8_flops / peak_fp8 if fp8_flops else 0.0)
                    floor = max(tensor, op.hbm_bytes / hbm)
                    fp8_ops += bool(fp8_flops)
                    assert row.duration_s >= floor * (1 - TOL), f"{where}: {op} ran in {row.duration_s} < {floor}"
                elif isinstance(op, Collective):
                    n = len(result.program.groups[op.group])
                    if n > 1:
                        floor = (n - 1) / n * op.bytes / total_rate
                        assert row.duration_s >= floor * (1 - TOL), f"{where}: {op} ran in {row.duration_s} < {floor}"
                elif isinstance(op, Send | Recv):
                    floor = op.bytes / best_rate
                    assert row.duration_s >= floor * (1 - TOL), f"{where}: {op} ran in {row.duration_s} < {floor}"
            for stream, seconds in busy.items():
                assert seconds <= step * (1 + TOL), f"{where}: rank {rank} stream {stream} busy {seconds} > step {step}"
        assert (fp8_ops > 0) == (layout.fp8_recipe != "none"), f"{where}: {fp8_ops} ops with fp8 GEMMs"


def test_fp8_moe_step_is_below_16_bit_and_above_its_fp8_roofline() -> None:
    """Mixtral 8x7B cut to 4 layers on 8 H100s (ep 8): fp8 (either recipe) is faster than bf16, since the expert
    and attention GEMMs run at the fp8 rate, but slower than the step's model FLOPs at the fp8 peak, since the
    router, the head, the attention core, the casts, padding copies and all-to-alls are not free."""
    from simgrid.hardware import load_gpu
    from simgrid.model import model_flops_per_iteration

    model = dataclasses.replace(get_model("mixtral-8x7b"), num_layers=4)
    base = Layout(dp=8, ep=8, micro_batch_size=1, global_batch_size=16, flash_attention=True, zero=1)
    bf16 = simulate(model, "dgx-h100-ndr", base).metrics.step_time_s
    roofline = model_flops_per_iteration(model, 16) / 8 / load_gpu("h100-sxm").peak_flops("fp8")
    for recipe in ("delayed", "current"):
        fp8 = simulate(model, "dgx-h100-ndr", dataclasses.replace(base, fp8_recipe=recipe)).metrics.step_time_s
        assert roofline < fp8 < bf16
