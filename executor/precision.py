"""Which dtype the executor computes in: fp32, or bf16 autocast over fp32 master weights.

A layout's ``precision`` says what the simulator costs: ``bf16`` (the default) is mixed precision, 16-bit
matrix work with fp32 master weights and fp32 optimizer states (Micikevicius et al., "Mixed Precision
Training", ICLR 2018, section 3.1; bf16 needs no loss scaling because it keeps fp32's exponent range,
Kalamkar et al. 2019, arXiv:1905.12322, section 2). The executor realises it with :func:`torch.autocast`
around every forward segment: parameters, gradients and Adam moments stay fp32 (the master copy is the
parameter itself), matrix products and the fused attention core run in bf16, and autocast keeps
reductions (norms, the fp32 cross entropy of the head) in fp32.

Which precision a run uses (:func:`compute_dtype`): on CUDA the layout's; on CPU fp32 unless mixed precision
is asked for, because CPU runs are the executor's numerics reference (single-process fp32, relative error
1e-5) and a CPU's bf16 matrix work is slow. ``fp16`` is refused: it needs dynamic loss scaling
(Micikevicius et al. 2018, section 3.2), which the executor does not implement.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from simgrid.errors import LayoutError

AUTOCAST_DTYPES: dict[str, torch.dtype | None] = {"fp32": None, "bf16": torch.bfloat16}
"""Layout precision -> autocast dtype (None: plain fp32) for the precisions the executor runs."""


def compute_dtype(precision: str, device: torch.device, *, mixed_precision: bool | None = None) -> torch.dtype | None:
    """The autocast dtype of a run (None: fp32) for a layout's ``precision`` on ``device``.

    ``mixed_precision``: None follows the layout on CUDA and computes fp32 on CPU; True follows the layout
    on any device (CPU autocast, as the CPU tests of the bf16 path use); False computes fp32 everywhere.
    """
    if mixed_precision is False or (mixed_precision is None and device.type != "cuda"):
        return None
    if precision not in AUTOCAST_DTYPES:
        raise LayoutError(
            f"executor: precision = {precision!r} is not supported for real runs (fp16 needs dynamic loss "
            "scaling, which the executor does not implement); use precision 'bf16' or 'fp32'"
        )
    return AUTOCAST_DTYPES[precision]


@contextlib.contextmanager
def autocast(dtype: torch.dtype | None, device: torch.device) -> Iterator[None]:
    """Autocast to ``dtype`` on ``device`` for the body (nothing when ``dtype`` is None: fp32)."""
    if dtype is None:
        yield
        return
    with torch.autocast(device_type=device.type, dtype=dtype):
        yield
