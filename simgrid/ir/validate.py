"""Static checks of a program before anything runs it.

:func:`validate_program` collects every problem it finds (up to :data:`MAX_PROBLEMS`) and raises one
:class:`~simgrid.errors.ProgramError` listing them, each naming the rank, the op index and the op text,
so a broken generator shows all its mistakes at once. Deadlocks that only show up when ops are
interleaved in time are the dry run's job (:mod:`simgrid.ir.dryrun`).
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict

from simgrid.errors import ProgramError
from simgrid.ir.ops import Alloc, Collective, Compute, Free, Op, P2PKey, Recv, Send, Transfer, Wait
from simgrid.ir.program import HANDLE_OP_TYPES, Program
from simgrid.ir.text import format_op
from simgrid.layout.spec import Layout

MAX_PROBLEMS = 50
"""Problems listed in one error; the rest are counted."""
MAX_OP_BYTES = 2**44
"""Largest message or buffer one op may name (16 TiB): more than any device's memory, so a larger value is
a corrupted or hand-edited file (the executor would try to allocate it)."""

_ROOTED = ("broadcast", "reduce")


class _Problems:
    def __init__(self) -> None:
        self.items: list[str] = []
        self.total = 0

    def add(self, message: str) -> None:
        self.total += 1
        if len(self.items) < MAX_PROBLEMS:
            self.items.append(message)

    def at(self, rank: int, index: int, op: Op, message: str) -> None:
        self.add(f"rank {rank} op {index} `{_op_text(op)}`: {message}")

    def raise_if_any(self) -> None:
        if not self.total:
            return
        lines = [f"program failed validation with {self.total} problem(s):"]
        lines += [f"  - {m}" for m in self.items]
        if self.total > len(self.items):
            lines.append(f"  ... and {self.total - len(self.items)} more")
        raise ProgramError("\n".join(lines))


def _op_text(op: Op) -> str:
    """The op's text form, or its repr when a field cannot be written (an infinite cost, a huge integer)."""
    try:
        return format_op(op)
    except ProgramError:
        return repr(op)


def validate_program(program: Program) -> None:
    """Raise :class:`ProgramError` listing every rule the program breaks; return ``None`` if it is sound."""
    problems = _Problems()
    _check_groups(program, problems)
    _check_ops(program, problems)
    _check_collective_sequences(program, problems)
    _check_point_to_point(program, problems)
    problems.raise_if_any()


def _check_groups(program: Program, problems: _Problems) -> None:
    world = program.world_size
    for name, members in program.groups.items():
        bad = [r for r in members if not 0 <= r < world]
        if bad:
            problems.add(f"group {name!r} lists rank(s) {bad} outside the world of {world} ranks (0..{world - 1})")
        if len(set(members)) != len(members):
            problems.add(f"group {name!r} lists a rank more than once: {list(members)}")
        if not members:
            problems.add(f"group {name!r} has no members")


