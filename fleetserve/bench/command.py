"""``fleetserve bench URL``: run a load, print the table, write JSON and a plot.

Exit status: 0 when the run completed, 1 when not one request succeeded, 2 for invalid arguments
(or ``--plot`` without matplotlib, caught before any load is sent). Ctrl-C ends the sending early;
outstanding requests finish and the report covers the time run so far.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import signal
from dataclasses import dataclass, replace
from pathlib import Path

from fleetserve.bench.loadgen import LoadConfig, run_load
from fleetserve.bench.report import LoadReport
from fleetserve.errors import UsageError
from fleetserve.eventloop import LOOPS, loop_factory
from fleetserve.options import option, section


def parse_header(text: str) -> tuple[str, str]:
    name, sep, value = text.partition(":")
    if not sep or not name.strip():
        raise ValueError(f"--header takes 'NAME: VALUE', got {text!r}")
    return name.strip(), value.strip()


@dataclass(frozen=True)
class BenchOptions:
    load: LoadConfig = section(LoadConfig)
    header: tuple[str, ...] = option((), "extra request header (repeatable), e.g. 'Authorization: Bearer ...'",
                                     metavar="'NAME: VALUE'")
    out: Path | None = option(None, "write the report as JSON", metavar="FILE.json")
    plot: Path | None = option(None, "write latency/errors over time as PNG (needs matplotlib)", metavar="FILE.png")
    per_second: bool = option(False, "also print the per-second table")
    loop: str = option("auto", "event loop (auto: uvloop if installed)", choices=LOOPS)

    def config(self) -> LoadConfig:
        return replace(self.load, headers=dict(parse_header(h) for h in self.header))


OPTIONS = BenchOptions


async def _run_until_interrupted(config: LoadConfig) -> LoadReport:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGINT, stop.set)
    try:
        return await run_load(config, stop=stop)
    finally:
        loop.remove_signal_handler(signal.SIGINT)


def run(options: BenchOptions) -> int:
    config = options.config()
    new_loop = loop_factory(options.loop)
    if options.plot is not None and importlib.util.find_spec("matplotlib") is None:
        raise UsageError("--plot needs matplotlib: pip install 'fleetserve[plot]'")
    with asyncio.Runner(loop_factory=new_loop) as runner:
        report = runner.run(_run_until_interrupted(config))
    print(report.summary_table(per_second=options.per_second))
    if options.out is not None:
        options.out.write_text(json.dumps(report.to_json(), indent=2) + "\n")
    if options.plot is not None:
        from fleetserve.bench.plot import plot_report

        plot_report(report, options.plot)
    return 0 if report.ok else 1
