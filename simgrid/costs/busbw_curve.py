"""Message-size efficiency of intra-node collectives, read from a published nccl-tests curve.

Why: NCCL's tuner model (:mod:`simgrid.costs.nccl`) is latency plus bytes at the large-message bandwidth.
Inside one NVSwitch node published curves fall well below it at medium sizes: Azure's 8x A100 all_reduce
reaches 109 GB/s busbw at 16 MiB and 167 at 64 MiB against a 231 GB/s plateau, where the tuner model
gives 164 and 207 (Azure/AI-benchmarking-guide, Azure_Results/ND_A100_v4_results.md, "NCCL Bandwidth").
NCCL's source shows where such losses can come from (at medium sizes NVLS cuts its chunk from 128 KiB to
64/32/16 KiB, ``calcCollChunking`` in src/enqueue.cc at 5067397; ring and tree calls below
``nChannels * nThreads * threadThreshold`` bytes drop channels and threads, ``topoGetAlgoInfo``), but
the cost of a chunk's synchronisation and of one channel's copy rate are not published, and the channel
rule alone acts below ~1 MiB, not at the 4-64 MiB where the gap is largest. So the curve itself is the
input (the issue's permitted route), one per GPU fabric.

The key: bytes per rank, ``x = S / n``. A ring all-reduce of S on n ranks is 2(n-1) steps in which
every rank sends S/n (per channel S/(n c)); an all-gather or reduce-scatter of S is n-1 such steps;
NVLS has every rank reduce and multicast its S/n share. nccl-tests' busbw divides the time by exactly
those step counts, so a curve measured as busbw(S) on ``ranks`` GPUs says: a step moving x bytes per
rank runs at ``busbw(x * ranks) / plateau`` of the large-message rate. That carries to all-gather and
reduce-scatter (same steps, half as many) and to 2- and 4-GPU groups on the same fabric (same step
size, fewer steps), which a key on S alone would not: an 8-GPU 8 MiB all-reduce and a 2-GPU 2 MiB one
move the same 1 MiB per step.

Between the curve's points the fraction is linear in log2(x). Above its largest point it is 1 (the
plateau). Below its smallest the per-step time stays that of the smallest point (a step does not get
faster than the smallest measured one: the fraction falls in proportion to x).
"""

from __future__ import annotations

import functools
import math

from simgrid.hardware.busbw_curve import BusbwCurve
from simgrid.hardware.rules import piecewise_linear


@functools.lru_cache(maxsize=64)
def _points(curve: BusbwCurve) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(log2 of bytes per rank, fraction of the plateau) at the curve's points."""
    plateau = curve.busbw_GBps[-1]  # the largest: the curve never decreases
    xs = tuple(math.log2(size / curve.ranks) for size in curve.bytes)
    return xs, tuple(bw / plateau for bw in curve.busbw_GBps)


def size_fraction(curve: BusbwCurve, bytes_per_rank: float) -> float:
    """Fraction of the large-message bus bandwidth a collective step of ``bytes_per_rank`` reaches."""
    if bytes_per_rank <= 0:
        return 1.0
    xs, fractions = _points(curve)
    x = math.log2(bytes_per_rank)
    if x >= xs[-1]:
        return 1.0
    if x <= xs[0]:
        return fractions[0] * 2 ** (x - xs[0])
    return piecewise_linear(xs, fractions, x)
