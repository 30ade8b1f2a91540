"""Megatron-Core's published MoE training results (MoE Parallel Folding) against the simulator.

Run from the repository root::

    python benchmarks/moe_megatron.py           # print the comparison (markdown)
    python benchmarks/moe_megatron.py --write   # also rewrite the table in docs/moe.md

Published: Liu et al. 2025, "MoE Parallel Folding: Heterogeneous Parallelism Mappings for Efficient
Large-Scale MoE Model Training with Megatron Core" (arXiv:2504.14960), abstract: on H100 GPUs, up to 49.3% MFU
for Mixtral 8x22B and 39.0% MFU for Qwen2-57B-A14B.

Layouts: the paper's own table could not be read with the tools of this project; the layouts here are the
defaults of the authors' public benchmark harness of the same month (github.com/yanring/Megatron-MoE-ModelZoo,
commit 78fd4d6, April 2025, ``runtime_configs/benchmarking/runtime.conf`` and ``model_configs/benchmarking``):
sequence 4096, global batch 256, micro-batch 1, bf16, distributed optimizer (ZeRO-1), sequence parallelism,
FlashAttention, expert tensor parallelism 1 (folding), all-to-all dispatcher, grouped GEMM, no recompute,

* Mixtral 8x22B on 128 GPUs (16 nodes): TP 2, PP 8, EP 8, no interleaving (Llama 2 tokenizer: 32000 words);
* Qwen2-57B-A14B on 64 GPUs (8 nodes): TP 2, PP 4, EP 4, 7 virtual stages (one layer each), shared-expert
  overlap on.

A third row is Megatron-LM's "reference best parallel mapping" of MCore v0.8 for Mixtral 8x22B (128 GPUs,
TP 4, EP 2, PP 8, VP 7; ``megatron/core/transformer/moe/README.md``), before folding, with expert tensor
parallelism equal to tp; no MFU is published for it. Two more rows run the paper layouts under Transformer
Engine fp8 (delayed scaling; nothing published: the paper's figures are bf16), with MFU still against the bf16
peak, so they read as the speed-up fp8 would give, not as a validation.

This is a comparison, not a validation, and no test depends on its numbers: whether the harness defaults are
the paper's best layouts is not confirmed; Megatron overlaps the shared expert with the dispatch (the simulator
runs it after the routed experts) and can overlap the all-to-alls with other micro-batches, which the
simulator does not model; the simulator prices every rank at balanced routing (``load_imbalance`` 1.0) after a
trained router, while a real run's imbalance is not published; and Megatron's MFU formula counts attention its
own way (the simulator's MFU uses Megatron eq. 3's full, non-causal attention count, and the routed experts a
token is sent to). DeepSeek-V3's technical report is reserved for an independent check and is not used.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path

from simgrid import Layout, get_model, simulate
from simgrid.model.spec import ModelSpec

DOC = Path(__file__).resolve().parents[1] / "docs" / "moe.md"
CLUSTER = "dgx-h100-ndr"
RECIPE = {"global_batch_size": 256, "micro_batch_size": 1, "zero": 1, "sequence_parallel": True,
          "flash_attention": True}


@dataclass(frozen=True, kw_only=True)
class Run:
    """One published (or reference) MoE training layout on H100s."""

    label: str
    """What the row is."""
    model: str
    """Preset name."""
    vocab: int | None
    """Vocabulary the run trained with, when it differs from the preset's."""
    gpus: int
    """H100s."""
    tp: int
    """Attention tensor-parallel degree."""
    pp: int
    """Pipeline-parallel degree."""
    ep: int
    """Expert-parallel degree."""
    etp: int
    """Expert tensor-parallel degree."""
    vpp: int
    """Model chunks per pipeline rank."""
    published_mfu: float | None
    """Published MFU, or None."""
    fp8: str = "none"
    """``Layout.fp8_recipe`` (the published runs are bf16; fp8 rows are the same layouts, simulated only)."""


