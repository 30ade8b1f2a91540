"""``simgrid sweep``: search every valid layout, drop what does not fit, simulate and rank the rest."""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any

from simgrid.cli.common import (
    add_hardware_args,
    add_layout_args,
    add_model_args,
    fixed_recipe_from_args,
    model_from_args,
    positive_int,
    print_json,
)
from simgrid.errors import SimgridError

#: Keys of each ``--json`` entry (the issue's contract), in this order.
JSON_KEYS = ("dp", "tp", "pp", "vpp", "zero", "mbs", "schedule", "recompute", "cp", "step_time_s", "mfu",
             "peak_memory_bytes")
#: Overlap switches (their flag's dest and table column) whose JSON key appears when the flag is not ``off``.
SWITCH_FLAGS = ("tp_comm_overlap", "overlap_param_gather")

EPILOG = """\
examples:
  simgrid sweep --model gpt3-175b --cluster dgx-a100-hdr --gpus 1024 --gbs 1536 \\
      --recompute full --mbs 1,2 --top 10 --out sweep.csv
  simgrid sweep --model llama2-7b --cluster dgx-a100-hdr --gpus 64 --gbs 256 --tp 2,4 --pp 1,2 \\
      --schedule 1f1b,interleaved-1f1b,dualpipev --sequence-parallel both
  simgrid sweep --model llama2-7b --cluster dgx-h100-ndr --gpus 64 --gbs 256 --zero 1 \
      --sequence-parallel on --tp-comm-overlap both --overlap-param-gather both
  simgrid sweep --model llama2-7b --cluster dgx-a100-hdr --gpus 64 --gbs 256 --tp 2 --json
  simgrid sweep --model gpt3-175b --cluster dgx-a100-hdr --gpus 1024 --gbs 1536 --backend ray --address auto
  simgrid plot sweep.csv --kind heatmap --out heatmap.png
"""


