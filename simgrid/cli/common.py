"""Flags shared by every command that takes a model and a layout, and their conversion to specs."""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

from simgrid.errors import LayoutError, SimulationError
from simgrid.layout import OPTIMIZERS, PRECISIONS, RECOMPUTE_POLICIES, SCHEDULES, Layout, check_layout
from simgrid.model.spec import ModelSpec


def positive_int(text: str) -> int:
    """argparse type: an integer > 0 (the message names the value)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive integer")
    return value


def positive_number(text: str) -> float:
    """argparse type: a finite number > 0, accepting forms such as ``7e9``."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive finite number")
    return value


def add_model_args(parser: argparse.ArgumentParser, *, default_model: str | None = None) -> None:
    """``--model``/``--params`` (mutually exclusive) and ``--seq``."""
    group = parser.add_mutually_exclusive_group(required=default_model is None)
    group.add_argument(
        "--model",
        default=default_model,
        help="model preset name (see `simgrid models`) or a JSON file with ModelSpec fields"
        + (f" (default: {default_model})" if default_model else ""),
    )
    group.add_argument("--params", type=positive_number, help="a GPT-style model of about N parameters, e.g. 7e9")
    parser.add_argument("--seq", type=positive_int, help="sequence length in tokens (default: the model's)")


def add_layout_args(parser: argparse.ArgumentParser) -> None:
    """Every layout flag; defaults are those of :class:`simgrid.layout.Layout`."""
    g = parser.add_argument_group("layout")
    g.add_argument("--tp", type=positive_int, default=1, help="tensor-parallel degree (default 1)")
    g.add_argument("--pp", type=positive_int, default=1, help="pipeline-parallel degree (default 1)")
    g.add_argument("--cp", type=positive_int, default=1,
                   help="context-parallel degree: each rank holds seq/cp tokens of every sequence (default 1)")
    g.add_argument("--dp", type=positive_int, help="data-parallel degree (default: gpus / (tp*pp*cp), or 1)")
    g.add_argument("--vpp", type=positive_int, default=1, help="model chunks per pipeline rank (default 1)")
    g.add_argument("--zero", type=int, choices=(0, 1, 2, 3), default=0, help="ZeRO stage (default 0)")
    g.add_argument("--mbs", type=positive_int, default=1, help="micro-batch size in sequences (default 1)")
    g.add_argument("--gbs", type=positive_int, help="global batch in sequences (default: mbs * dp)")
    g.add_argument("--schedule", choices=SCHEDULES, help="pipeline schedule (default: none, or 1f1b if pp > 1)")
    g.add_argument("--recompute", choices=RECOMPUTE_POLICIES, default="none", help="activation recompute")
    g.add_argument("--sequence-parallel", action="store_true", help="Megatron sequence parallelism (tp > 1)")
    g.add_argument("--flash-attention", action="store_true",
                   help="fused attention core (FlashAttention): no s x s scores in HBM or activations")
    g.add_argument("--optimizer", choices=OPTIMIZERS, default="adam", help="optimizer (default adam)")
    g.add_argument("--precision", choices=PRECISIONS, default="bf16", help="training precision (default bf16)")
    g.add_argument("--offload", action="store_true", help="offload optimizer states and step to the host CPU")
    g.add_argument(
        "--dp-mode",
        choices=("allreduce", "parameter-server"),
        default="allreduce",
        help="gradient sync: bucketed all-reduce (DDP) or parameter server",
    )
    g.add_argument(
        "--no-overlap-grad-reduce",
        dest="overlap_grad_reduce",
        action="store_false",
        help="sync gradients after the last backward instead of overlapping it (Megatron-LM 2021)",
    )
    g.add_argument("--bucket-mb", type=positive_number, default=25.0, help="gradient bucket size in MB (default 25)")


