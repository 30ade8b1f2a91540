"""Flags shared by every command that takes a model and a layout, and their conversion to specs."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from typing import Any

from simgrid.errors import LayoutError, ModelError, SimulationError
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


def add_model_args(parser: argparse.ArgumentParser, *, default_model: str | None = None, required: bool = True) -> None:
    """``--model``/``--params`` (mutually exclusive) and ``--seq``."""
    group = parser.add_mutually_exclusive_group(required=required and default_model is None)
    group.add_argument(
        "--model",
        default=default_model,
        help="model preset name (see `simgrid models`) or a JSON file with ModelSpec fields"
        + (f" (default: {default_model})" if default_model else ""),
    )
    group.add_argument("--params", type=positive_number,
                       help="a GPT-style model of N parameters, e.g. 7.5e9 (matched to within the shape's "
                       "granularity, which the report states)")
    parser.add_argument("--seq", type=positive_int, help="sequence length in tokens (default: the model's)")
    parser.add_argument("--moe-imbalance", type=float, metavar="X",
                        help="MoE models: tokens the busiest expert-parallel rank receives over the mean (>= 1; "
                        "default: the model's, 1.0 = balanced)")


class Parser(argparse.ArgumentParser):
    """``ArgumentParser`` that refuses abbreviated long options: ``--gpu`` must never silently mean
    ``--gpus`` (every ``simgrid`` and ``simgrid-exec`` parser and sub-parser is one of these)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)


def comma_list(item: Any, what: str = "value") -> Any:
    """argparse type: a comma-separated list of ``item(text)`` values, as a tuple (at least one)."""
    def parse(text: str) -> tuple[Any, ...]:
        values = tuple(item(v.strip()) for v in text.split(",") if v.strip())
        if not values:
            raise argparse.ArgumentTypeError(f"{text!r}: give one or more comma-separated {what}s, e.g. 1,2,4")
        return values

    return parse


def _choice_list(allowed: tuple[Any, ...], convert: Any = str) -> Any:
    def one(text: str) -> Any:
        try:
            value = convert(text)
        except ValueError:
            value = None
        if value not in allowed:
            raise argparse.ArgumentTypeError(
                f"{text!r}: use a comma-separated subset of {','.join(str(a) for a in allowed)}")
        return value

    return one


SWITCH_CHOICES = ("off", "on", "both")
"""Values a switch flag takes in list mode (``both`` tries it off and on)."""


