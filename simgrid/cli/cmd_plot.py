"""``simgrid plot``: draw a saved trace (Gantt, memory over time) or a saved sweep (ranking, heat map).

A trace file is either a simgrid trace (``Trace.save``) or the Chrome/Perfetto JSON that
``simgrid simulate --trace`` writes; the latter is read back into trace rows (rank = pid, stream = thread
name, kind and stage/micro-batch from the event name) so either can be drawn.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

from simgrid.cli.common import positive_int
from simgrid.plots.canvas import PlotError, save_figure

TRACE_KINDS = ("gantt", "memory")
SWEEP_KINDS = ("ranking", "heatmap")

EPILOG = """\
examples:
  simgrid simulate --model gpt3-175b --cluster dgx-a100-hdr --gpus 1024 --tp 8 --pp 8 --mbs 1 \\
      --gbs 1536 --trace step.json
  simgrid plot step.json --kind gantt --out step.png
  simgrid sweep --model llama2-7b --cluster dgx-a100-hdr --gpus 64 --gbs 256 --out sweep.csv
  simgrid plot sweep.csv --kind heatmap --out heatmap.png
"""

#: Chrome-trace event names of compute ops: ``{stage}{kind}{micro-batch}`` as :mod:`simgrid.trace` writes.
_COMPUTE_EVENT = re.compile(r"^(\d+)([A-Z]+)(\d+)$")
_MB_EVENT = re.compile(r"^(SEND|RECV) mb(\d+)$")


def register(subparsers: Any) -> None:
    """Add the ``plot`` sub-command."""
    p = subparsers.add_parser(
        "plot",
        help="draw a saved trace (gantt, memory) or sweep CSV (ranking, heatmap)",
        description="Draw a saved trace or sweep result to a PNG or SVG file.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("file", help="a trace (.json) or a sweep table (.csv)")
    p.add_argument("--kind", choices=TRACE_KINDS + SWEEP_KINDS,
                   help="what to draw (default: gantt for a trace, ranking for a sweep)")
    p.add_argument("--out", help="output image, .png or .svg (default: FILE_KIND.png next to the input)")
    p.add_argument("--ranks", help="comma-separated ranks to draw (trace plots)")
    p.add_argument("--top", type=positive_int, default=20, help="layouts in a ranking (default 20)")
    p.add_argument("--metric", default="tokens_per_s", help="heat-map metric column (default tokens_per_s)")
    p.add_argument("--gpus", type=positive_int, help="GPU count to show in a heat map of a mixed sweep")
    p.add_argument("--title", help="figure title")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Load the file, draw the requested kind and save it."""
    path = Path(args.file)
    if not path.is_file():
        raise PlotError(f"plot: file {args.file!r} does not exist")
    is_sweep = path.suffix.lower() == ".csv"
    kind = args.kind or ("ranking" if is_sweep else "gantt")
    if is_sweep != (kind in SWEEP_KINDS):
        wanted = "a sweep .csv" if kind in SWEEP_KINDS else "a trace .json"
        raise PlotError(f"plot: --kind {kind} needs {wanted}, got {args.file!r}")
    out = Path(args.out) if args.out else path.with_name(f"{path.stem}_{kind}.png")
    ranks = _ranks(args.ranks)
    fig = _plot_sweep(path, kind, args) if is_sweep else _plot_trace(path, kind, ranks, args.title)
    save_figure(fig, out)
    print(f"wrote {out}", file=sys.stderr)
    return 0


def _plot_sweep(path: Path, kind: str, args: argparse.Namespace) -> Any:
    import pandas as pd

    from simgrid.plots.sweep_views import plot_sweep_ranking, plot_tp_pp_heatmap

    try:
        df = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise PlotError(f"plot: {str(path)!r} is not a readable CSV: {str(exc).splitlines()[0]}") from None
    if kind == "ranking":
        return plot_sweep_ranking(df, top=args.top, title=args.title)
    return plot_tp_pp_heatmap(df, metric=args.metric, gpus=args.gpus, title=args.title)


def _plot_trace(path: Path, kind: str, ranks: list[int] | None, title: str | None) -> Any:
    trace = load_any_trace(path)
    heading = title if title is not None else trace_title(trace)
    if kind == "gantt":
        from simgrid.metrics import metrics_from_trace
        from simgrid.plots.gantt import plot_gantt

        metrics = metrics_from_trace(trace)
        if metrics is not None:
            print(f"{heading}: step {metrics.step_time_s:.4g} s, bubble {metrics.bubble_fraction:.1%}, "
                  f"MFU {metrics.mfu:.1%}", file=sys.stderr)
        return plot_gantt(trace, ranks=ranks, title=heading)
    from simgrid.plots.memory import memory_series, plot_memory_timeline

    try:
        memory_series(trace)
    except PlotError:
        raise PlotError(
            f"plot: {str(path)!r} holds no memory timeline (a simgrid trace carries it in "
            "meta['memory_timeline']); draw --kind gantt, or plot memory from Python with "
            "simgrid.plots.plot_memory_timeline(simulate(...).memory)"
        ) from None
    return plot_memory_timeline(trace, ranks=ranks, title=heading)


