"""``simgrid models``: the model presets."""

from __future__ import annotations

import argparse
from typing import Any

from simgrid.cli.common import print_json


def register(subparsers: Any) -> None:
    """Add the ``models`` sub-command."""
    p = subparsers.add_parser(
        "models",
        help="list model presets",
        description="List the built-in model presets with their shapes and parameter counts.",
        epilog="example: simgrid models --json",
    )
    p.add_argument("--json", action="store_true",
                   help="print JSON (each entry includes `params` and, for MoE models, fewer `active_params`)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print every preset with its parameter count."""
    from simgrid.model import list_models, param_count
    from simgrid.model.params import active_param_count

    models = list_models()
    if args.json:
        print_json([{**m.to_dict(), "params": param_count(m), "active_params": active_param_count(m)}
                    for m in models])
        return 0
    print(f"{'name':<18} {'params':>9} {'layers':>6} {'hidden':>6} {'heads':>5} {'kv':>4} {'ffn':>6} {'vocab':>7} {'seq':>5}"
          f" {'experts':>8}")
    for m in models:
        experts = f"{m.moe.num_experts} top-{m.moe.top_k}" if m.moe is not None else "-"
        print(
            f"{m.name:<18} {param_count(m) / 1e9:>8.2f}B {m.num_layers:>6} {m.hidden_size:>6} {m.num_heads:>5} "
            f"{m.kv_heads:>4} {m.ffn_size:>6} {m.vocab_size:>7} {m.seq_length:>5} {experts:>8}"
        )
    return 0
