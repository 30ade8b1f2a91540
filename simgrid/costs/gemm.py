"""Time of one GEMM from its full shape: output tiles quantised onto waves of SMs, a main loop at the
sustained tensor rate and an epilogue that writes the tile to HBM.

A cuBLAS/CUTLASS GEMM gives each thread block (CTA) one ``tile_m x tile_n`` tile of the output; the
blocks run in waves of ``sm_count`` (one large-tile CTA per SM), so a GEMM whose tile count is a little
above a multiple of the SM count pays a whole extra wave (NVIDIA, "Matrix Multiplication Background User's
Guide", DU-09799-001, 2023, sections 2.3 and 3: tile and wave quantization). One tile costs

    t_tile = 2 tm tn k / R_sm  +  tm tn d_out / B_sm

with ``R_sm`` the SM's share of the sustained tensor rate ``R = peak * max_efficiency *
sustained_clock_fraction`` and ``B_sm`` its share of the achievable HBM bandwidth ``B``. The second term is
the epilogue: a non-persistent kernel writes its tile after the main loop, not overlapped with it. The SMs'
tensor cores are private but HBM is one shared resource, so a wave's epilogues cost the bytes its thread blocks
write at ``B``: a partial last wave of ``t`` blocks writes ``t`` tiles, not ``sm_count`` (session 8). Summed
over exactly full waves this is ``flops / R + output_bytes / B``, i.e. an efficiency ``k / (k + k0)`` in
the inner dimension with ``k0 = d_out R / (2 B)``: 252 for an H800's bf16 GEMMs at its measured 758 TFLOP/s
and 3.35 TB/s x 0.9, against 247-262 fitted to the H800 sweep over K at M = N = 8192 (386, 520, 628, 705,
736, 758 TFLOP/s at K = 256 ... 8192; shared/reference/hardware.md; tests/costs/test_gemm.py checks the
whole sweep). The main loop streams its inputs while it computes, so the whole GEMM is also never faster
than reading A and B and writing C once at ``B`` (the roofline's memory ceiling). A GEMM with fewer tiles
than SMs may instead split its inner dimension over more thread blocks (split-K, as CUTLASS's and cuBLAS's
split-K kernels do), paying an fp32 partial tile per slice and a reduction; the cheaper way is taken.

The library picks its kernel per shape among several tiles (256x128, 128x256, 128x128, 256x64, 64x256, 128x64,
64x128, 64x64: DU-09799-001 section 3; cuBLASLt's ``cublasLtMatmulTile_t``), so a shape the profile's tile
quantises badly may run faster on smaller tiles. A smaller tile reuses each operand element it loads over
fewer FLOPs (``2ab / (a + b)`` per element), which is why the guide ranks it less efficient; its main loop is
priced at the profile tile's rate times that reuse ratio (the largest penalty consistent with the large tile
being the preferred one: nothing fitted), and the time is the minimum over the candidates: what a good
heuristic achieves; cuBLAS's own heuristic is not always optimal. On a GPU whose profile says
``matmul.stream_k`` (Hopper: CUTLASS's sm90 stream-K scheduler) the K steps of the last tiles may instead be
shared evenly by persistent CTAs (stream-K, Osama et al., PPoPP 2023), so a partial last wave costs its share of
work plus an fp32 partial-tile fixup rather than a whole wave. Which tiles are shared follows that scheduler's
default heuristic (:func:`stream_k_split`): none when the tail wave is at least half full, as in the published
H100 measurement of a 2.67-wave GEMM, which runs at the data-parallel rate (benchmarks/gemm_published.py).

A GEMM that accumulates into an existing buffer (beta = 1: Megatron-LM's gradient accumulation fusion, whose
weight-gradient GEMM adds into ``main_grad``: ``wgrad_gemm_accum_fp32`` / ``_fp16`` in Megatron-Core's
layers.py, Transformer Engine's ``accumulate=True, out=main_grad``) has an epilogue that reads the C tile and
writes the D tile in the buffer's dtype: ``accumulate_bytes`` each, so ``d_out = 2 x accumulate_bytes`` in the
formula above (8 bytes per element for an fp32 ``main_grad``, 4 for a 16-bit one, against 2 for a fresh 16-bit
output): ``k0`` doubles or quadruples. cuBLAS's epilogue computes ``D = alpha AB + beta C`` (cuBLASLt
``cublasLtMatmul``: C is read when beta != 0); nothing else of the kernel changes.

A profile without a tile (``matmul.tile_m = 0``) or without ``sm_count`` keeps the legacy rule:
``flops / (peak * efficiency(min(m, n, k)))``.
"""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