def _check_ops(program: Program, problems: _Problems) -> None:
    """Per-rank rules: field sanity, groups, handles, waits and memory."""
    world = program.world_size
    members = {name: set(ranks) for name, ranks in program.groups.items()}
    layout = program.layout
    max_block = 2 * program.model.num_layers + 2 if program.model is not None else None
    for rank, ops in enumerate(program.ranks):
        issued: dict[str, int] = {}
        waited: dict[str, int] = {}
        live: dict[str, int] = {}
        for index, op in enumerate(ops):
            if isinstance(op, HANDLE_OP_TYPES):
                handle = op.handle  # type: ignore[union-attr]
                if handle in issued:
                    problems.at(
                        rank,
                        index,
                        op,
                        f"handle {handle!r} already used by op {issued[handle]}; handles must be unique within a rank",
                    )
                else:
                    issued[handle] = index
                _check_bytes(rank, index, op, op.bytes, problems)  # type: ignore[union-attr]
            if isinstance(op, Compute):
                _check_compute(rank, index, op, problems, max_block, layout)
            elif isinstance(op, (Send, Recv)):
                if not 0 <= op.peer < world:
                    problems.at(rank, index, op, f"peer {op.peer} is not a rank (world has {world} ranks)")
                elif op.peer == rank:
                    problems.at(
                        rank, index, op, "peer is the issuing rank itself; a pipeline transfer needs another rank"
                    )
            elif isinstance(op, Collective):
                group = members.get(op.group)
                if group is None:
                    problems.at(rank, index, op, f"group {op.group!r} is not in the program's group table")
                elif rank not in group:
                    problems.at(
                        rank,
                        index,
                        op,
                        f"rank {rank} is not a member of group {op.group!r} {list(program.groups[op.group])}",
                    )
                if op.count < 1:
                    problems.at(rank, index, op, f"count = {op.count} must be >= 1")
                if op.kind in _ROOTED:
                    if op.root is None:
                        problems.at(rank, index, op, f"{op.kind} needs a root rank (root=...)")
                    elif group is not None and op.root not in group:
                        problems.at(rank, index, op, f"root {op.root} is not a member of group {op.group!r}")
                elif op.root is not None:
                    problems.at(rank, index, op, f"{op.kind} takes no root; drop root={op.root}")
            elif isinstance(op, Wait):
                if op.handle not in issued:
                    problems.at(
                        rank,
                        index,
                        op,
                        f"waits on handle {op.handle!r}, which no earlier op on rank "
                        f"{rank} issued; issue the op before waiting on it",
                    )
                elif op.handle in waited:
                    problems.at(
                        rank,
                        index,
                        op,
                        f"handle {op.handle!r} was already waited on by op "
                        f"{waited[op.handle]}; wait on each handle once",
                    )
                else:
                    waited[op.handle] = index
            elif isinstance(op, Alloc):
                _check_bytes(rank, index, op, op.bytes, problems)
                if op.name in live:
                    problems.at(
                        rank,
                        index,
                        op,
                        f"buffer {op.name!r} is still live (allocated by op "
                        f"{live[op.name]}); free it first or use another name",
                    )
                live[op.name] = index
            elif isinstance(op, Free):
                if op.name not in live:
                    problems.at(
                        rank,
                        index,
                        op,
                        f"frees {op.name!r}, which is not live on rank {rank} (never allocated, or already freed)",
                    )
                else:
                    del live[op.name]
            elif isinstance(op, Transfer) and op.direction not in ("d2h", "h2d"):
                problems.at(rank, index, op, "direction must be d2h or h2d")


def _check_bytes(rank: int, index: int, op: Op, size: int, problems: _Problems) -> None:
    if size < 0:
        problems.at(rank, index, op, "bytes must be >= 0")
    elif size > MAX_OP_BYTES:
        problems.at(rank, index, op, f"bytes = {size} is above the limit of {MAX_OP_BYTES} (16 TiB, more than any "
                    "device's memory); check the value")


