"""Load generation for fleetserve: open- and closed-loop runs, reports, plots, ``fleetserve bench``."""

from fleetserve.bench.loadgen import LoadConfig, run_load
from fleetserve.bench.plot import plot_report
from fleetserve.bench.report import LoadReport, SecondStats

__all__ = ["LoadConfig", "LoadReport", "SecondStats", "plot_report", "run_load"]
