"""``simgrid plot``: draw a saved trace (Gantt, memory over time) or a saved sweep (ranking, heat map).

A trace file is either a simgrid trace (``Trace.save``) or the Chrome/Perfetto JSON that
``simgrid simulate --trace`` writes; the latter is read back into trace rows (rank = pid, stream = thread
name, kind and stage/micro-batch from the event name) so either can be drawn.
"""

from __future__ import annotations

import argparse
import io
import re
import sys
from pathlib import Path
from typing import Any

from simgrid.cli.common import positive_int
from simgrid.io import atomic_output, check_output_path, parse_json, read_input_text, short_path
from simgrid.plots.canvas import SAVE_FORMATS, PlotError, save_figure

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
    if not args.file:
        raise PlotError("plot: the input file name is empty; give a trace (.json) or a sweep table (.csv)")
    is_sweep = path.suffix.lower() == ".csv"
    kind = args.kind or ("ranking" if is_sweep else "gantt")
    if is_sweep != (kind in SWEEP_KINDS):
        wanted = "a sweep .csv" if kind in SWEEP_KINDS else "a trace .json"
        raise PlotError(f"plot: --kind {kind} needs {wanted}, got {args.file!r}")
    out = Path(args.out) if args.out is not None else path.with_name(f"{path.stem}_{kind}.png")
    check_output_path(out, flag="--out", suffixes=SAVE_FORMATS, error=PlotError)
    ranks = _ranks(args.ranks)
    notes: list[str] = []  # printed once the file is written, so a failure stays one line
    fig = _plot_sweep(path, kind, args) if is_sweep else _plot_trace(path, kind, ranks, args.title, notes)
    with atomic_output(out, flag="--out", error=PlotError) as temp:
        save_figure(fig, temp)
    for note in notes:
        print(note, file=sys.stderr)
    print(f"wrote {out}", file=sys.stderr)
    return 0


