"""``fleetserve engines list|rm``: inspect and prune the engine cache."""

from __future__ import annotations

from dataclasses import dataclass

from fleetserve.engine.builder import engine_cache
from fleetserve.engine.config import EngineConfig
from fleetserve.errors import UsageError
from fleetserve.options import option


@dataclass(frozen=True)
class EnginesOptions:
    action: str = option("list", "list: show cached engines; rm: remove them by key prefix", positional=True,
                         choices=("list", "rm"))
    key: str = option("", "rm: key or key prefix from `fleetserve engines list`", positional=True,
                      default_text="none")
    all: bool = option(False, "rm: remove every cached engine")

    def __post_init__(self) -> None:
        if self.action == "rm" and not self.key and not self.all:
            raise ValueError("engines rm needs a key prefix or --all")
        if self.action == "list" and (self.key or self.all):
            raise ValueError("engines list takes no key and no --all")


OPTIONS = EnginesOptions


def run(options: EnginesOptions) -> int:
    cache = engine_cache(EngineConfig())
    if options.action == "list":
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
    removed = cache.remove("" if options.all else options.key)
    if not removed:
        raise UsageError(f"no cached engine matches {options.key!r}")
    for key in removed:
        print(f"removed {key}")
    return 0
