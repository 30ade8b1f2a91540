"""``simgrid memory``: the analytic memory model of a layout, with a fit verdict and advice."""

from __future__ import annotations

import argparse
from typing import Any

from simgrid.cli.common import (
    add_hardware_args,
    add_headroom_arg,
    add_model_layout_args,
    headroom_from_args,
    model_layout_from_args,
    positive_int,
    print_json,
)
from simgrid.cli.format import gib
from simgrid.errors import LayoutError
from simgrid.model import param_count, params_note
from simgrid.model.params import active_param_count


def register(subparsers: Any) -> None:
    """Add the ``memory`` sub-command."""
    p = subparsers.add_parser(
        "memory",
        help="memory per GPU of a layout (model states, activations, buffers) and whether it fits",
        description="Analytic memory per GPU: weights, gradients and optimizer states under ZeRO 0-3 and "
        "offload, activations under the recompute policy and pipeline schedule, communication buffers. "
        "With --gpu (or --cluster), says whether the worst rank fits with headroom kept free for the CUDA "
        "context and allocator fragmentation (tight when it fits by less than 5%% of capacity) and, if not, "
        "what would.",
        epilog="examples:\n"
        "  simgrid memory --model llama2-7b --gpu rtx-4090\n"
        "  simgrid memory --model gpt3-175b --tp 8 --pp 8 --dp 16 --gbs 1536 --recompute full --gpu a100-80gb-sxm\n"
        "  simgrid memory --model llama2-7b --cluster dgx-a100-hdr --gpus 8 --zero 3 --headroom-gib 2\n"
        "  simgrid memory --params 7.5e9 --dp 64 --zero 3 --json\n"
        "  simgrid memory --model mixtral-8x7b --dp 8 --ep 8 --zero 1 --gpu h100-sxm",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_model_layout_args(p)
    add_hardware_args(p, cluster_required=False, gpu_profile=True)
    add_headroom_arg(p)
    p.add_argument(
        "--max-gpus", type=positive_int, default=64, help="largest GPU count advice may suggest (default 64)"
    )
    p.add_argument("--json", action="store_true", help="print JSON (bytes)")
    p.set_defaults(func=run)


def _gpu(args: argparse.Namespace) -> Any:
    """The GPU of ``--gpu`` or of ``--cluster``'s nodes (None without either)."""
    from simgrid.hardware import load_cluster_spec, load_gpu

    if args.gpu and args.cluster:
        raise LayoutError(f"--gpu {args.gpu} and --cluster {args.cluster} both name the GPU; give one")
    if args.cluster:
        return load_cluster_spec(args.cluster).node.gpu
    return load_gpu(args.gpu) if args.gpu else None


def run(args: argparse.Namespace) -> int:
    """Estimate, print, and advise when the layout does not fit."""
    from simgrid.limits import check_world_size
    from simgrid.memory import estimate_memory, suggest_layouts
    from simgrid.schedules.advice import pipeline_warnings

    check_world_size(args.max_gpus, what=f"--max-gpus {args.max_gpus}")
    model, layout = model_layout_from_args(args, gpus=args.gpus)
    gpu = _gpu(args)
    headroom = headroom_from_args(args)
    estimate = estimate_memory(model, layout, gpu, headroom=headroom)
    suggestions = (suggest_layouts(model, layout, gpu, max_gpus=args.max_gpus, headroom=headroom)
                   if gpu and not estimate.fits else [])
    warnings = pipeline_warnings(layout)
    if args.json:
        out = estimate.to_dict()
        out["model"] = model.name
        out["params"] = param_count(model)
        out["layout"] = layout.to_dict()
        out["warnings"] = warnings
        if gpu is not None:
            out["suggestions"] = [
                {"description": s.description, "total_bytes": s.total_bytes, "layout": s.layout.to_dict()}
                for s in suggestions
            ]
        print_json(out)
        return 0
    active = f" ({active_param_count(model) / 1e9:.2f}B active)" if model.moe is not None else ""
    print(f"model   {model.name}: {param_count(model) / 1e9:.2f}B parameters{active}, seq {model.seq_length}"
          + (f" ({params_note(model, args.params)})" if args.params else ""))
    print(
        f"layout  dp={layout.dp} tp={layout.tp} pp={layout.pp} "
        f"{f'cp={layout.cp} ' if layout.cp > 1 else ''}"
        f"{f'ep={layout.ep} etp={layout.expert_tp} ' if layout.ep > 1 or layout.etp is not None else ''}"
        f"vpp={layout.vpp} zero={layout.zero} "
        f"mbs={layout.micro_batch_size} gbs={layout.gbs} ({layout.num_microbatches} micro-batches) "
        f"schedule={layout.schedule} recompute={layout.recompute} precision={layout.precision} "
        f"optimizer={layout.optimizer}{' offload' if layout.offload_optimizer else ''}"
        f"{' reduce_dtype=fp32' if layout.reduce_dtype == 'fp32' else ''}"
        f"{' cross_entropy=unfused' if layout.cross_entropy == 'unfused' else ''}"
    )
    print(f"per GPU (worst rank: pipeline rank {estimate.worst_pp_rank})")
    for name, value in estimate.breakdown.items():
        print(f"  {name:<12} {gib(value):>10}")
    print(f"  {'total':<12} {gib(estimate.total_bytes):>10}")
    if estimate.host_bytes:
        print(f"  host (offload) {gib(estimate.host_bytes)} per rank")
    for warning in warnings:
        print(f"warning {warning}")
    if gpu is None:
        print("fit     pass --gpu NAME (or --cluster NAME) to check against a GPU")
        return 0
    capacity = estimate.capacity_bytes or 0
    usable = estimate.usable_bytes or 0
    reserve = headroom.describe(capacity)
    if estimate.verdict == "fits":
        print(f"fit     yes: {gib(estimate.total_bytes)} of the {gib(usable)} usable on {gpu.name} "
              f"({gib(capacity)}, {reserve})")
        return 0
    if estimate.verdict == "tight":
        print(f"fit     TIGHT: {gib(estimate.total_bytes)} of the {gib(usable)} usable on {gpu.name} "
              f"({gib(capacity)}, {reserve}), {gib(usable - estimate.total_bytes)} to spare; a longer sequence or "
              "another allocator pattern may not fit")
        return 0
    largest = max(estimate.breakdown, key=lambda k: estimate.breakdown[k])
    print(
        f"fit     NO: needs {gib(estimate.total_bytes)} but {gpu.name} has {gib(usable)} usable "
        f"({gib(capacity)}, {reserve}); the largest part is {largest} ({gib(estimate.breakdown[largest])})"
    )
    if suggestions:
        print(f"what fits on {gpu.name} (up to {args.max_gpus} GPUs):")
        width = max(len(s.description) for s in suggestions)
        for s in suggestions:
            print(f"  {s.description:<{width}}  {gib(s.total_bytes):>10} per GPU")
    else:
        print(f"nothing tried fits on up to {args.max_gpus} GPUs of this kind; try --max-gpus or a larger GPU")
    return 0
