"""The GEMM tile model against published, measured GEMM throughputs by full shape (issue 12, gemmcheck).

Usage::

    python benchmarks/gemm_published.py               # print, and write docs/gemm_validation.md
    python benchmarks/gemm_published.py --skip-write  # print only

For each point of :mod:`gemm_published_data` the modelled rate is ``2 m n k / t`` with ``t`` what the simulator
charges for one GEMM kernel: ``gemm_shape_time_s(...)`` on the point's profile plus its ``kernel_overhead_us``
(``simgrid.costs.compute`` adds it per kernel; it matters only for kernels of tens of microseconds). A ``burst`` measurement (one GPU, short loop, boost clock) is compared with the model at
``sustained_clock_fraction = 1`` (the fraction scales only the main loop, as in the model itself); a ``sustained``
one with the profile as shipped. Error = model / measured - 1: positive means the model is faster than the
measurement (optimistic). Each point's ``status`` (see gemm_published_data) says how it is summarised; every
point is printed. On a profile with stream-K the data-parallel-only error is printed beside it.
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

from simgrid.costs import gemm_shape_time_s
from simgrid.hardware import GPUSpec, load_gpu

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the data module lives beside this script
import published_doc_cli
from gemm_published_data import CLASSES, POINTS, GemmPoint, shape_class

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "gemm_validation.md"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Row:
    """One point compared."""

    point: GemmPoint
    modelled_tflops: float
    """The simulator's TFLOP/s for one such GEMM kernel: the tile model's time plus the profile's
    ``kernel_overhead_us``, which :func:`simgrid.costs.compute.op_time_s` charges per kernel."""
    tile_tflops: float
    """The tile model alone (:func:`gemm_shape_time_s`, no per-kernel overhead)."""
    data_parallel_tflops: float | None
    """The same without stream-K, on a profile that has it (``None`` elsewhere): which schedule the data favour."""

    @property
    def error(self) -> float:
        """model / measured - 1 (positive: optimistic)."""
        return self.modelled_tflops / self.point.tflops - 1.0

    @property
    def data_parallel_error(self) -> float | None:
        """The error without stream-K (``None`` on a profile without it)."""
        if self.data_parallel_tflops is None:
            return None
        return self.data_parallel_tflops / self.point.tflops - 1.0


def _gpu(profile: str, regime: str, stream_k: bool, cache: dict[tuple[str, str, bool], GPUSpec]) -> GPUSpec:
    key = (profile, regime, stream_k)
    if key not in cache:
        gpu = load_gpu(profile)
        if regime == "burst":
            gpu = dataclasses.replace(gpu, sustained_clock_fraction=1.0)
        if not stream_k:
            gpu = dataclasses.replace(gpu, matmul=dataclasses.replace(gpu.matmul, stream_k=False))
        cache[key] = gpu
    return cache[key]


def _tflops(p: GemmPoint, gpu: GPUSpec, *, launch: bool = True) -> float:
    seconds = gemm_shape_time_s(p.m, p.n, p.k, gpu, dtype=p.dtype, out_bytes=p.out_bytes)
    if launch:
        seconds += gpu.kernel_overhead_us * 1e-6
    return 2.0 * p.m * p.n * p.k / seconds / 1e12


def compare(points: Iterable[GemmPoint] = POINTS) -> list[Row]:
    """Each point with the model's rate for it."""
    cache: dict[tuple[str, str, bool], GPUSpec] = {}
    rows = []
    for p in points:
        gpu = _gpu(p.profile, p.regime, True, cache)
        dp = _tflops(p, _gpu(p.profile, p.regime, False, cache)) if gpu.matmul.stream_k else None
        rows.append(Row(point=p, modelled_tflops=_tflops(p, gpu), tile_tflops=_tflops(p, gpu, launch=False),
                        data_parallel_tflops=dp))
    return rows


def _stats(rows: Sequence[Row], *, tile_only: bool = False) -> str:
    errors = [r.tile_tflops / r.point.tflops - 1.0 if tile_only else r.error for r in rows]
    if not errors:
        return "| 0 | - | - | - |"
    within = sum(abs(e) <= 0.10 for e in errors)
    return (f"| {len(errors)} | {statistics.mean(errors):+.1%} | {statistics.mean(abs(e) for e in errors):.1%} | "
            f"{within}/{len(errors)} |")