def register(subparsers: Any) -> None:
    """Add the ``sweep`` sub-command."""
    p = subparsers.add_parser(
        "sweep",
        help="search layouts (dp, tp, pp, vpp, ZeRO, micro-batch, schedule, recompute) for the fastest",
        description=(
            "Enumerate every valid layout of a model on N GPUs and rank them by simulated step time. Layouts are "
            "decided in order of a lower bound on their step time: the best max(--top, 20) are exactly those "
            "of simulating every layout, and layouts that cannot join them are skipped (--exhaustive "
            "simulates every layout that fits). Runs in local worker processes or on a Ray cluster."
        ),
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_model_args(p)
    add_hardware_args(p, cluster_required=True, gpu_profile=False, gpus_required=True)
    add_layout_args(p, lists=True)  # the same flags as simulate and memory, taking comma lists
    c = p.add_argument_group("search bounds (default: search everything)")
    c.add_argument("--max-tp", type=positive_int, help="largest tensor-parallel degree (default: GPUs per node)")
    c.add_argument("--max-pp", type=positive_int, help="largest pipeline-parallel degree")
    c.add_argument("--max-dp", type=positive_int, help="largest data-parallel degree")
    c.add_argument("--max-mbs", type=positive_int, default=8, help="largest micro-batch size (default 8)")
    c.add_argument("--max-vpp", type=positive_int, default=8, help="largest interleaving degree (default 8)")
    c.add_argument("--tp-across-nodes", action="store_true", help="let tensor parallelism span nodes")
    c.add_argument("--uneven-stages", action="store_true", help="also try pp * vpp not dividing the layer count")
    o = p.add_argument_group("output")
    o.add_argument("--top", type=positive_int, default=10, help="layouts to print (default 10)")
    o.add_argument("--out", help="write every simulated layout, ranked, to this CSV file")
    o.add_argument("--json", action="store_true", help="print a JSON list, best first, instead of a table")
    o.add_argument("--workers", type=positive_int,
                   help="worker processes, or Ray actors (default: the CPU count, of the Ray cluster for ray)")
    o.add_argument("--backend", default="local", metavar="{local,ray}",
                   help="where layouts are simulated: local processes (default) or a Ray cluster")
    o.add_argument("--address", help="Ray cluster address for --backend ray: auto, HOST:PORT or ray://HOST:10001 "
                                     "(default: start Ray on this machine)")
    o.add_argument("--exhaustive", action="store_true",
                   help="simulate every layout that fits (default: skip those whose lower bound shows they "
                        "cannot enter the best max(--top, 20))")
    c.add_argument("--no-prune", action="store_true",
                   help="also simulate layouts that fit with less recompute too (they cannot be faster)")
    o.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run the sweep and print the ranking and the account of dropped layouts."""
    from simgrid.sweep import DEFAULT_EXACT_TOP, sweep
    from simgrid.sweep.backends import BACKENDS

    if args.backend not in BACKENDS:
        raise SimgridError(f"--backend {args.backend!r} is not one of {', '.join(BACKENDS)}")
    if args.address is not None and args.backend != "ray":
        raise SimgridError("--address is for --backend ray; the local backend runs on this machine")
    model = model_from_args(args)
    constraints = constraints_from_args(args)
    check_pins(args, model)
    if args.out is not None:
        _check_writable(args.out)
    result = sweep(
        model, args.cluster, args.gpus, args.gbs, constraints=constraints, workers=args.workers,
        progress=not args.no_progress and not args.json, prune_recompute=not args.no_prune,
        exact_top=None if args.exhaustive else max(args.top, DEFAULT_EXACT_TOP), backend=args.backend,
        address=args.address,
    )
    if args.out:
        from simgrid.io import atomic_output

        with atomic_output(args.out, flag="--out") as temp:
            result.table.to_csv(temp, index=False)
    shown = result.table.head(args.top)
    if args.json:
        # A searched overlap switch joins the keys, so rows that differ only in it can be told apart.
        keys = JSON_KEYS + tuple(k for k in SWITCH_FLAGS if getattr(args, k) != "off")
        print_json([{k: _json_value(row[k]) for k in keys} for row in shown.to_dict("records")])
        return 0
    print(f"{model.name} on {args.gpus} GPUs of {args.cluster}, global batch {args.gbs}, "
          f"seq {model.seq_length}; constraints: {constraints.describe()}")
    for line in result.summary_lines():
        print(line)
    if shown.empty:
        print("no layout could be simulated; relax the constraints or add GPUs", file=sys.stderr)
        return 1
    print()
    print(format_table(shown))
    if args.out:
        print(f"\nwrote {len(result.table)} simulated layouts to {args.out}")
    return 0


def check_pins(args: argparse.Namespace, model: Any) -> None:
    """Refuse pinned degrees (comma lists) that leave no layout at all, saying which pin and why (exit 2, one
    line), rather than enumerating nothing and reporting an empty search."""
    import itertools

    from simgrid.limits import MAX_OPS, check_world_size

    check_world_size(args.gpus, what=f"--gpus {args.gpus}")
    gpus = args.gpus
    divisors = ", ".join(str(d) for d in range(1, min(gpus, 64) + 1) if gpus % d == 0)
    rules = {
        "--tp": [(lambda v: gpus % v == 0, f"divides --gpus {gpus} (e.g. {divisors})"),
                 (lambda v: model.num_heads % v == 0, f"divides {model.name}'s {model.num_heads} attention heads")],
        "--pp": [(lambda v: gpus % v == 0, f"divides --gpus {gpus} (e.g. {divisors})"),
                 (lambda v: v <= model.num_layers, f"is at most {model.name}'s {model.num_layers} layers")],
        "--dp": [(lambda v: gpus % v == 0, f"divides --gpus {gpus} (e.g. {divisors})"),
                 (lambda v: args.gbs % v == 0, f"divides --gbs {args.gbs}")],
        "--cp": [(lambda v: gpus % v == 0, f"divides --gpus {gpus} (e.g. {divisors})"),
                 (lambda v: model.seq_length % (2 * v) == 0,
                  f"splits the sequence of {model.seq_length} tokens into 2 * cp chunks")],
    }
    kept: dict[str, tuple[int, ...]] = {}
    for flag, checks in rules.items():
        values = getattr(args, flag[2:], None)
        if values is None:
            continue
        for test, rule in checks:
            survivors = tuple(v for v in values if test(v))
            if not survivors:
                raise SimgridError(f"{flag} {','.join(map(str, values))}: no value {rule}; pin one that does")
            values = survivors
        kept[flag] = values
    pinned = [flag for flag in ("--dp", "--tp", "--pp") if flag in kept]
    if len(pinned) > 1:
        cps = kept.get("--cp", (1,))
        products = {math.prod(combo) for combo in itertools.product(*(kept[f] for f in pinned))}
        if not any(gpus % (product * cp) == 0 for product in products for cp in cps):
            names = " ".join(f"{flag} {','.join(map(str, kept[flag]))}" for flag in pinned)
            raise SimgridError(f"{names}: no combination divides --gpus {gpus} (with cp); make dp * tp * pp * cp = "
                               f"{gpus}")
    largest_mbs = max(args.mbs or (args.max_mbs,))
    fewest = -(-args.gbs // (gpus * largest_mbs))  # micro-batches of the most parallel layout
    if fewest * 56 > MAX_OPS:  # the smallest program: stage granularity, one unit per micro-batch
        raise SimgridError(f"--gbs {args.gbs} on {gpus} GPUs means at least {fewest:,} micro-batches per pipeline, "
                           f"over the limit of {MAX_OPS:,} simulated ops for every layout; use a smaller --gbs")


def constraints_from_args(args: argparse.Namespace) -> Any:
    """The :class:`SweepConstraints` the flags describe (the shared layout flags, as lists of values)."""
    from simgrid.sweep import SweepConstraints
    from simgrid.sweep.constraints import PIPELINE_SCHEDULES, SEARCHED_RECOMPUTE, ZERO_STAGES

    switch = {"off": (False,), "on": (True,), "both": (False, True)}
    sp, flash = switch[args.sequence_parallel], switch[args.flash_attention]
    constraints: Any = SweepConstraints(
        tp=args.tp, max_tp=args.max_tp, pp=args.pp, max_pp=args.max_pp, dp=args.dp, max_dp=args.max_dp,
        schedules=tuple(s for s in (args.schedule or PIPELINE_SCHEDULES) if s != "none") or PIPELINE_SCHEDULES,
        zero_stages=args.zero or ZERO_STAGES,
        recompute=args.recompute or SEARCHED_RECOMPUTE, max_mbs=args.max_mbs, micro_batch_sizes=args.mbs,
        max_vpp=args.max_vpp, vpps=args.vpp, allow_tp_across_nodes=args.tp_across_nodes, sequence_parallel=sp,
        flash_attention=flash, tp_comm_overlap=switch[args.tp_comm_overlap],
        overlap_param_gather=switch[args.overlap_param_gather], allow_uneven_stages=args.uneven_stages, context_parallel=args.cp or (1,),
        expert_parallel=getattr(args, "ep", None), expert_tensor_parallel=getattr(args, "etp", None),
        recipe=tuple(sorted(fixed_recipe_from_args(args).items())),
    )
    return constraints


def format_table(df: Any) -> str:
    """The ranked rows as a fixed-width text table; the recompute column also names the switches a row has on
    (sp: sequence parallel, tpo: TP comm overlap, fa: FlashAttention, opg: overlapped param gather)."""
    rows = df.to_dict("records")
    switches = [(" sp" if row.get("sequence_parallel") else "") + (" tpo" if row.get("tp_comm_overlap") else "")
                + (" fa" if row.get("flash_attention") else "") + (" opg" if row.get("overlap_param_gather") else "")
                for row in rows]
    width = max([13, *(len(row["recompute"] + sp) for row, sp in zip(rows, switches, strict=True))])
    with_cp = "cp" in df and bool((df["cp"] > 1).any())  # the column appears once context parallelism does
    with_ep = "ep" in df and bool((df["ep"] > 1).any() or (df["etp"] != df["tp"]).any())  # and expert parallelism
    header = (f"{'#':>3} {'dp':>5} {'tp':>3} {'pp':>3} " + (f"{'cp':>3} " if with_cp else "")
              + (f"{'ep':>3} {'etp':>3} " if with_ep else "")
              + f"{'vpp':>3} {'zero':>4} {'mbs':>3} {'schedule':<16} "
              f"{'recompute':<{width}} {'step s':>9} {'tokens/s':>11} {'MFU':>6} {'memory GiB':>10} fits")
    lines = [header, "-" * len(header)]
    for i, (row, sp) in enumerate(zip(rows, switches, strict=True), start=1):
        cp = f"{row['cp']:>3} " if with_cp else ""
        cp += f"{row['ep']:>3} {row['etp']:>3} " if with_ep else ""
        lines.append(
            f"{i:>3} {row['dp']:>5} {row['tp']:>3} {row['pp']:>3} {cp}{row['vpp']:>3} {row['zero']:>4} "
            f"{row['mbs']:>3} {row['schedule']:<16} {row['recompute'] + sp:<{width}} {row['step_time_s']:>9.3f} "
            f"{row['tokens_per_s']:>11,.0f} {100 * row['mfu']:>5.1f}% {row['peak_memory_bytes'] / 1024**3:>10.1f} "
            f"{'yes' if row['fits'] else 'NO'}"
        )
    return "\n".join(lines)


def _check_writable(path: str) -> None:
    from simgrid.io import check_output_path

    check_output_path(path, flag="--out")


def _json_value(value: Any) -> Any:
    item = getattr(value, "item", None)
    return item() if callable(item) else value