def trace_title(trace: Any) -> str | None:
    """``"model, layout"`` from the run description a simulated trace carries (None without one)."""
    from simgrid.cli.format import describe_layout
    from simgrid.errors import SimgridError
    from simgrid.layout import Layout

    model, layout = trace.meta.get("model"), trace.meta.get("layout")
    if not isinstance(model, dict) or not isinstance(layout, dict):
        return None
    try:
        return f"{model.get('name', 'model')}, {describe_layout(Layout.from_dict(layout))}"
    except (SimgridError, TypeError):
        return None


def load_any_trace(path: Path) -> Any:
    """A :class:`simgrid.trace.Trace` from a simgrid trace file or a Chrome/Perfetto trace JSON."""
    from simgrid.trace import TRACE_FORMAT, Trace

    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PlotError(f"plot: {str(path)!r} is not readable JSON: {exc}") from None
    if isinstance(data, dict) and data.get("format") == TRACE_FORMAT:
        return Trace.load(path)
    if isinstance(data, dict) and isinstance(data.get("traceEvents"), list):
        return trace_from_chrome(data)
    raise PlotError(
        f"plot: {str(path)!r} is neither a simgrid trace (format {TRACE_FORMAT!r}) nor a Chrome trace "
        "(a 'traceEvents' list); write one with `simgrid simulate --trace`"
    )


def trace_from_chrome(data: dict[str, Any]) -> Any:
    """Trace rows from Chrome trace JSON written by :meth:`simgrid.trace.Trace.to_chrome_trace`."""
    from simgrid.trace import Trace

    events = data["traceEvents"]
    threads: dict[tuple[Any, Any], str] = {}
    for ev in events:
        if isinstance(ev, dict) and ev.get("ph") == "M" and ev.get("name") == "thread_name":
            threads[(ev.get("pid"), ev.get("tid"))] = str((ev.get("args") or {}).get("name", ev.get("tid")))
    rows = []
    for ev in events:
        if not isinstance(ev, dict) or ev.get("ph") != "X":
            continue
        try:
            rank = int(ev["pid"])
            start_s = float(ev["ts"]) / 1e6
            end_s = start_s + float(ev.get("dur", 0.0)) / 1e6
        except (KeyError, TypeError, ValueError):
            raise PlotError(f"plot: Chrome trace event {ev!r} lacks a numeric pid, ts or dur") from None
        name = str(ev.get("name", ""))
        category = str(ev.get("cat", ""))
        args = ev.get("args") or {}
        kind, stage, microbatch = _kind_of(name)
        purpose = "compute" if category == "compute" else (category if category != kind else "")
        # simgrid writes every row field into args; older files and other tools get them from the name.
        try:
            rows.append({
                "rank": rank, "stream": threads.get((ev.get("pid"), ev.get("tid")), str(ev.get("tid"))),
                "op": str(args.get("op", name)), "kind": str(args.get("kind", kind)),
                "purpose": str(args.get("purpose", purpose)), "start_s": start_s, "end_s": end_s,
                "bytes": int(args.get("bytes", 0) or 0), "flops": float(args.get("flops", 0) or 0),
                "stage": int(args.get("stage", stage)), "microbatch": int(args.get("microbatch", microbatch)),
                "match": str(args.get("match", "")), "exposed_s": float(args.get("exposed_s", 0.0) or 0.0),
            })
        except (AttributeError, TypeError, ValueError):
            raise PlotError(f"plot: Chrome trace event {name!r} at pid {rank} has non-numeric args {args!r}") from None
    if not rows:
        raise PlotError("plot: the Chrome trace has no complete ('X') events to draw")
    return Trace.from_rows(rows, data.get("otherData") or {})


def _kind_of(name: str) -> tuple[str, int, int]:
    match = _COMPUTE_EVENT.match(name)
    if match:
        return match.group(2), int(match.group(1)), int(match.group(3))
    match = _MB_EVENT.match(name)
    if match:
        return match.group(1), -1, int(match.group(2))
    return (name.split(" ")[0] if name else "?"), -1, -1


def _ranks(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        ranks = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise PlotError(f"plot: --ranks {text!r} must be comma-separated integers, e.g. 0,8,16") from None
    if not ranks:
        raise PlotError("plot: --ranks is empty; give e.g. 0,8,16")
    return ranks
