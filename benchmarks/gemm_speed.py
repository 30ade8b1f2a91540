"""Cost of pricing one GEMM with :func:`simgrid.costs.gemm.gemm_shape_time_s`: the per-(GPU, dtype) tile-model
cache against rebuilding the model on every call (what the function did before the cache).

Usage::

    python benchmarks/gemm_speed.py             # 5 rounds, medians printed
    python benchmarks/gemm_speed.py --rounds 9

Two measurements, each run both ways in the same process and interleaved round by round, so machine load
hits both alike (compare the ratio, not the absolute times):

* ``calls``: 200,000 calls on a gpt3-175b (tp 8) block's GEMM shapes on an H100 profile. Every shape is
  already in :func:`_tile_time`'s cache, so this is the per-call overhead the tile-model cache removes.
* ``build``: building the gpt3-175b (tp 8, pp 8) training program at block granularity, the lowering that
  prices every GEMM of every op.

"Rebuild" replaces the module's ``_tile_model`` with a function that constructs the ``_TileModel`` each
time (the old code path, copied below); "cached" is the shipped function. A report, not a test.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

from simgrid.costs import gemm
from simgrid.hardware import GPUSpec, load_gpu

SHAPES = ((4096, 4608, 12288), (4096, 12288, 1536), (4096, 6144, 12288), (4096, 12288, 6144),
          (12288, 4608, 4096), (4096, 4608, 12288), (12288, 6144, 4096), (4096, 12288, 6144))
"""(m, n, k) of gpt3-175b's QKV, projection, FC1 and FC2 GEMMs at tp 8, 2 sequences of 2048 (forward and
backward shapes)."""
CALLS = 200_000


def _rebuild(gpu: GPUSpec, dtype: str) -> gemm._TileModel:
    """The old path: the tile model constructed on every call."""
    assert gpu.sm_count is not None
    return gemm._TileModel(gemm.sustained_tensor_flops(gpu, dtype), gemm.hbm_bytes_per_s(gpu), gpu.peak_flops(dtype),
                           gpu.sm_count, gpu.matmul.tile_m, gpu.matmul.tile_n, gemm.DTYPE_BYTES.get(dtype, 2),
                           gemm.output_bytes(dtype), gpu.matmul.stream_k)


def _calls(gpu: GPUSpec) -> float:
    start = time.perf_counter()
    n = len(SHAPES)
    for i in range(CALLS):
        m, nn, k = SHAPES[i % n]
        gemm.gemm_shape_time_s(m, nn, k, gpu, dtype="bf16")
    return time.perf_counter() - start


def _build() -> float:
    from simgrid.layout import Layout
    from simgrid.model import get_model
    from simgrid.schedules import build_program

    model = get_model("gpt3-175b")
    layout = Layout(dp=2, tp=8, pp=8, micro_batch_size=1, global_batch_size=32, schedule="1f1b")
    start = time.perf_counter()
    build_program(model, layout, granularity="block")
    return time.perf_counter() - start


def _both(measure: Callable[[], float], rounds: int) -> tuple[float, float]:
    cached_fn = gemm._tile_model
    old, new = [], []
    for _ in range(rounds):
        gemm._tile_model = _rebuild
        try:
            old.append(measure())
        finally:
            gemm._tile_model = cached_fn
        new.append(measure())
    return statistics.median(old), statistics.median(new)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    gpu = load_gpu("h100-sxm")
    _calls(gpu)  # fill _tile_time's cache for these shapes
    _build()
    print(f"{'measurement':<34} {'rebuild (old)':>14} {'cached (new)':>13} {'ratio':>7}")
    for name, measure in ((f"calls ({CALLS:,} gemm_shape_time_s)", lambda: _calls(gpu)),
                          ("build (gpt3-175b tp8 pp8, block)", _build)):
        old, new = _both(measure, args.rounds)
        print(f"{name:<34} {old:>13.3f}s {new:>12.3f}s {old / new:>6.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