from simgrid.errors import SimgridError
from simgrid.hardware import GPUSpec

DTYPE_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
"""Bytes per element of a GEMM's operands by compute dtype (tf32 reads fp32 tensors)."""


def output_bytes(dtype: str) -> int:
    """Bytes per output element: the operand width, at least 2 (an fp8 GEMM writes bf16, as Transformer
    Engine's fp8 GEMMs do)."""
    return max(2, DTYPE_BYTES.get(dtype, 2))


def sustained_tensor_flops(gpu: GPUSpec, dtype: str) -> float:
    """``R``: FLOP/s of a GEMM main loop in a long GEMM-heavy phase (peak x efficiency x sustained clock)."""
    return gpu.peak_flops(dtype) * gpu.matmul.efficiency_for(dtype) * gpu.sustained_clock_fraction


def hbm_bytes_per_s(gpu: GPUSpec) -> float:
    """``B``: achievable HBM bandwidth in bytes/s."""
    return gpu.hbm_bandwidth_GBps * 1e9 * gpu.hbm_efficiency


def uses_tile_model(gpu: GPUSpec) -> bool:
    """Whether the profile has what the full-shape model needs (a tile and an SM count)."""
    return gpu.matmul.tiled and gpu.sm_count is not None


def _check_shape(m: int, n: int, k: int, count: int) -> None:
    if min(m, n, k, count) < 0:
        raise SimgridError(f"GEMM shape ({m}, {n}, {k}) x {count} has a negative size; sizes must be >= 0")


class _TileModel(NamedTuple):
    """The few GPU figures the tile model reads (a small hashable key for the GEMM time cache)."""

    rate: float
    """Sustained tensor FLOP/s of a main loop."""
    bandwidth: float
    """Achievable HBM bytes/s."""
    peak: float
    """Dense peak FLOP/s of the dtype."""
    sms: int
    tile_m: int
    tile_n: int
    d_in: int
    d_out: int
    """Bytes the epilogue moves per output element: the output's width, or C read + D written when accumulating."""
    stream_k: bool = False
    """Whether the library has stream-K kernels for this GPU."""


def gemm_shape_time_s(m: int, n: int, k: int, gpu: GPUSpec, *, dtype: str, count: int = 1,
                      accumulate_bytes: int = 0, out_bytes: int = 0) -> float:
    """Seconds of ``count`` GEMMs of shape ``(m x k) @ (k x n)`` launched one after another (each fills its own
    waves; a batched GEMM is listed as one GEMM stacked along ``m``, :mod:`simgrid.model.gemms`).
    ``accumulate_bytes > 0``: each accumulates into a buffer of that element width (its epilogue reads C and
    writes D: module docstring); the legacy rule (no tile) has no epilogue term and ignores it. ``out_bytes > 0``
    overrides the output's element width (an fp8 benchmark that writes an fp8 output, as ml-engineering's
    mamf-finder.py does; training's fp8 GEMMs write 16-bit, :func:`output_bytes`)."""
    _check_shape(m, n, k, count)
    if accumulate_bytes < 0:
        raise SimgridError(f"accumulate_bytes = {accumulate_bytes} must be >= 0 (0: a fresh output)")
    if min(m, n, k, count) == 0:
        return 0.0
    if not uses_tile_model(gpu):
        flops = 2.0 * m * n * k * count
        scale = gpu.matmul.efficiency_for(dtype) / gpu.matmul.max_efficiency
        return flops / (gpu.peak_flops(dtype) * gpu.matmul.efficiency(m, n, k) * scale * gpu.sustained_clock_fraction)
    return count * _tile_time(m, n, k, _tile_model(gpu, dtype, accumulate_bytes, out_bytes))


_MODELS: dict[tuple[int, str, int, int], tuple[GPUSpec, _TileModel]] = {}
"""Tile model per ``(id(gpu), dtype, accumulate_bytes, out_bytes)``. Each entry keeps its GPUSpec alive, so the id cannot be reused by
another object while the entry exists, and the lookup checks identity before trusting it. Keyed by id, not by
the spec itself: hashing a GPUSpec hashes every field (its attention tables included) on every call."""
_MODELS_MAX = 256
"""Entries kept before the cache is emptied (a sweep builds a handful of GPUs; this only bounds memory)."""


