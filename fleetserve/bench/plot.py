"""Plots a load report: p50 and p99 latency per second, errors marked, throughput below.

matplotlib is optional (``pip install fleetserve[plot]``); it is imported only here, with the
non-interactive Agg backend so plotting works on headless machines.
"""

from __future__ import annotations

from pathlib import Path

from fleetserve.bench.report import LoadReport


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed."""


def plot_report(report: LoadReport, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise PlotUnavailable("plotting needs matplotlib: pip install 'fleetserve[plot]' (or matplotlib)") from exc

    rows = report.timeseries
    t = [r.t for r in rows]
    fig, (lat_ax, rate_ax) = plt.subplots(2, 1, sharex=True, figsize=(10, 6), height_ratios=(3, 1))
    lat_ax.plot(t, [r.p50_s * 1e3 for r in rows], marker=".", label="p50")
    lat_ax.plot(t, [r.p99_s * 1e3 for r in rows], marker=".", label="p99")
    failed = [r for r in rows if r.errors]
    if failed:
        # Errors sit on the x axis: their seconds may have no latency samples at all.
        lat_ax.scatter([r.t for r in failed], [0.0] * len(failed), marker="x", color="red", label="errors", zorder=3)
        for r in failed:
            lat_ax.annotate(
                str(r.errors),
                (r.t, 0.0),
                textcoords="offset points",
                xytext=(0, 6),
                ha="center",
                color="red",
                fontsize=7,
            )
    lat_ax.set_ylabel("latency (ms)")
    lat_ax.set_ylim(bottom=0)
    lat_ax.legend(loc="upper left")
    load = (
        f"{report.target_rps:g} req/s target" if report.target_rps else f"{report.config.get('concurrency')} concurrent"
    )
    lat_ax.set_title(f"{report.config.get('url')}  {report.config.get('workload')}  {report.mode} loop, {load}")
    rate_ax.plot(t, [r.ok for r in rows], label="ok/s")
    rate_ax.plot(t, [r.errors for r in rows], label="errors/s", color="red")
    rate_ax.set_xlabel("seconds since the measured window began")
    rate_ax.set_ylabel("requests/s")
    rate_ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
