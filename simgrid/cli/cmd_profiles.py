"""``simgrid profiles``: the hardware profiles on the search path."""

from __future__ import annotations

import argparse
from typing import Any

from simgrid.cli.common import print_json


def register(subparsers: Any) -> None:
    """Add the ``profiles`` sub-command."""
    p = subparsers.add_parser(
        "profiles",
        help="list hardware profiles (GPUs, nodes, clusters)",
        description="List the hardware profiles found on the search path (built-in, "
        "~/.config/simgrid/profiles and $SIMGRID_PROFILE_PATH).",
        epilog="example: simgrid profiles --json",
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print every profile by kind."""
    from simgrid.hardware import list_profiles, profile_search_path

    infos = list_profiles()
    if args.json:
        print_json(
            [{"kind": i.kind, "name": i.name, "description": i.description, "path": str(i.path)} for i in infos]
        )
        return 0
    for kind in ("gpu", "node", "cluster"):
        rows = [i for i in infos if i.kind == kind]
        print(f"{kind}s:")
        width = max((len(i.name) for i in rows), default=0)
        for info in rows:
            print(f"  {info.name:<{width}}  {info.description}")
    print("search path: " + ", ".join(str(p) for p in profile_search_path()))
    return 0