RUNS = (
    Run(label="Mixtral 8x22B, folded (paper)", model="mixtral-8x22b", vocab=32000, gpus=128, tp=2, pp=8, ep=8,
        etp=1, vpp=1, published_mfu=0.493),
    Run(label="Qwen2-57B-A14B, folded (paper)", model="qwen2-57b-a14b", vocab=None, gpus=64, tp=2, pp=4, ep=4,
        etp=1, vpp=7, published_mfu=0.390),
    Run(label="Mixtral 8x22B, MCore v0.8 mapping", model="mixtral-8x22b", vocab=32000, gpus=128, tp=4, pp=8,
        ep=2, etp=4, vpp=7, published_mfu=None),
    Run(label="Mixtral 8x22B, folded, fp8 delayed", model="mixtral-8x22b", vocab=32000, gpus=128, tp=2, pp=8, ep=8,
        etp=1, vpp=1, published_mfu=None, fp8="delayed"),
    Run(label="Qwen2-57B-A14B, folded, fp8 delayed", model="qwen2-57b-a14b", vocab=None, gpus=64, tp=2, pp=4, ep=4,
        etp=1, vpp=7, published_mfu=None, fp8="delayed"),
)


def model_of(run: Run) -> ModelSpec:
    """The preset, with the run's vocabulary."""
    model = get_model(run.model)
    return dataclasses.replace(model, vocab_size=run.vocab) if run.vocab is not None else model


def layout_of(run: Run) -> Layout:
    """The run's layout with the harness recipe (module docstring)."""
    schedule = "interleaved-1f1b" if run.vpp > 1 else "1f1b"
    return Layout(tp=run.tp, pp=run.pp, ep=run.ep, etp=run.etp, vpp=run.vpp, schedule=schedule,  # type: ignore[arg-type]
                  dp=run.gpus // (run.tp * run.pp), fp8_recipe=run.fp8, **RECIPE)  # type: ignore[arg-type]


def report() -> str:
    """The comparison as markdown."""
    lines = [
        "| run | GPUs | tp | pp | ep | etp | vpp | published MFU | simulated MFU | TFLOP/s per GPU | step | bubble | "
        "exposed ep | exposed tp | peak memory | fits |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in RUNS:
        print(f"simulating {run.label} ...", file=sys.stderr)
        m = simulate(model_of(run), CLUSTER, layout_of(run)).metrics
        published = f"{run.published_mfu:.1%}" if run.published_mfu is not None else "-"
        lines.append(
            f"| {run.label} | {run.gpus} | {run.tp} | {run.pp} | {run.ep} | {run.etp} | {run.vpp} | {published} | "
            f"{m.mfu:.1%} | {m.tflops_per_gpu:.0f} | {m.step_time_s:.2f} s | {m.bubble_fraction:.1%} | "
            f"{m.exposed_comm_s.get('ep', 0.0):.2f} s | {m.exposed_comm_s.get('tp', 0.0):.2f} s | "
            f"{m.peak_memory_bytes / 2**30:.0f} GiB | {'yes' if m.fits else 'no'} |"
        )
    return "\n".join(lines) + "\n"


IMBALANCES = (1.0, 1.1, 1.25)
"""Load imbalances of the sensitivity table (busiest rank's tokens over the mean); not fitted to anything."""


def sensitivity() -> str:
    """Simulated MFU of the two paper rows as the busiest expert-parallel rank receives more tokens."""
    lines = ["| run | " + " | ".join(f"imbalance {x:g}" for x in IMBALANCES) + " |",
             "|---|" + "---|" * len(IMBALANCES)]
    for run in RUNS:
        if run.published_mfu is None:
            continue
        model = model_of(run)
        cells = []
        for imbalance in IMBALANCES:
            skewed = dataclasses.replace(model, moe=dataclasses.replace(model.moe, load_imbalance=imbalance))  # type: ignore[arg-type]
            cells.append(f"{simulate(skewed, CLUSTER, layout_of(run)).metrics.mfu:.1%}")
        lines.append(f"| {run.label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help=f"rewrite the table in {DOC.name}")
    args = parser.parse_args(argv)
    body = DOC.read_text().split("<!-- table -->") if args.write else []
    if args.write and len(body) != 3:  # checked before the simulations
        print(f"{DOC}: expected the table between two '<!-- table -->' markers", file=sys.stderr)
        return 2
    table = report()
    print(table)
    extra = sensitivity()
    print("Simulated MFU under load imbalance (sensitivity, not a fit):\n")
    print(extra)
    if args.write:
        DOC.write_text(f"{body[0]}<!-- table -->\n{table}\nSimulated MFU under load imbalance (sensitivity, "
                       f"not a fit):\n\n{extra}<!-- table -->{body[2]}")
        print(f"wrote {DOC}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