def _plot_sweep(path: Path, kind: str, args: argparse.Namespace) -> Any:
    import pandas as pd

    from simgrid.plots.sweep_views import plot_sweep_ranking, plot_tp_pp_heatmap

    text = read_input_text(path, what="sweep file", error=PlotError)
    try:
        df = pd.read_csv(io.StringIO(text))
    except (pd.errors.ParserError, pd.errors.EmptyDataError, ValueError, OverflowError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise PlotError(f"plot: {short_path(path)} is not a readable CSV: {reason}") from None
    if kind == "ranking":
        return plot_sweep_ranking(df, top=args.top, title=args.title)
    return plot_tp_pp_heatmap(df, metric=args.metric, gpus=args.gpus, title=args.title)


def _plot_trace(path: Path, kind: str, ranks: list[int] | None, title: str | None, notes: list[str]) -> Any:
    trace = load_any_trace(path)
    heading = title if title is not None else trace_title(trace)
    if kind == "gantt":
        from simgrid.metrics import metrics_from_trace
        from simgrid.plots.gantt import plot_gantt

        metrics = metrics_from_trace(trace)
        if metrics is not None:
            notes.append(f"{heading}: step {metrics.step_time_s:.4g} s, bubble {metrics.bubble_fraction:.1%}, "
                         f"MFU {metrics.mfu:.1%}")
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
    from simgrid.trace import TRACE_FORMAT

    source = f"trace file {short_path(path)}"
    data = parse_json(read_input_text(path, what="trace file", error=PlotError), source=source, error=PlotError)
    if isinstance(data, dict) and data.get("format") == TRACE_FORMAT:
        return trace_from_saved(data, source)
    if isinstance(data, dict) and isinstance(data.get("traceEvents"), list):
        return trace_from_chrome(data)
    raise PlotError(
        f"plot: {str(path)!r} is neither a simgrid trace (format {TRACE_FORMAT!r}) nor a Chrome trace "
        "(a 'traceEvents' list); write one with `simgrid simulate --trace`"
    )


def trace_from_saved(data: dict[str, Any], source: str) -> Any:
    """A :class:`simgrid.trace.Trace` from the JSON of ``Trace.save``, each part checked before use."""
    from simgrid.trace import COLUMNS, Trace

    columns, rows, meta = data.get("columns"), data.get("rows", []), data.get("meta") or {}
    if not isinstance(columns, list) or not all(isinstance(c, str) and c in COLUMNS for c in columns):
        raise PlotError(f"plot: {source}: 'columns' must list trace columns ({', '.join(COLUMNS)})")
    if not isinstance(rows, list) or not all(isinstance(r, list) and len(r) == len(columns) for r in rows):
        raise PlotError(f"plot: {source}: 'rows' must be a list of rows of {len(columns)} values (one per column)")
    if not isinstance(meta, dict):
        raise PlotError(f"plot: {source}: 'meta' must be an object")
    multiplicity = meta.get("multiplicity", {})
    if not isinstance(multiplicity, dict) or not all(
            isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= 10**7 for v in multiplicity.values()):
        raise PlotError(f"plot: {source}: meta.multiplicity must map ranks to how many ranks each stands for "
                        "(integers from 1)")
    for index, row in enumerate(rows):
        for column, value in zip(columns, row, strict=True):
            if isinstance(value, list | dict):
                raise PlotError(f"plot: {source}: row {index} {column} = {_shown(value)} must be a single value")
            if isinstance(value, int | float) and not isinstance(value, bool) and not -1e300 < value < 1e300:
                raise PlotError(f"plot: {source}: row {index} {column} = {_shown(value)} is out of range")
    trace = Trace.from_rows([dict(zip(columns, values, strict=True)) for values in rows], meta)
    _check_ranks(trace, source)
    return trace


def _check_ranks(trace: Any, source: str) -> None:
    ranks = trace.ranks()
    if ranks and (min(ranks) < 0 or max(ranks) > 10**7):
        raise PlotError(f"plot: {source}: rank {max(ranks) if max(ranks) > 10**7 else min(ranks)} is not a rank "
                        "number (0 to 10,000,000)")


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:40]}... ({len(text)} characters)"


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
            rank = _number(ev["pid"], int)
            start_s = _number(ev["ts"], float) / 1e6
            end_s = start_s + _number(ev.get("dur", 0.0), float) / 1e6
            args = ev.get("args") or {}
            if not isinstance(args, dict) or not isinstance(ev.get("name", ""), str) \
                    or not isinstance(ev.get("tid", 0), int | str) or isinstance(ev.get("tid"), bool):
                raise TypeError("args, name or tid")
            size, flops = _number(args.get("bytes", 0) or 0, int), _number(args.get("flops", 0) or 0, float)
        except (KeyError, TypeError, ValueError, OverflowError):
            raise PlotError(f"plot: Chrome trace event {_shown(ev)} lacks a numeric pid, ts or dur, or its name, "
                            "tid or args have the wrong type") from None
        name = str(ev.get("name", ""))
        category = str(ev.get("cat", ""))
        kind, stage, microbatch = _kind_of(name)
        purpose = "compute" if category == "compute" else (category if category != kind else "")
        # simgrid writes every row field into args; older files and other tools get them from the name.
        try:
            rows.append({
                "rank": rank, "stream": threads.get((ev.get("pid"), ev.get("tid")), str(ev.get("tid"))),
                "op": str(args.get("op", name)), "kind": str(args.get("kind", kind)),
                "purpose": str(args.get("purpose", purpose)), "start_s": start_s, "end_s": end_s,
                "bytes": size, "flops": flops, "stage": _number(args.get("stage", stage), int),
                "microbatch": _number(args.get("microbatch", microbatch), int),
                "match": str(args.get("match", "")), "exposed_s": _number(args.get("exposed_s", 0.0) or 0.0, float),
            })
        except (AttributeError, TypeError, ValueError, OverflowError):
            raise PlotError(f"plot: Chrome trace event {_shown(name)} at pid {rank} has non-numeric args "
                            f"{_shown(args)}") from None
    if not rows:
        raise PlotError("plot: the Chrome trace has no complete ('X') events to draw")
    other = data.get("otherData") or {}
    if not isinstance(other, dict):
        raise PlotError("plot: the Chrome trace's otherData must be an object")
    trace = Trace.from_rows(rows, other)
    _check_ranks(trace, "the Chrome trace")
    return trace


def _number(value: Any, kind: type) -> Any:
    """``int(value)`` or ``float(value)`` of a JSON number (not a bool, text or list), finite and < 1e300."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not -1e300 < value < 1e300:
        raise ValueError(value)
    return kind(value)


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