def add_layout_args(parser: argparse.ArgumentParser, *, lists: bool = False) -> None:
    """Every layout flag, the same names and meanings for every command; defaults are those of
    :class:`simgrid.layout.Layout`.

    ``lists=True`` (``simgrid sweep``): the degrees, ``--zero``, ``--mbs``, ``--schedule`` and
    ``--recompute`` take comma-separated lists of values to try and default to "search them all";
    ``--sequence-parallel``, ``--flash-attention``, ``--tp-comm-overlap`` and ``--overlap-param-gather`` also
    take ``off``, ``on`` or ``both``.
    """
    g = parser.add_argument_group("layout" + (" (comma-separated lists: values to try)" if lists else ""))

    def number(flag: str, default: int | None, text: str, **kw: Any) -> None:
        if lists:
            g.add_argument(flag, type=comma_list(positive_int, "positive integer"), help=text + " (default: search)",
                           **kw)
        else:
            # Stored as None when not given, so an imported pipeline order can tell what the user set.
            g.add_argument(flag, type=positive_int,
                           help=text + (f" (default {default})" if default is not None else ""), **kw)

    def choice(flags: tuple[str, ...], allowed: tuple[Any, ...], default: Any, text: str, convert: Any = str) -> None:
        if lists:
            g.add_argument(*flags, type=comma_list(_choice_list(allowed, convert), "choice"),
                           help=f"{text}: any of {','.join(str(a) for a in allowed)} (default: search)")
        else:
            g.add_argument(*flags, type=convert, choices=allowed, default=default,
                           help=f"{text} (default {default})" if default is not None else text)

    def switch(flag: str, text: str) -> None:
        if lists:
            g.add_argument(flag, nargs="?", const="on", default="off", choices=SWITCH_CHOICES,
                           help=f"{text}: off, on or both (default off; the bare flag means on)")
        else:
            g.add_argument(flag, action="store_true", help=text)

    number("--tp", 1, "tensor-parallel degree")
    number("--pp", 1, "pipeline-parallel degree")
    number("--cp", 1, "context-parallel degree: each rank holds seq/cp tokens of every sequence")
    number("--ep", 1, "expert-parallel degree (MoE models; the experts fold over the tp*cp*dp ranks of a stage)")
    number("--etp", None, "expert tensor-parallel degree (MoE models; default: tp)"
           + ("; the search tries 1 and tp" if lists else ""))
    if lists:
        g.add_argument("--dp", type=comma_list(positive_int, "positive integer"),
                       help="data-parallel degree (default: gpus / (tp*pp*cp))")
    else:
        g.add_argument("--dp", type=positive_int, help="data-parallel degree (default: gpus / (tp*pp*cp), or 1)")
    number("--vpp", 1, "model chunks per pipeline rank (interleaved, looped-bfs, zbv, dualpipev)")
    choice(("--zero",), (0, 1, 2, 3), 0, "ZeRO stage", int)
    number("--mbs", 1, "micro-batch size in sequences")
    if lists:
        g.add_argument("--gbs", type=positive_int, required=True, help="global batch in sequences")
    else:
        g.add_argument("--gbs", type=positive_int, help="global batch in sequences (default: mbs * dp)")
    choice(("--schedule", "--schedules") if lists else ("--schedule",),
           tuple(s for s in SCHEDULES if s != "none") if lists else SCHEDULES, None,
           "pipeline schedule (default: none, or 1f1b if pp > 1)" if not lists else "pipeline schedule")
    choice(("--recompute",), RECOMPUTE_POLICIES, "none", "activation recompute")
    switch("--sequence-parallel", "Megatron sequence parallelism (tp > 1)")
    switch("--flash-attention", "fused attention core (FlashAttention): no s x s scores in HBM or activations")
    if lists:  # a search sets them only where they apply; the other layouts keep them off
        switch("--tp-comm-overlap", "Megatron-Core --tp-comm-overlap, tried on layouts with tp > 1 and sequence "
                                    "parallelism")
        switch("--overlap-param-gather", "Megatron-Core --overlap-param-gather, tried on ZeRO-1 layouts with "
                                         "overlapped gradient reduce")
    else:
        g.add_argument("--tp-comm-overlap", action="store_true",
                       help="Megatron-Core --tp-comm-overlap: Transformer Engine overlaps the sequence-parallel "
                            "all-gathers / reduce-scatters with their GEMMs in chunks (needs tp > 1 and "
                            "--sequence-parallel)")
        g.add_argument("--tp-async-grad-comm", action="store_true",
                       help="Megatron-LM's asynchronous TP backward communication: the column-parallel linear's "
                            "input-gradient all-reduce / reduce-scatter runs beside its weight-gradient GEMM")
        g.add_argument("--grad-accumulation-fusion", action="store_true",
                       help="Megatron-LM's gradient accumulation fusion (Megatron-Core's default): weight-gradient "
                            "GEMMs accumulate into main_grad (their epilogue reads and writes it; needs --zero 0-2)")
        g.add_argument("--overlap-param-gather", action="store_true",
                       help="Megatron-Core --overlap-param-gather: ZeRO-1 all-gathers the updated parameters bucket "
                            "by bucket during the next step's forward instead of after the optimizer step "
                            "(needs --zero 1)")
        g.add_argument("--p2p-order", default="witness", metavar="{witness,megatron-core,megatron-batched}",
                       help="where pipeline sends/receives are posted: witness (each peer pair in unit-time "
                            "producer order, receives as early as that allows; default), megatron-core "
                            "(Megatron-Core's overlapped p2p of the interleaved schedule; needs "
                            "--schedule interleaved-1f1b) or megatron-batched (Megatron-LM's batched p2p, each "
                            "call waited for at once; --schedule 1f1b or interleaved-1f1b)")
        g.add_argument("--p2p-scatter-gather", action="store_true",
                       help="Megatron-LM 2021/2022 scatter_gather_tensors_in_pipeline: each TP rank sends 1/tp of "
                            "a pipeline tensor, the receiver all-gathers it over TP (needs --p2p-order "
                            "megatron-batched, no --sequence-parallel)")
    g.add_argument("--attention-kernel", choices=("auto", "fa2", "fa3"), default="auto",
                   help="fused-attention kernel priced with --flash-attention: fa2, fa3 or auto (the GPU's default)")
    g.add_argument("--kernel-fusion", choices=("fused", "eager", "eager-fused-norm"), default="fused",
                   help="element-wise kernels between GEMMs: fused (Megatron/TE, torch.compile) or PyTorch eager")
    g.add_argument("--optimizer", choices=OPTIMIZERS, default="adam", help="optimizer (default adam)")
    g.add_argument("--optimizer-impl", default="fused", metavar="{fused,foreach}",
                   help="GPU optimizer step: fused (one multi-tensor kernel: Megatron/TE FusedAdam, torchtitan since "
                        "Feb 2025; default) or foreach (torch.optim foreach=True, host-bound per parameter tensor)")
    g.add_argument("--precision", choices=PRECISIONS, default="bf16", help="training precision (default bf16)")
    g.add_argument("--fp8", dest="fp8_recipe", default="none", metavar="{none,delayed,current}",
                   help="Transformer Engine fp8 autocast of the transformer layers' linear layers: none (default), "
                        "delayed (DelayedScaling) or current (Float8CurrentScaling, NeMo's FP8-CS); needs bf16/fp16")
    g.add_argument("--fp8-params", action="store_true",
                   help="NeMo's fp8 weights (model.fp8_params): Transformer Engine Float8Tensor parameters, no 16-bit "
                        "copy, all-gathered as 1-byte uint8 by apex DistributedFusedAdam (needs --fp8 delayed and "
                        "--zero 1 --zero-impl apex)")
    g.add_argument("--fp8-amax-reduction", default="stage", metavar="{stage,tp,tp-async-region,none}",
                   help="Transformer Engine delayed-scaling amax all-reduce: stage (default: TE v1.6+, Megatron-Core's "
                        "tensor+data+context-parallel group), tp (Megatron-Core 0.7), tp-async-region (TE 2023, "
                        "NVTE_ASYNC_AMAX_REDUCTION=1) or none (reduce_amax off)")
    g.add_argument("--fp8-attention-amax", action=argparse.BooleanOptionalAction, default=True,
                   help="TE's DotProductAttention joins the amax buffers (TE v1.8 on; default); "
                        "--no-fp8-attention-amax for older TE")
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
    g.add_argument("--bucket-policy", choices=("ddp", "megatron"), default="ddp",
                   help="gradient buckets: ddp (--bucket-mb on every stage; default) or megatron (Megatron-Core: "
                        "max(40M, 1M x dp) parameters on the first pipeline rank, one bucket per chunk elsewhere)")
    g.add_argument("--zero-impl", default="deepspeed", metavar="{deepspeed,fsdp2,apex}",
                   help="how ZeRO-3 gathers and reduces: DeepSpeed ZeRO stage 3 (per module, its default "
                        "prefetch, reuse and bucket sizes; default) or PyTorch FSDP2 (per layer); with --zero 1, "
                        "apex is NeMo's apex DistributedFusedAdam (one bucket per layer padded to --bucket-mb, "
                        "per-chunk sync under Megatron-Core's schedules)")
    g.add_argument("--reduce-dtype", choices=("param", "fp32"), default="param",
                   help="gradient reduce dtype: param (16-bit under mixed precision; default) or fp32: with "
                        "--zero 0-2 Megatron-LM's fp32 main_grad (4-byte gradients, all-reduced / reduce-scattered "
                        "in fp32; Megatron's bf16 default), with --zero 3 FSDP2's fp32 reduce-scatter (torchtitan's "
                        "default; needs --zero-impl fsdp2)")
    g.add_argument("--cross-entropy", default="fused", metavar="{fused,unfused}",
                   help="the loss's working memory: fused (Megatron-Core's vocab-parallel kernel, fp32 softmax "
                        "built and differentiated in place; default) or unfused (PyTorch F.cross_entropy on an fp32 "
                        "copy of the logits, as torchtitan calls it)")
    g.add_argument("--tp-impl", default="megatron", metavar="{megatron,dtensor}",
                   help="whose tensor parallelism: megatron ([s, b, h] activations; default) or dtensor (torchtitan's "
                        "DTensor TP on [b, s, h]: a chunk + cat copy per sequence-parallel gather and scatter)")
    g.add_argument("--checkpoint-impl", default="reentrant", metavar="{reentrant,non-reentrant,non-reentrant-modules}",
                   help="how --recompute full checkpoints: reentrant (Megatron-LM: reruns each layer's whole forward; "
                        "default), non-reentrant (torch.utils.checkpoint(use_reentrant=False) per layer, torchtitan: "
                        "the recompute stops before the MLP's second GEMM) or non-reentrant-modules (attention and MLP "
                        "wrapped apart, NeMo AutoModel: no norm, residual add or output projection is rerun)")
    g.add_argument("--dropout", default="auto", metavar="{auto,on,off}",
                   help="whether the run trains with dropout (its masks' bytes and memory): auto (the model's usual "
                        "recipe: GPT with biases on, Llama off; default), on, or off (e.g. MLPerf GPT-3's dropout 0)")


