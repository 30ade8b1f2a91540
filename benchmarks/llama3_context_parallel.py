"""Llama 3 405B's published training layouts, with and without context parallelism, against the simulator.

Run from the repository root::

    python benchmarks/llama3_context_parallel.py           # print the comparison (markdown)
    python benchmarks/llama3_context_parallel.py --write   # also rewrite docs/context_parallel.md

Published (Dubey et al. 2024, "The Llama 3 Herd of Models", Table 4; the same figures are on P. Balaji's
SC'24 slide, summarised at glennklockwood.com/garden/llama-3.1): on H100s, tp 8 and pp 16 with
16M-token batches,

* 8,192 GPUs, cp 1, sequence 8,192: 430 TFLOP/s per GPU;
* 16,384 GPUs, cp 1, sequence 8,192: 400 TFLOP/s per GPU;
* 16,384 GPUs, cp 16, sequence 131,072: 380 TFLOP/s per GPU.

This is a comparison, not a validation, and no test depends on it: the simulator's cluster
(``dgx-h100-ndr``, InfiniBand NDR) is not Meta's RoCE fabric; Llama 3 sharded parameters and gradients
over data parallelism (FSDP) alongside pipeline parallelism, which the simulator's layouts refuse (ZeRO-1
is used here); its interleaving degree is not published (plain 1F1B and interleaving with 2 chunks per
rank are both shown); and how it counted attention FLOPs at 128K (with or without the causal discount) is
not stated, while the simulator reports eq. 3's full count. The ratio between rows is the more telling
figure: the paper loses 5% of per-GPU throughput going from 8K to 128K context with cp 16.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from simgrid import Layout, get_model, simulate

DOC = Path(__file__).resolve().parents[1] / "docs" / "context_parallel.md"


@dataclass(frozen=True, kw_only=True)
class PublishedRun:
    """One row of Llama 3's Table 4."""

    gpus: int
    """H100s in the run."""
    cp: int
    """Context-parallel degree."""
    seq_length: int
    """Tokens per sequence."""
    global_batch: int
    """Sequences per step (16M tokens / sequence length)."""
    tflops_per_gpu: float
    """Published TFLOP/s per GPU."""


RUNS = (
    PublishedRun(gpus=8192, cp=1, seq_length=8192, global_batch=2048, tflops_per_gpu=430),
    PublishedRun(gpus=16384, cp=1, seq_length=8192, global_batch=2048, tflops_per_gpu=400),
    PublishedRun(gpus=16384, cp=16, seq_length=131072, global_batch=128, tflops_per_gpu=380),
)
SCHEDULES = (("1f1b", 1), ("interleaved-1f1b", 2))


def layout_of(run: PublishedRun, schedule: str, vpp: int) -> Layout:
    """tp 8, pp 16 (126 layers: the uneven split Llama 3 used), sequence parallel, FlashAttention, ZeRO-1."""
    return Layout(tp=8, pp=16, cp=run.cp, dp=run.gpus // (8 * 16 * run.cp), global_batch_size=run.global_batch,
                  zero=1, sequence_parallel=True, flash_attention=True, schedule=schedule, vpp=vpp)  # type: ignore[arg-type]


def report() -> str:
    """The comparison as markdown."""
    model = get_model("llama3-405b")
    lines = [
        "| GPUs | cp | sequence | schedule | published TFLOP/s | simulated TFLOP/s | MFU | bubble | exposed cp | "
        "peak memory | fits |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in RUNS:
        for schedule, vpp in SCHEDULES:
            print(f"simulating {run.gpus} GPUs, cp {run.cp}, {schedule} ...", file=sys.stderr)
            m = simulate(model.with_seq_length(run.seq_length), "dgx-h100-ndr", layout_of(run, schedule, vpp)).metrics
            label = schedule if vpp == 1 else f"{schedule} v{vpp}"
            lines.append(
                f"| {run.gpus:,} | {run.cp} | {run.seq_length:,} | {label} | {run.tflops_per_gpu:.0f} | "
                f"{m.tflops_per_gpu:.0f} | {m.mfu:.1%} | {m.bubble_fraction:.1%} | "
                f"{m.exposed_comm_s.get('cp', 0.0):.2f} s | {m.peak_memory_bytes / 2**30:.0f} GiB | "
                f"{'yes' if m.fits else 'no'} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help=f"rewrite {DOC.relative_to(DOC.parents[1])}")
    args = parser.parse_args(argv)
    body = DOC.read_text().split("<!-- table -->") if args.write else []
    if args.write and len(body) != 3:  # checked before the simulations, which take seconds
        print(f"{DOC}: expected the table between two '<!-- table -->' markers", file=sys.stderr)
        return 2
    table = report()
    print(table)
    if args.write:
        DOC.write_text(f"{body[0]}<!-- table -->\n{table}<!-- table -->{body[2]}")
        print(f"wrote {DOC}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
