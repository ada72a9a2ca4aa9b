"""Latency against load for fleet sizes around a plan's answer, one PNG per profile.

matplotlib is optional (the ``plot`` extra) and imported only here, with the headless Agg backend.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from fleetserve.bench.plot import PlotUnavailable
from fleetserve.sim.planner import Planner, ProfilePlan
from fleetserve.sim.simulator import simulate

LOADS = (0.3, 0.5, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2)


def fleet_sizes(replicas: int) -> list[int]:
    return sorted({max(1, replicas - 1), replicas, replicas + 1, max(replicas + 2, round(replicas * 1.25))})


def latency_curves(planner: Planner, plan: ProfilePlan, requests: int,
                   progress: Callable[[str], None] = lambda _: None) -> dict[int, list[tuple[float, float, float]]]:
    """{fleet size: [(offered req/s, p50 s, p99 s) per load]} with the plan's best policy."""
    assert plan.best is not None
    qps = planner.config.qps
    curves: dict[int, list[tuple[float, float, float]]] = {}
    for n in fleet_sizes(plan.best.replicas):
        points = []
        for share in LOADS:
            result = simulate(planner.sim_config(plan.profile, n, plan.best.policy, qps=share * qps, requests=requests))
            points.append((share * qps, result.p("p50"), result.p("p99")))
            progress(f"plot {plan.profile.name}: {n} replicas at {share * qps:.0f} req/s: p99 "
                     f"{result.p('p99') * 1e3:.2f} ms")
        curves[n] = points
    return curves


def plot_curves(plan: ProfilePlan, curves: dict[int, list[tuple[float, float, float]]], slo_s: float,
                directory: Path) -> Path:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise PlotUnavailable("plotting needs matplotlib: pip install 'fleetserve[plot]' (or matplotlib)") from exc
    assert plan.best is not None
    fig, ax = plt.subplots(figsize=(9, 5.5))
    for n, points in curves.items():
        line = ax.plot([p[0] for p in points], [p[2] * 1e3 for p in points], marker="o", label=f"{n} replicas p99")
        ax.plot([p[0] for p in points], [p[1] * 1e3 for p in points], linestyle=":", color=line[0].get_color(),
                label=f"{n} replicas p50")
    ax.axhline(slo_s * 1e3, color="red", linestyle="--", label="SLO p99")
    ax.set_yscale("log")
    ax.set_xlabel("offered load (requests/s)")
    ax.set_ylabel("latency (ms)")
    derived = " (derived profile)" if plan.profile.derived_from else ""
    ax.set_title(f"{plan.profile.name}{derived}: latency vs load, {plan.best.policy}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="small", ncol=2)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"plan-{re.sub(r'[^A-Za-z0-9]+', '-', plan.profile.name).strip('-').lower()}.png"
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