def report(rows: Sequence[Row]) -> str:
    """The markdown report: every point, then the summary by shape class and by GPU."""
    lines = ["| # | GPU | m | n | k | dtype | regime | class | measured | tile model | model + launch | error | "
             "no stream-K | status |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for i, r in enumerate(rows, 1):
        p = r.point
        dp = "-" if r.data_parallel_error is None else f"{r.data_parallel_error:+.1%}"
        lines.append(f"| {i} | {p.gpu} | {p.m} | {p.n} | {p.k} | {p.dtype} | {p.regime} | {shape_class(p)} | "
                     f"{p.tflops:.1f} | {r.tile_tflops:.1f} | {r.modelled_tflops:.1f} | {r.error:+.1%} | {dp} | "
                     f"{p.status} |")
    head = [r for r in rows if r.point.status == "headline"]
    extended = head + [r for r in rows if r.point.status == "variant"]
    lines += ["", "Summary (error = model / measured - 1; + = model faster). Headline = independent points with a "
              "stated GPU variant; extended = headline + points whose GPU variant the source leaves out:", "",
              "| group | points | mean signed | MAE | within 10% |", "|---|---|---|---|---|",
              f"| headline, all {_stats(head)}", f"| headline, tile model only (no launch) {_stats(head, tile_only=True)}",
              f"| extended, all {_stats(extended)}",
              f"| extended, tile model only (no launch) {_stats(extended, tile_only=True)}"]
    for cls in CLASSES:
        lines.append(f"| extended, class {cls} {_stats([r for r in extended if shape_class(r.point) == cls])}")
    for gpu in sorted({r.point.gpu for r in extended}):
        lines.append(f"| extended, GPU {gpu} {_stats([r for r in extended if r.point.gpu == gpu])}")
    lines.append(f"| calibration (circular) {_stats([r for r in rows if r.point.status == 'calibration'])}")
    sk = [r for r in head if r.data_parallel_error is not None and abs(r.data_parallel_error - r.error) > 0.005]
    if sk:
        mean_sk = statistics.mean(r.error for r in sk)
        mean_dp = statistics.mean(r.data_parallel_error or 0.0 for r in sk)
        lines += ["", f"Headline points where stream-K changes the model by more than 0.5%: {len(sk)}; mean error "
                  f"with stream-K {mean_sk:+.1%}, data-parallel only {mean_dp:+.1%}."]
    return "\n".join(lines)


def sources(rows: Sequence[Row]) -> str:
    """Numbered sources and caveats, one per point."""
    out = []
    for i, r in enumerate(rows, 1):
        note = f" {r.point.status.capitalize()}: {r.point.caveat}." if r.point.caveat else ""
        out.append(f"{i}. {r.point.gpu} {r.point.m}x{r.point.n}x{r.point.k}: {r.point.source}.{note}")
    return "\n".join(out)


DOC_HEAD = """# GEMM model against published GEMM measurements

Generated by `python benchmarks/gemm_published.py` (do not edit by hand). Each row is one GEMM `(m x k) @ (k x n)`
whose measured rate a stored public source prints (data and sources: `benchmarks/gemm_published_data.py`);
`tile model` is `2 m n k / simgrid.costs.gemm.gemm_shape_time_s` on the row's profile (H800 on `h100-sxm`, the
same GH100 die); `model + launch` adds the profile's `kernel_overhead_us`, as the simulator does per kernel, and is
what `error` (model / measured - 1, + = model faster) compares. A `burst` row (one GPU, short loop at the boost
clock) is compared with the model at `sustained_clock_fraction = 1`; a `sustained` row (power-limited; on A100 a
short random-data GEMM already is) with the profile as shipped. `no stream-K` is the error with `matmul.stream_k` off (Hopper profiles only).
`status`: `headline` (independent, GPU variant stated), `calibration` (a profile constant was solved from it:
circular), `variant` (the source omits SXM/PCIe/NVL), `not-comparable` (printed only; reason under Sources).

"""


def main(argv: Sequence[str] | None = None) -> int:
    return published_doc_cli.run(sys.modules[__name__], argv)


if __name__ == "__main__":
    sys.exit(main())
