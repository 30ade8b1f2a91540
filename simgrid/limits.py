"""Size limits checked before any work starts, so an absurd request fails in milliseconds with the limit named.

Two limits bound what a run may ask for:

* :data:`MAX_WORLD_SIZE` GPUs. Building a run touches every rank once (process groups, the rank table,
  cluster sizing): about 3 s and 0.4 GB for 131,072 GPUs on this project's 2-core machine, 29 s and
  2.4 GB for 2^20 (measured with ``simgrid simulate --model gpt3-175b --cluster dgx-a100-hdr --tp 8
  --pp 8``). The limit is above the largest training clusters reported (about 100,000 GPUs).
* :data:`MAX_OPS` ops built or simulated, counted with :func:`estimate_ops_per_rank` (an upper estimate,
  so the check needs no program). The engine runs 2-4 x 10^5 ops/s here, so a run at the limit takes
  about a minute; symmetric mode simulates one rank per pipeline stage, so large clusters stay far
  below it, while full mode (every rank) and block granularity on thousands of GPUs may reach it.

The estimate per pipeline rank is ``m * v * (24 u + 32) + 32 b + 64`` for ``m`` micro-batches, ``v``
model chunks per rank, ``u`` compute units per chunk (sub-blocks at block granularity, 1 at stage
granularity) and ``b`` sub-blocks per rank. The constants bound what the lowering passes emit per unit
and micro-batch (compute, recompute, tensor-parallel collectives and their waits, memory events) and per
step (gradient buckets, ZeRO gathers, optimizer); ``tests/test_limits.py`` checks on sampled layouts that
it is never below the built count (it is typically 2-6 times above it).
"""

from __future__ import annotations

import math
from typing import Protocol

from simgrid.errors import LayoutError


class _ModelSizes(Protocol):
    """What the estimate reads of a :class:`simgrid.model.ModelSpec` (a protocol: ``simgrid.layout``
    imports this module, so it must not import the layout or the model back)."""

    @property
    def num_layers(self) -> int: ...


class _LayoutSizes(Protocol):
    """What the estimate reads of a :class:`simgrid.layout.Layout`."""

    @property
    def pp(self) -> int: ...
    @property
    def vpp(self) -> int: ...
    @property
    def world_size(self) -> int: ...
    @property
    def num_microbatches(self) -> int: ...

MAX_WORLD_SIZE = 131_072
"""Largest number of GPUs (dp x tp x pp x cp) a layout may have."""
MAX_OPS = 20_000_000
"""Largest estimated number of ops a program may have in the ranks that are built or simulated."""
MAX_REQUESTS = 100_000
"""Largest number of requests one serving simulation may take (``simgrid serve``): the serving engine runs
about 600 requests/s on this machine (llama2-7b on 2 A100s), so the limit is about three minutes."""

_PER_UNIT = 24
_PER_MICROBATCH = 32
_PER_BLOCK = 32
_FIXED = 64


def check_world_size(world_size: int, *, what: str = "the layout") -> None:
    """Refuse more than :data:`MAX_WORLD_SIZE` GPUs, naming the limit."""
    if world_size > MAX_WORLD_SIZE:
        raise LayoutError(
            f"{what} needs {_count(world_size)} GPUs; the limit is {MAX_WORLD_SIZE:,} (larger than any training cluster "
            "reported); use fewer GPUs"
        )


def estimate_ops_per_rank(model: _ModelSizes, layout: _LayoutSizes, granularity: str) -> int:
    """An upper estimate of the ops one pipeline rank's op list holds (see the module docstring)."""
    stages = layout.pp * layout.vpp
    layers_per_chunk = math.ceil(model.num_layers / stages)
    blocks_per_chunk = 2 * layers_per_chunk + 2  # attention and MLP per layer; embedding and head at the ends
    units = 1 if granularity == "stage" else blocks_per_chunk
    chunks = layout.vpp
    microbatches = layout.num_microbatches
    return microbatches * chunks * (_PER_UNIT * units + _PER_MICROBATCH) + _PER_BLOCK * chunks * blocks_per_chunk \
        + _FIXED


def check_program_size(model: _ModelSizes, layout: _LayoutSizes, granularity: str, *, ranks: int,
                       what: str = "the program") -> None:
    """Refuse a program whose ``ranks`` built or simulated op lists would exceed :data:`MAX_OPS`.

    The message names the estimate, the limit and the levers: fewer micro-batches (a smaller global batch
    or a larger micro-batch), stage granularity, symmetric mode.
    """
    check_world_size(layout.world_size)
    per_rank = estimate_ops_per_rank(model, layout, granularity)
    total = per_rank * ranks
    if total > MAX_OPS:
        levers = ["fewer micro-batches (a smaller --gbs or a larger --mbs)"]
        if granularity != "stage":
            levers.append("--granularity stage")
        if ranks > layout.pp:
            levers.append("--mode symmetric")
        raise LayoutError(
            f"{what} would hold about {_count(total)} ops ({_count(layout.num_microbatches)} micro-batches x {ranks:,} ranks "
            f"at {granularity} granularity); the limit is {_count(MAX_OPS)} ops (about a minute of simulation); use "
            + " or ".join(levers)
        )


def check_request_count(requests: int, *, what: str = "the workload") -> None:
    """Refuse a serving workload of more than :data:`MAX_REQUESTS` requests, naming the limit."""
    if requests > MAX_REQUESTS:
        raise LayoutError(f"{what} has {_count(requests)} requests; the limit is {_count(MAX_REQUESTS)} (about three "
                          "minutes of simulation); use fewer requests")


def check_schedule_size(pp: int, vpp: int, microbatches: int) -> None:
    """Refuse a compute-only pipeline order of more than :data:`MAX_OPS` actions (``simgrid schedule``)."""
    check_world_size(pp, what=f"--pp {pp}")
    actions = 3 * pp * vpp * microbatches  # F and B, or F, I and W, per stage and micro-batch
    if actions > MAX_OPS:
        raise LayoutError(
            f"a schedule of {pp:,} ranks x {vpp:,} chunks x {_count(microbatches)} micro-batches has about "
            f"{_count(actions)} actions; the limit is {_count(MAX_OPS)}; use fewer micro-batches or chunks"
        )


def _count(n: int) -> str:
    """``131,072``, ``2.1e+16`` or ``10^4000``: exact when short, never an overflow when huge."""
    if n < 10**9:
        return f"{n:,}"
    if n.bit_length() < 1000:
        return f"{float(n):.2g}"
    return f"10^{int(n.bit_length() * 0.30103)}"