def _tile_model(gpu: GPUSpec, dtype: str, accumulate_bytes: int = 0, out_bytes: int = 0) -> _TileModel:
    """The figures :func:`_tile_time` reads for ``gpu`` and ``dtype``, built once per (GPU object, dtype,
    accumulation): a training lowering or a sweep prices thousands of GEMMs on the same spec."""
    key = (id(gpu), dtype, accumulate_bytes, out_bytes)
    hit = _MODELS.get(key)
    if hit is not None and hit[0] is gpu:
        return hit[1]
    assert gpu.sm_count is not None  # uses_tile_model checked it
    model = _TileModel(sustained_tensor_flops(gpu, dtype), hbm_bytes_per_s(gpu), gpu.peak_flops(dtype), gpu.sm_count,
                       gpu.matmul.tile_m, gpu.matmul.tile_n, DTYPE_BYTES.get(dtype, 2),
                       2 * accumulate_bytes if accumulate_bytes else out_bytes or output_bytes(dtype), gpu.matmul.stream_k)
    if len(_MODELS) >= _MODELS_MAX:
        _MODELS.clear()
    _MODELS[key] = (gpu, model)
    return model


MIN_TILE_SIDE = 16
"""Narrowest tile side considered: the tensor cores' MMA is 16 rows tall, and cuBLASLt lists tiles from 8x8 and
16x8 up to 512x64 (``cublasLtMatmulTile_t``), so a skinny GEMM (a decode step's few tokens) is not padded to
a training-size tile."""


def _side(tile: int, dim: int) -> int:
    """The tile side used along a dimension: the profile's large tile, or, for a dimension shorter than it,
    the next power of two that covers it (at least 16): cuBLAS has narrower kernels (256x64, 64x256 and
    smaller) for such shapes rather than padding a 64-wide matrix to 128 or 256."""
    if dim >= tile:
        return tile
    side = MIN_TILE_SIDE
    while side < dim:
        side *= 2
    return min(side, tile)


MIN_SPLIT_K = 256
"""Shortest slice of the inner dimension a split-K GEMM gives one thread block."""
PARTIAL_BYTES = 4
"""A split-K slice writes its partial tile in fp32 for the reduction."""
MIN_CANDIDATE_SIDE = 64
"""Smallest side of the smaller training tiles cuBLAS chooses among (the guide's list ends at 64 x 64)."""
STREAM_K_BLOCK_K = 64
"""Inner-dimension step of one stream-K work unit: the K extent of a Hopper bf16 CTA tile (CUTLASS's sm90
kernels use 64 for 16-bit operands: 128 bytes, one TMA swizzle row); a 1-byte (fp8) operand takes twice as many
elements per 128-byte row (:func:`_stream_k_block_k`)."""


def _stream_k_block_k(operand_bytes: int) -> int:
    """K elements of one stream-K step: 128 bytes of a 1-byte operand, :data:`STREAM_K_BLOCK_K` otherwise."""
    return 2 * STREAM_K_BLOCK_K if operand_bytes == 1 else STREAM_K_BLOCK_K
STREAM_K_MIN_STEPS = 8
"""Fewest K steps CUTLASS's sm90 stream-K scheduler gives one unit (``min_iters_per_sk_unit_ = 8``,
tile_scheduler_params.h); a tile with no more steps than this is never split."""


def _reuse(a: int, b: int) -> float:
    """FLOPs per operand element an ``a x b`` tile's main loop gets from each element it loads: each K step
    loads ``(a + b)`` elements of A and B for ``2 a b`` FLOPs (the arithmetic intensity of the tile against
    shared memory / L2, up to the operand width)."""
    return 2.0 * a * b / (a + b)


