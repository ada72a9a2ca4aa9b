"""``fleetserve engines list|rm``: inspect and prune the engine cache."""

from __future__ import annotations

import argparse

from fleetserve.config import EngineConfig
from fleetserve.engine.builder import engine_cache


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True)
    sub.add_parser("list", help="list cached engines")
    rm = sub.add_parser("rm", help="remove cached engines by key prefix (or --all)")
    rm.add_argument("key", nargs="?", default="", help="key or key prefix from `fleetserve engines list`")
    rm.add_argument("--all", action="store_true")


def run(args: argparse.Namespace) -> int:
    cache = engine_cache(EngineConfig())
    if args.action == "list":
        entries = cache.entries()
        if not entries:
            print(f"no engines cached in {cache.root}")
            return 0
        print(f"{'key':<34}{'model':<12}{'backend':<13}{'precision':<10}{'device':<8}{'MiB':>8}")
        for e in entries:
            m = e.meta
            print(f"{e.key:<34}{m.get('model', '?')!s:<12}{m.get('backend', '?')!s:<13}"
                  f"{m.get('precision', '?')!s:<10}{m.get('device', '?')!s:<8}{e.size_bytes / 2**20:>8.1f}")
        return 0
    if not args.key and not args.all:
        raise ValueError("give a key prefix or --all")
    removed = cache.remove("" if args.all else args.key)
    if not removed:
        raise ValueError(f"no cached engine matches {args.key!r}")
    for key in removed:
        print(f"removed {key}")
    return 0
