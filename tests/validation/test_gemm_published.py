"""benchmarks/gemm_published*.py: every published GEMM point is well-formed and sourced, and the comparison
script prices a subset, summarises it and writes its doc."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import ModuleType

import pytest
from script_modules import load_benchmark, written_doc

from simgrid.hardware import load_gpu


def _load() -> ModuleType:
    return load_benchmark("gemm_published", "gemm_published_benchmark")


def test_points_are_well_formed_and_sourced() -> None:
    """Positive shapes and rates, a known dtype, regime, status and shape class, a profile that loads, a measured
    rate below the profile's dense peak, a source naming where the number is read, and a caveat exactly when
    the point is not a headline point; at least 20 points, 10 of them headline; fp8 points write an fp8 output."""
    data = _load().POINTS
    module = load_benchmark("gemm_published_data", "gemm_published_data_module")
    assert len(data) >= 20
    assert sum(p.status == "headline" for p in data) >= 10
    for p in data:
        assert min(p.m, p.n, p.k) > 0 and p.tflops > 0, p
        assert p.dtype in ("bf16", "fp16", "fp8") and p.regime in module.REGIMES and p.status in module.STATUSES, p
        assert (p.out_bytes == 1) == (p.dtype == "fp8"), p  # mamf-finder's fp8 runs write fp8; the rest the default
        assert module.shape_class(p) in module.CLASSES
        assert p.tflops < load_gpu(p.profile).peak_flops(p.dtype) / 1e12, p
        assert len(p.source) > 40 and any(ch.isdigit() for ch in p.source), p
        assert bool(p.caveat) == (p.status != "headline"), p
    assert len({(p.gpu, p.m, p.n, p.k, p.regime, p.tflops) for p in data}) == len(data)  # no duplicate


def test_shape_classes_split_at_the_documented_sides() -> None:
    """narrow below 256 rows or columns, skinny up to 1024, small-K below K = 2048, large otherwise."""
    module = load_benchmark("gemm_published_data", "gemm_published_data_classes")
    point = module.POINTS[0]
    cases = {(128, 8192, 8192): "narrow", (512, 8192, 8192): "skinny", (8192, 1024, 256): "skinny",
             (8192, 8192, 1024): "small-K", (2048, 8192, 2048): "large"}
    for (m, n, k), cls in cases.items():
        assert module.shape_class(dataclasses.replace(point, m=m, n=n, k=k)) == cls


def test_compare_prices_burst_points_at_the_boost_clock() -> None:
    """A burst point is priced with sustained_clock_fraction = 1, a sustained one with the profile's: the same
    shape is faster as burst by about 1 / sustained_clock_fraction on a main-loop-bound GEMM; the error is
    model / measured - 1."""
    bench = _load()
    point = next(p for p in bench.POINTS if p.profile == "h100-sxm" and p.regime == "burst" and p.k >= 8192)
    burst, sustained = bench.compare([point, dataclasses.replace(point, regime="sustained")])
    fraction = load_gpu("h100-sxm").sustained_clock_fraction
    assert sustained.modelled_tflops / burst.modelled_tflops == pytest.approx(fraction, rel=0.03)
    assert burst.error == pytest.approx(burst.modelled_tflops / point.tflops - 1)
    assert burst.tile_tflops > burst.modelled_tflops  # the per-kernel overhead only slows it
    assert burst.data_parallel_tflops is not None  # a stream-K profile also prints the data-parallel rate


def test_report_and_doc_on_a_subset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The report lists every point and the summary rows; main() writes the doc (to a temporary path here) with
    the numbered sources, and --skip-write leaves it alone."""
    bench = _load()
    subset = [p for p in bench.POINTS if p.gpu in ("H800", "A100 SXM")][:5]
    monkeypatch.setattr(bench, "POINTS", tuple(subset))
    rows = bench.compare(subset)
    text = bench.report(rows)
    assert text.count("\n| ") >= len(subset) and "| headline, all | " in text and "| extended, class large" in text
    written = written_doc(bench, rows, tmp_path, monkeypatch)
    assert written.startswith("# GEMM model against published") and "## Sources" in written
    assert f"{len(subset)}. " in written