def fixed_recipe_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The layout fields a search keeps as given (optimizer, precision, offload, gradient sync, ZeRO-3
    implementation, gradient reduce dtype and cross-entropy implementation); :func:`layout_from_args` takes
    them from here too, so a new recipe flag is read in one place."""
    return {"optimizer": args.optimizer, "precision": args.precision, "offload_optimizer": args.offload,
            "dp_mode": args.dp_mode, "bucket_size_MB": args.bucket_mb,
            "bucket_policy": getattr(args, "bucket_policy", "ddp"),
            "overlap_grad_reduce": getattr(args, "overlap_grad_reduce", True),
            "attention_kernel": getattr(args, "attention_kernel", "auto"),
            "kernel_fusion": getattr(args, "kernel_fusion", "fused"),
            "optimizer_impl": getattr(args, "optimizer_impl", "fused"),
            "zero_impl": getattr(args, "zero_impl", "deepspeed"), "reduce_dtype": getattr(args, "reduce_dtype", "param"),
            "cross_entropy": getattr(args, "cross_entropy", "fused"), "tp_impl": getattr(args, "tp_impl", "megatron"),
            "checkpoint_impl": getattr(args, "checkpoint_impl", "reentrant"),
            "fp8_recipe": getattr(args, "fp8_recipe", "none"), "fp8_params": getattr(args, "fp8_params", False),
            "fp8_amax_reduction": getattr(args, "fp8_amax_reduction", "stage"),
            "fp8_attention_amax": getattr(args, "fp8_attention_amax", True),
            "dropout": getattr(args, "dropout", "auto")}


def add_hardware_args(parser: argparse.ArgumentParser, *, cluster_required: bool, gpu_profile: bool,
                      gpus_required: bool = False) -> None:
    """``--cluster NAME`` and ``--gpus N`` (a count) for every command; ``--gpu NAME`` (a GPU profile) where
    a GPU alone is enough (``memory``). A command that needs a cluster explains ``--gpu`` instead of
    taking it."""
    g = parser.add_argument_group("hardware")
    g.add_argument("--cluster", required=cluster_required,
                   help="cluster profile name or file (see `simgrid profiles`)"
                   + ("" if cluster_required else "; its GPU is the one checked"))
    g.add_argument("--gpus", type=positive_int, required=gpus_required,
                   help="number of GPUs in the run" + ("" if gpus_required else " (default: dp * tp * pp * cp)"))
    if gpu_profile:
        g.add_argument("--gpu", help="GPU profile name or file to check against (see `simgrid profiles`)")
    else:
        g.add_argument("--gpu", action=_GpuNeedsCluster, help=argparse.SUPPRESS)


class _GpuNeedsCluster(argparse.Action):
    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        parser.error(f"--gpu {values} names one GPU profile, which `simgrid memory` checks; this command "
                     "simulates a whole cluster: give --cluster NAME (see `simgrid profiles`) and --gpus N")


def add_headroom_arg(parser: argparse.ArgumentParser) -> None:
    """``--headroom-gib``: GPU memory the fit verdict keeps free of tensors."""
    parser.add_argument(
        "--headroom-gib", type=float, metavar="GIB",
        help="GPU memory to keep free for the CUDA context and allocator fragmentation (default: 0.5 GiB + "
        "11.5%% of capacity; 0 compares with the whole capacity)",
    )


def headroom_from_args(args: argparse.Namespace) -> Any:
    """The :class:`~simgrid.memory.MemoryHeadroom` the flags ask for."""
    from simgrid.memory.headroom import DEFAULT_HEADROOM, MemoryHeadroom

    value = getattr(args, "headroom_gib", None)
    if value is None:
        return DEFAULT_HEADROOM
    if not value >= 0 or value == float("inf"):
        raise LayoutError(f"--headroom-gib {value} must be a finite number of GiB >= 0")
    return MemoryHeadroom.fixed(int(value * 2**30))


def add_model_layout_args(parser: argparse.ArgumentParser, *, default_model: str | None = None,
                          model_required: bool = True) -> None:
    """Model flags and layout flags together."""
    add_model_args(parser, default_model=default_model, required=model_required)
    add_layout_args(parser)


def add_pipeline_csv_arg(parser: argparse.ArgumentParser) -> None:
    """``--pipeline-csv F.csv``: the pipeline order from a torch schedule CSV."""
    parser.add_argument(
        "--pipeline-csv", metavar="F.csv",
        help="take the pipeline order from a torch.distributed.pipelining schedule CSV (either format); "
        "pp, vpp, the stage placement and the micro-batch count follow from it",
    )


def pipeline_order_from_args(args: argparse.Namespace) -> Any:
    """The order of ``--pipeline-csv`` (None without the flag)."""
    path = getattr(args, "pipeline_csv", None)
    if not path:
        return None
    from simgrid.schedules.imported import read_pipeline_csv

    return read_pipeline_csv(path)


def model_from_args(args: argparse.Namespace) -> ModelSpec:
    """Resolve ``--model``/``--params`` and apply ``--seq``."""
    from simgrid.model import get_model, model_from_params

    if getattr(args, "params", None):
        model = model_from_params(args.params)
    else:
        name = args.model
        if not name:
            raise ModelError("no model given; pass --model NAME (see `simgrid models`) or --params N")
        model = _model_from_file(name) if name.endswith(".json") else get_model(name)
    if getattr(args, "seq", None):
        model = model.with_seq_length(args.seq)
    imbalance = getattr(args, "moe_imbalance", None)
    if imbalance is not None:
        if model.moe is None:
            raise ModelError(f"--moe-imbalance applies to MoE models; {model.name!r} has no experts; drop the flag")
        model = dataclasses.replace(model, moe=dataclasses.replace(model.moe, load_imbalance=imbalance))
    return model


def layout_from_args(args: argparse.Namespace, *, gpus: int | None = None, order: Any = None) -> Layout:
    """Build the :class:`Layout`; dp defaults to ``gpus / (tp * pp * cp)`` when a GPU count is given.
    With an imported pipeline ``order``, pp, vpp, the schedule's placement and the global batch come from
    it (an explicit flag that disagrees is an error)."""
    tp, cp, mbs = args.tp or 1, getattr(args, "cp", None) or 1, args.mbs or 1
    pp, vpp, gbs = args.pp or 1, args.vpp or 1, args.gbs
    source = f"--pipeline-csv {getattr(args, 'pipeline_csv', None)}"
    if order is not None:
        from simgrid.schedules.imported import order_shape

        pp_found, vpp_found, _, m_found = order_shape(order, source)
        for flag, given, found in (("--pp", args.pp, pp_found), ("--vpp", args.vpp, vpp_found)):
            if given is not None and given != found:
                raise LayoutError(f"{flag} {given} disagrees with {source}, whose order has {flag[2:]} {found}; "
                                  f"drop {flag} (the order sets it)")
        pp, vpp = pp_found, vpp_found
    dp = args.dp
    model_parallel = tp * pp * cp
    degrees = f"tp * pp * cp = {tp} * {pp} * {cp}" if cp > 1 else f"tp * pp = {tp} * {pp}"
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
                f"--dp {dp} with --tp {tp} --pp {pp}{f' --cp {cp}' if cp > 1 else ''} uses "
                f"{dp * model_parallel} GPUs, not --gpus {gpus}; drop --dp or make dp * {degrees.split(' = ')[0]} "
                "= gpus"
            )
    dp = dp or 1
    fields: dict[str, Any] = dict(
        dp=dp, tp=tp, pp=pp, cp=cp, ep=getattr(args, "ep", None) or 1, etp=getattr(args, "etp", None),
        vpp=vpp, zero=args.zero, micro_batch_size=mbs, global_batch_size=gbs,
        schedule=args.schedule, recompute=args.recompute, sequence_parallel=args.sequence_parallel,
        flash_attention=args.flash_attention,
        tp_comm_overlap=getattr(args, "tp_comm_overlap", False),
        tp_async_grad_comm=getattr(args, "tp_async_grad_comm", False),
        grad_accumulation_fusion=getattr(args, "grad_accumulation_fusion", False),
        overlap_param_gather=getattr(args, "overlap_param_gather", False),
        p2p_order=getattr(args, "p2p_order", "witness"),
        p2p_scatter_gather=getattr(args, "p2p_scatter_gather", False),
        **fixed_recipe_from_args(args),
    )
    if order is None:
        return Layout(**fields)
    from simgrid.schedules.imported import layout_for_order

    if gbs is None:
        fields["global_batch_size"] = m_found * mbs * dp
    if args.schedule is None:  # a placeholder of the order's shape; layout_for_order picks the placement
        fields.update(vpp=1, schedule="1f1b" if pp > 1 else "none")
    return layout_for_order(order, Layout(**fields), source)


def model_layout_from_args(args: argparse.Namespace, *, gpus: int | None = None,
                           order: Any = None) -> tuple[ModelSpec, Layout]:
    """Model and layout from parsed flags, with the model-dependent layout rules checked (with an
    imported pipeline ``order``, the layout takes the order's pipeline shape)."""
    model = model_from_args(args)
    layout = layout_from_args(args, gpus=gpus, order=order)
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