def add_model_layout_args(parser: argparse.ArgumentParser, *, default_model: str | None = None) -> None:
    """Model flags and layout flags together."""
    add_model_args(parser, default_model=default_model)
    add_layout_args(parser)


def model_from_args(args: argparse.Namespace) -> ModelSpec:
    """Resolve ``--model``/``--params`` and apply ``--seq``."""
    from simgrid.model import get_model, model_from_params

    if getattr(args, "params", None):
        model = model_from_params(int(args.params))
    else:
        name = args.model
        model = _model_from_file(name) if name.endswith(".json") else get_model(name)
    if getattr(args, "seq", None):
        model = model.with_seq_length(args.seq)
    return model


def layout_from_args(args: argparse.Namespace, *, gpus: int | None = None) -> Layout:
    """Build the :class:`Layout`; dp defaults to ``gpus / (tp * pp * cp)`` when a GPU count is given."""
    dp = args.dp
    cp = getattr(args, "cp", 1)
    model_parallel = args.tp * args.pp * cp
    degrees = f"tp * pp * cp = {args.tp} * {args.pp} * {cp}" if cp > 1 else f"tp * pp = {args.tp} * {args.pp}"
    if gpus is not None:
        if gpus % model_parallel:
            raise LayoutError(
                f"--gpus {gpus} is not divisible by {degrees}; choose degrees whose product divides the GPU count"
            )
        derived = gpus // model_parallel
        if dp is None:
            dp = derived
        elif dp != derived:
            raise LayoutError(
                f"--dp {dp} with --tp {args.tp} --pp {args.pp}{f' --cp {cp}' if cp > 1 else ''} uses "
                f"{dp * model_parallel} GPUs, not --gpus {gpus}; drop --dp or make dp * {degrees.split(' = ')[0]} "
                "= gpus"
            )
    return Layout(
        dp=dp or 1,
        tp=args.tp,
        pp=args.pp,
        cp=cp,
        vpp=args.vpp,
        zero=args.zero,
        micro_batch_size=args.mbs,
        global_batch_size=args.gbs,
        schedule=args.schedule,
        recompute=args.recompute,
        sequence_parallel=args.sequence_parallel,
        flash_attention=args.flash_attention,
        precision=args.precision,
        optimizer=args.optimizer,
        offload_optimizer=args.offload,
        dp_mode=args.dp_mode,
        bucket_size_MB=args.bucket_mb,
        overlap_grad_reduce=getattr(args, "overlap_grad_reduce", True),
    )


def model_layout_from_args(args: argparse.Namespace, *, gpus: int | None = None) -> tuple[ModelSpec, Layout]:
    """Model and layout from parsed flags, with the model-dependent layout rules checked."""
    model = model_from_args(args)
    layout = layout_from_args(args, gpus=gpus)
    check_layout(model, layout)
    return model, layout


def print_json(data: Any) -> None:
    """Print a JSON document on stdout (sorted keys, indented); a NaN or infinity is refused, not printed
    as the non-JSON ``NaN``/``Infinity``."""
    bad = _non_finite(data)
    if bad:
        raise SimulationError(
            f"the result has {bad}, which JSON cannot hold: an input (a hardware profile's rate or overhead, "
            "a model size) is outside a physical range; check the extreme values"
        )
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=True, allow_nan=False) + "\n")


def _non_finite(data: Any, path: str = "") -> str:
    """``'step_time_s = inf'`` for the first NaN or infinite number in ``data``, else ``''``."""
    if isinstance(data, float) and not math.isfinite(data):
        return f"{path or 'a value'} = {data}"
    if isinstance(data, dict):
        items: Any = data.items()
    elif isinstance(data, list | tuple):
        items = enumerate(data)
    else:
        return ""
    for key, value in items:
        found = _non_finite(value, f"{path}.{key}" if path else str(key))
        if found:
            return found
    return ""


def _model_from_file(path: str) -> ModelSpec:
    from simgrid.model.spec import load_model_file

    return load_model_file(path)
