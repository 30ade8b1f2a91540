"""The memory verdict keeps headroom free for the CUDA context and allocator fragmentation."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from simgrid.errors import LayoutError
from simgrid.layout import Layout
from simgrid.memory import DEFAULT_HEADROOM, MemoryHeadroom, estimate_memory, suggest_layouts
from simgrid.memory.headroom import CUDA_CONTEXT_BYTES, FRAGMENTATION_FRACTION
from simgrid.model import get_model

GIB = 2**30


@dataclass(frozen=True)
class _GPU:
    name: str
    memory_bytes: int


A100_80GB = _GPU("a100-80gb", 80 * GIB)


def test_the_default_reserve_is_the_cuda_context_plus_a_share_for_fragmentation() -> None:
    """0.5 GiB of context plus 11.5% (GMLake's 9.2 GB of 80) of an 80 GiB GPU: 9.70 GiB kept free."""
    assert CUDA_CONTEXT_BYTES == 512 * 2**20 and pytest.approx(0.115) == FRAGMENTATION_FRACTION
    assert DEFAULT_HEADROOM.reserved_bytes(80 * GIB) == 512 * 2**20 + int(0.115 * 80 * GIB)
    assert DEFAULT_HEADROOM.describe(80 * GIB) == "9.70 GiB reserved (CUDA context 0.50 GiB + 11.5% fragmentation)"


def test_79_7_of_80_gib_does_not_fit_and_near_the_limit_is_tight() -> None:
    """The issue's case: a 79.7 GiB peak on 80 GiB leaves nothing for the context; a peak within 5% of
    capacity below the usable limit is tight; well below it fits; a zero reserve restores the old rule."""
    capacity = 80 * GIB
    usable = DEFAULT_HEADROOM.usable_bytes(capacity)
    assert DEFAULT_HEADROOM.verdict(int(79.7 * GIB), capacity) == "does not fit"
    assert DEFAULT_HEADROOM.verdict(usable + 1, capacity) == "does not fit"
    assert DEFAULT_HEADROOM.verdict(usable, capacity) == "tight"
    assert DEFAULT_HEADROOM.verdict(usable - 3 * GIB, capacity) == "tight"  # 3 GiB < 5% of 80 GiB
    assert DEFAULT_HEADROOM.verdict(usable - 5 * GIB, capacity) == "fits"
    assert MemoryHeadroom.fixed(0).verdict(int(79.7 * GIB), capacity) == "tight"
    assert MemoryHeadroom.fixed(0).verdict(capacity + 1, capacity) == "does not fit"


def test_estimate_reports_reserve_usable_and_verdict_and_takes_another_headroom() -> None:
    """estimate_memory's fit uses the usable memory; its JSON says how much was reserved."""
    model, layout = get_model("llama2-7b"), Layout(dp=8, zero=3, global_batch_size=8)
    est = estimate_memory(model, layout, A100_80GB)
    assert est.reserved_bytes == DEFAULT_HEADROOM.reserved_bytes(80 * GIB)
    assert est.usable_bytes == 80 * GIB - est.reserved_bytes
    assert est.fits == (est.total_bytes <= est.usable_bytes)
    assert est.to_dict()["verdict"] == est.verdict and est.to_dict()["reserved_bytes"] == est.reserved_bytes
    squeezed = estimate_memory(model, layout, A100_80GB, headroom=MemoryHeadroom.fixed(80 * GIB - est.total_bytes + 1))
    assert squeezed.fits is False and squeezed.verdict == "does not fit"


def test_advice_only_offers_layouts_that_fit_with_the_headroom() -> None:
    """Every suggestion stays within capacity less the reserve (and a larger reserve prunes more)."""
    model, base = get_model("llama2-7b"), Layout()
    usable = DEFAULT_HEADROOM.usable_bytes(A100_80GB.memory_bytes)
    advice = suggest_layouts(model, base, A100_80GB, max_gpus=8, limit=20)
    assert advice and all(s.total_bytes <= usable for s in advice)
    strict = MemoryHeadroom(fragmentation_fraction=0.5)
    tighter = suggest_layouts(model, base, A100_80GB, max_gpus=8, limit=20, headroom=strict)
    assert all(s.total_bytes <= strict.usable_bytes(A100_80GB.memory_bytes) for s in tighter)
    assert any(s.total_bytes > strict.usable_bytes(A100_80GB.memory_bytes) for s in advice)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"cuda_context_bytes": -1}, r"cuda_context_bytes = -1 must be an integer >= 0"),
    ({"fragmentation_fraction": 1.5}, r"fragmentation_fraction = 1.5 must be a fraction in \[0, 1\)"),
])
def test_bad_headroom_names_the_field(kwargs: dict[str, float], match: str) -> None:
    """A negative context or a fraction outside [0, 1) is a one-line LayoutError."""
    with pytest.raises(LayoutError, match=match):
        MemoryHeadroom(**kwargs)  # type: ignore[arg-type]
