"""Hypothesis strategies for every IR op type and every field (shared by the IR tests)."""

from __future__ import annotations

from hypothesis import strategies as st

from simgrid.ir import (
    COLLECTIVE_KINDS,
    COMM_KERNELS,
    COMM_PURPOSES,
    COMPUTE_KINDS,
    MEMORY_CATEGORIES,
    Alloc,
    Collective,
    Compute,
    Free,
    P2PKey,
    Recv,
    Send,
    Transfer,
    Wait,
)

ints = st.integers(min_value=-(2**63 - 1), max_value=2**63 - 1)  # the text form holds 64-bit integers
numbers = st.one_of(ints, st.floats(allow_nan=False, allow_infinity=False))  # and finite numbers
names = st.text(max_size=12)  # any text: spaces, quotes, '=', unicode, empty

keys = st.builds(
    P2PKey, src_stage=ints, dst_stage=ints, microbatch=ints, direction=st.sampled_from(["F", "B"])
)
computes = st.builds(
    Compute,
    kind=st.sampled_from(COMPUTE_KINDS),
    stage=ints,
    microbatch=ints,
    chunk=ints,
    block_start=ints,
    block_end=ints,
    flops=numbers,
    hbm_bytes=numbers,
    gemm_mnk=st.tuples(ints, ints, ints),
    kernels=ints,
    attention_flops=numbers,
    device=st.sampled_from(["gpu", "cpu"]),
    host_s=numbers,
    gemm_streams=ints,
)
sends = st.builds(Send, peer=ints, bytes=ints, key=keys, handle=names, grouped=st.booleans())
recvs = st.builds(Recv, peer=ints, bytes=ints, key=keys, handle=names, grouped=st.booleans())
collectives = st.builds(
    Collective,
    kind=st.sampled_from(COLLECTIVE_KINDS),
    group=names,
    bytes=ints,
    purpose=st.sampled_from(COMM_PURPOSES),
    handle=names,
    root=st.none() | ints,
    count=ints,
    label=names,
    kernel=st.sampled_from(COMM_KERNELS),
)
transfers = st.builds(Transfer, direction=st.sampled_from(["d2h", "h2d"]), bytes=ints, handle=names, label=names)
waits = st.builds(Wait, handle=names)
allocs = st.builds(Alloc, name=names, bytes=ints, category=st.sampled_from(MEMORY_CATEGORIES))
frees = st.builds(Free, name=names)
any_op = st.one_of(computes, sends, recvs, collectives, transfers, waits, allocs, frees)