def _candidates(tile_m: int, tile_n: int, m: int, n: int) -> tuple[tuple[int, int], ...]:
    """Output tiles the library chooses among for an ``m x n`` output: the profile's (most efficient) tile in
    both orientations and every tile whose sides are powers of two from its long side down to 64 and whose
    area is no larger (256x128, 128x256, 256x64, 64x256, 128x128, 128x64, 64x128, 64x64 for a 256x128
    profile: the cuBLAS tile list of DU-09799-001 section 3 and cuBLASLt's ``cublasLtMatmulTile_t``; CUTLASS
    instantiates the same CTA shapes). Each side is then narrowed for a short dimension (:func:`_side`)."""
    long_side = max(tile_m, tile_n)
    sides = [long_side]
    while sides[-1] // 2 >= MIN_CANDIDATE_SIDE:
        sides.append(sides[-1] // 2)
    out: list[tuple[int, int]] = []
    for a in sides:
        for b in sides:
            if a * b <= tile_m * tile_n:
                pair = (_side(a, m), _side(b, n))
                if pair not in out:
                    out.append(pair)
    return tuple(out)


@lru_cache(maxsize=65536)
def _tile_time(m: int, n: int, k: int, g: _TileModel) -> float:
    # Efficiency by data reuse: the profile's tile reaches the measured main-loop rate ``g.rate``; the guide
    # (DU-09799-001 section 3) ranks smaller tiles as less efficient because they reuse each loaded operand
    # over fewer FLOPs. We take the profile's tile to sit at the operand-feed limit (were it not, a smaller
    # tile would be as fast and the library would not prefer the large one), so a smaller tile's main loop
    # runs at ``g.rate`` x its reuse over the reference tile's (narrowed to the same short dimensions), at
    # most ``g.rate``. This is an upper bound on the penalty: no constant is fitted.
    ref = max(_reuse(_side(g.tile_m, m), _side(g.tile_n, n)), _reuse(_side(g.tile_n, m), _side(g.tile_m, n)))
    best = float("inf")
    for a, b in _candidates(g.tile_m, g.tile_n, m, n):
        rate = g.rate * min(1.0, _reuse(a, b) / ref)
        tiles = -(-m // a) * -(-n // b)
        split = 1
        while True:
            # Split-K (CUTLASS/cuBLAS): with fewer tiles than SMs the inner dimension is cut into ``split``
            # slices run by separate thread blocks, which write fp32 partial tiles that a reduction sums.
            slice_k = -(-k // split)
            waves = -(-(tiles * split) // g.sms)
            partial = g.d_out if split == 1 else PARTIAL_BYTES
            # Main loops at the SM's share of the tensor rate, wave after wave; the epilogues' writes share the
            # whole HBM bandwidth among the thread blocks that make them, so a partial last wave writes only
            # its own tiles (for full waves this is ``waves x sms`` tile writes, as before).
            seconds = waves * 2.0 * a * b * slice_k / rate * g.sms + tiles * split * a * b * partial / g.bandwidth
            if split > 1:
                seconds += tiles * a * b * (PARTIAL_BYTES * split + g.d_out) / g.bandwidth
            best = min(best, seconds)
            split *= 2
            if tiles * split > g.sms or k // split < MIN_SPLIT_K:
                break
        if g.stream_k:
            best = min(best, _stream_k_time(tiles, a, b, k, rate, g))
    memory_s = ((m * k + k * n) * g.d_in + m * n * g.d_out) / g.bandwidth
    return max(best, memory_s, 2.0 * m * n * k / g.peak)


def stream_k_split(tiles: int, k_steps: int, sms: int) -> tuple[int, int, int]:
    """``(dp_waves, sk_tiles, sk_units)`` of CUTLASS's sm90 stream-K scheduler in its default ``Heuristic`` mode
    (``PersistentTileSchedulerSm90StreamKParams::get_num_sk_tiles`` and ``get_num_sk_units``,
    include/cutlass/gemm/kernel/tile_scheduler_params.h, NVIDIA/cutlass commit 0046e36): no stream-K when the tiles
    fill whole waves, when a tile has at most ``STREAM_K_MIN_STEPS`` K steps, or when the tail wave is at least half
    full; otherwise the tail wave and the last full wave are shared (``dp_waves`` = full waves - 1) by at most one
    unit per SM, each unit taking at least ``STREAM_K_MIN_STEPS`` steps. ``sk_tiles == 0`` means data-parallel."""
    full_waves, tail = divmod(tiles, sms)
    if tail == 0 or k_steps <= STREAM_K_MIN_STEPS or 2 * tail >= sms:
        return full_waves, 0, 0
    dp_waves = full_waves - 1 if full_waves > 1 else 0
    sk_tiles = tiles - dp_waves * sms
    return dp_waves, sk_tiles, min(sms, sk_tiles * k_steps // STREAM_K_MIN_STEPS)


def _stream_k_time(tiles: int, a: int, b: int, k: int, rate: float, g: _TileModel) -> float:
    """Seconds of ``tiles`` ``a x b`` tiles under the stream-K schedule (infinite when the scheduler's heuristic
    keeps them data-parallel). Stream-K (Osama et al., PPoPP 2023): persistent CTAs share the K steps of the stream-K
    tiles evenly, so the tail costs its share of work instead of a whole wave; a CTA that ends inside a tile writes
    an fp32 partial that the tile's finishing CTA reads back (fixup)."""
    steps = -(-k // _stream_k_block_k(g.d_in))
    dp_waves, sk_tiles, sk_units = stream_k_split(tiles, steps, g.sms)
    if sk_tiles == 0 or sk_units == 0:
        return float("inf")
    wave = (2.0 * a * b * k / rate + a * b * g.d_out / g.bandwidth) * g.sms  # a full wave: every SM writes a tile
    per_unit = -(-(sk_tiles * steps) // sk_units)
    # The stream-K phase writes each of its tiles once and each unit's fp32 partial once, read back once; those
    # bytes share the whole HBM bandwidth (not ``sms`` fixed slices), as the data-parallel epilogue does.
    sk = (per_unit * 2.0 * a * b * (k / steps) / rate * g.sms + sk_tiles * a * b * g.d_out / g.bandwidth
          + 2 * sk_units * a * b * PARTIAL_BYTES / g.bandwidth)
    return dp_waves * wave + sk


def gemm_efficiency(m: int, n: int, k: int, gpu: GPUSpec, *, dtype: str) -> float:
    """Fraction of the dtype's peak one ``(m, n, k)`` GEMM reaches (tile model or legacy curve)."""
    _check_shape(m, n, k, 1)
    if min(m, n, k) == 0:
        return gpu.matmul.efficiency_for(dtype) * gpu.sustained_clock_fraction
    return 2.0 * m * n * k / (gpu.peak_flops(dtype) * gemm_shape_time_s(m, n, k, gpu, dtype=dtype))


def gemms_time_s(gemms: tuple[tuple[int, int, int, int], ...], gpu: GPUSpec, *, dtype: str,
                 accumulate_bytes: int = 0, streams: int = 1) -> float:
    """Seconds of a list of ``(m, n, k, count)`` GEMMs run one after another on one stream (each accumulating into
    an ``accumulate_bytes``-wide buffer when that is > 0).

    ``streams > 1``: each GEMM runs while ``streams - 1`` equal ones run on other streams (Transformer Engine's
    userbuffers chunk GEMMs, issued round-robin on up to 3 compute streams:
    ``_stream_compute[i % _stream_compute.size()]`` in ``split_overlap_ag`` / ``split_overlap_rs``,
    transformer_engine/pytorch/csrc/comm_gemm_overlap.h at v1.9; how many run together under one hardware queue
    is the lowering's, :mod:`simgrid.schedules.lower.tp_overlap`). The block scheduler hands an SM freed by one
    kernel to a resident kernel of another stream (CUDA C++ Programming Guide, "Concurrent Kernel Execution"),
    so the kernels' thread blocks fill waves together: each is priced as its share of one GEMM with ``streams``
    times its rows (whose tiles are the union of theirs when the rows are whole tiles, as the 512- and 1024-row
    chunks of the Megatron rows are), or as alone where that is less: sharing the SMs with independent kernels
    does not make a kernel slower than running alone after them (to first order)."""
    if streams < 1:
        raise SimgridError(f"streams = {streams} must be >= 1 (1: a GEMM alone on its stream)")
    if streams == 1:
        return sum(gemm_shape_time_s(m, n, k, gpu, dtype=dtype, count=c, accumulate_bytes=accumulate_bytes)
                   for m, n, k, c in gemms)
    return sum(min(gemm_shape_time_s(m * streams, n, k, gpu, dtype=dtype, count=c, accumulate_bytes=accumulate_bytes)
                   / streams, gemm_shape_time_s(m, n, k, gpu, dtype=dtype, count=c, accumulate_bytes=accumulate_bytes))
               for m, n, k, c in gemms)
