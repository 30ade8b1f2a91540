"""Pausing Python's cyclic garbage collector around allocation-heavy work.

Building a program or simulating a step allocates hundreds of thousands of short-lived objects (ops,
events, handles, trace rows). Reference counting frees almost all of them; the cyclic collector would
instead rescan the growing heap again and again (measured: over half of a 1024-rank build, a quarter of
a 64-rank interleaved simulation).

What the block leaves alive (a full-mode program of 4096 ranks holds 2.8 million tracked op objects and
their dicts) would otherwise be scanned by the next young collection, then again by the middle one,
before it reaches the oldest generation: measured 0.5-2 s each on that program. On leaving the
outermost block the objects are moved straight to the oldest generation instead (``gc.freeze()`` then
``gc.unfreeze()``: two list splices, no scan). They are scanned by the next full collection like any
long-lived object, and the few cycles left are collected then; nothing is exempt from collection.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    """Disable the cyclic collector inside the block; restore its previous state after (nests safely)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            if not gc.get_freeze_count():  # leave a caller's own frozen objects (e.g. before a fork) alone
                gc.freeze()  # every tracked object to the permanent generation, then all of them
                gc.unfreeze()  # to the oldest generation: the survivors skip the young scans
            gc.enable()