def _check_compute(
    rank: int, index: int, op: Compute, problems: _Problems, max_block: int | None, layout: Layout | None
) -> None:
    if not op.block_start < op.block_end:
        problems.at(rank, index, op, f"block range {op.block_start}:{op.block_end} is empty; need start < end")
    if op.block_start < 0:
        problems.at(rank, index, op, f"block_start = {op.block_start} must be >= 0")
    if max_block is not None and op.block_end > max_block:
        problems.at(rank, index, op, f"block_end = {op.block_end} is past the model's {max_block} sub-blocks")
    for name, value in (("flops", op.flops), ("hbm", op.hbm_bytes), ("attn", op.attention_flops),
                        ("host", op.host_s)):
        if not (math.isfinite(value) and value >= 0):
            problems.at(rank, index, op, f"{name} = {value!r} must be a finite number >= 0")
    if op.attention_flops > op.flops:
        problems.at(rank, index, op, f"attn = {op.attention_flops!r} exceeds flops = {op.flops!r}; the fused "
                    "attention FLOPs are a part of the op's flops")
    if op.kernels < 0 or any(x < 0 for x in op.gemm_mnk) or any(x < 0 for x in op.attention_shape):
        problems.at(rank, index, op, "kernels, gemm and attnshape sizes must be >= 0")
    if op.gemm_streams < 1:
        problems.at(rank, index, op, f"streams = {op.gemm_streams!r}: GEMM kernels in flight together must be >= 1")
    accumulating = op.accumulate_gemms or op.fp8_accumulate_gemms
    if accumulating and op.accumulate_bytes not in (2, 4):
        problems.at(rank, index, op, f"acc = {op.accumulate_bytes!r}: accgemms accumulate into a 16-bit (acc=2) or "
                    "fp32 (acc=4) buffer (fp8accgemms too)")
    elif op.accumulate_bytes and not accumulating:
        problems.at(rank, index, op, f"acc = {op.accumulate_bytes!r} without accgemms: list the accumulating GEMMs "
                    "(accgemms= or fp8accgemms=) or drop acc=")
    if (op.fp8_gemms or op.fp8_accumulate_gemms) and op.device != "gpu":
        problems.at(rank, index, op, f"fp8gemms on a device = {op.device} op: fp8 GEMMs run on the GPU's tensor "
                    "cores; drop fp8gemms= / fp8accgemms=")
    listed = op.gemms + op.accumulate_gemms + op.fp8_gemms + op.fp8_accumulate_gemms
    if listed:
        gemm_flops = sum(2.0 * m * n * k * c for m, n, k, c in listed)
        if any(x <= 0 for g in listed for x in g):
            problems.at(rank, index, op, "every gemms entry needs M, N, K and COUNT >= 1")
        elif not math.isclose(gemm_flops, op.flops - op.attention_flops, rel_tol=1e-6):
            problems.at(rank, index, op, f"gemms add up to {gemm_flops!r} FLOPs but flops - attn = "
                        f"{op.flops - op.attention_flops!r}; list every matrix multiply of the op")
    if op.host_s and op.device != "gpu":
        problems.at(rank, index, op, f"host = {op.host_s!r} on a device = {op.device} op; host issue time is for "
                    "GPU ops (a host op's time is its own duration): drop host=")
    if op.kind != "OPT":
        if op.stage < 0 or op.microbatch < 0:
            problems.at(rank, index, op, f"{op.kind} needs stage >= 0 and mb >= 0")
        if layout is not None and op.stage >= layout.num_stages:
            problems.at(rank, index, op, f"stage {op.stage} is past the layout's {layout.num_stages} stages")
        if layout is not None and op.microbatch >= layout.num_microbatches:
            problems.at(
                rank, index, op, f"mb {op.microbatch} is past the layout's {layout.num_microbatches} micro-batches"
            )
    if op.chunk < 0:
        problems.at(rank, index, op, f"chunk = {op.chunk} must be >= 0")


def _check_collective_sequences(program: Program, problems: _Problems) -> None:
    """Every member of a group issues that group's collectives in the same sequence."""
    sequences: dict[str, dict[int, list[tuple[int, Collective]]]] = defaultdict(lambda: defaultdict(list))
    for rank, ops in enumerate(program.ranks):
        for index, op in enumerate(ops):
            if isinstance(op, Collective) and op.group in program.groups:
                sequences[op.group][rank].append((index, op))
    for name, members in program.groups.items():
        valid = [r for r in dict.fromkeys(members) if 0 <= r < program.world_size]
        if len(valid) < 2 or name not in sequences:
            continue
        ref = valid[0]
        ref_seq = sequences[name].get(ref, [])
        for other in valid[1:]:
            seq = sequences[name].get(other, [])
            _compare_sequences(name, ref, ref_seq, other, seq, problems)


def _signature(op: Collective) -> tuple[object, ...]:
    return (op.kind, op.bytes, op.root, op.count)


def _compare_sequences(
    group: str,
    ref: int,
    ref_seq: list[tuple[int, Collective]],
    other: int,
    seq: list[tuple[int, Collective]],
    problems: _Problems,
) -> None:
    for n, ((i, a), (j, b)) in enumerate(zip(ref_seq, seq, strict=False)):
        if _signature(a) != _signature(b):
            problems.add(
                f"group {group!r}: collective #{n} differs between members: rank {ref} op {i} `{_op_text(a)}` "
                f"vs rank {other} op {j} `{_op_text(b)}` (kind, bytes, root and count must agree)"
            )
            return
    if len(ref_seq) != len(seq):
        longer, extra = (ref, ref_seq) if len(ref_seq) > len(seq) else (other, seq)
        shorter = other if longer == ref else ref
        n = min(len(ref_seq), len(seq))
        i, op = extra[n]
        problems.add(
            f"group {group!r}: rank {longer} issues {len(extra)} collectives on it but rank {shorter} only "
            f"{n}; rank {longer} op {i} `{_op_text(op)}` has no counterpart on rank {shorter}"
        )


def _check_point_to_point(program: Program, problems: _Problems) -> None:
    """Every SEND has its RECV (same key and bytes) and each pair of ranks meets them in the same order.

    The order rule covers both directions together: sends and receives between two ranks share one
    stream (``p2p:<peer>``, see :func:`simgrid.ir.ops.stream_of`) and rendezvous, so if rank a's n-th
    transfer with b is not b's n-th transfer with a, both wait for each other.
    """
    world = program.world_size
    sends: dict[tuple[int, int], list[tuple[int, Send]]] = defaultdict(list)
    recvs: dict[tuple[int, int], list[tuple[int, Recv]]] = defaultdict(list)
    for rank, ops in enumerate(program.ranks):
        for index, op in enumerate(ops):
            if isinstance(op, Send) and 0 <= op.peer < world and op.peer != rank:
                sends[(rank, op.peer)].append((index, op))
            elif isinstance(op, Recv) and 0 <= op.peer < world and op.peer != rank:
                recvs[(op.peer, rank)].append((index, op))
    pairs: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)
    for src, dst in sorted(set(sends) | set(recvs)):
        for i, j in _match_channel(src, dst, sends.get((src, dst), []), recvs.get((src, dst), []), problems):
            # Store as (index on the lower rank, index on the higher rank).
            pairs[(min(src, dst), max(src, dst))].append((i, j) if src < dst else (j, i))
    for (a, b), matched in sorted(pairs.items()):
        matched.sort()
        for (i0, j0), (i1, j1) in itertools.pairwise(matched):
            if j1 < j0:
                ops_a, ops_b = program.ranks[a], program.ranks[b]
                problems.add(
                    f"ranks {a} and {b} meet their transfers in different orders: on rank {a} op {i0} "
                    f"`{_op_text(ops_a[i0])}` comes before op {i1} `{_op_text(ops_a[i1])}`, but on rank {b} "
                    f"their partners come the other way round (op {j1} `{_op_text(ops_b[j1])}` before op {j0} "
                    f"`{_op_text(ops_b[j0])}`); order the sends and receives between two ranks the same way "
                    "on both sides"
                )
                break


def _match_channel(
    src: int, dst: int, sends: list[tuple[int, Send]], recvs: list[tuple[int, Recv]], problems: _Problems
) -> list[tuple[int, int]]:
    """Match the k-th send of a key with the k-th receive of the same key; report the leftovers."""
    pending: dict[P2PKey, list[tuple[int, Recv]]] = defaultdict(list)
    for item in reversed(recvs):
        pending[item[1].key].append(item)
    matched: list[tuple[int, int]] = []
    for i, send in sends:
        queue = pending.get(send.key)
        if not queue:
            problems.at(
                src,
                i,
                send,
                f"no matching RECV on rank {dst} (peer={src}, key {_key_text(send.key)}); add one or fix the key",
            )
            continue
        j, recv = queue.pop()
        if recv.bytes != send.bytes:
            problems.at(
                src,
                i,
                send,
                f"sends {send.bytes} bytes but the matching RECV on rank {dst} op {j} expects {recv.bytes}",
            )
        matched.append((i, j))
    for queue in pending.values():
        for j, recv in reversed(queue):
            problems.at(
                dst,
                j,
                recv,
                f"no matching SEND on rank {src} (peer={dst}, key {_key_text(recv.key)}); add one or fix the key",
            )
    return matched


def _key_text(key: P2PKey) -> str:
    return f"{key.src_stage}>{key.dst_stage}:{key.direction}:{key.microbatch}"
