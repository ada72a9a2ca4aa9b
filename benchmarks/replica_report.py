"""Markdown tables and goal ratios for ``benchmarks/replica.py``, computed from one run's points.

Goals (issue 3), judged for (a), the default; (a-promote) gets the same comparisons without a verdict.
(a) at least 1.5x the throughput of (d) at equal or lower p99, judged at closed-loop
concurrency 32 and 64 where both batchers are busy; (a) at least 4x (b) and 1.5x (b') on the length
mix, judged on each setup's best closed-loop throughput; (a) at least 2x (c) at concurrency 32.
"""

from __future__ import annotations

import math
from typing import Any

from _common import markdown_table

ORDER = ("a", "a-promote", "b", "b'", "c", "d")
COLUMNS = ["req/s", "p50 ms", "p99 ms", "errors", "mean batch", "mean padded seq", "server CPU", "generator CPU",
           "others CPU"]


def label(setup: str) -> str:
    return "(" + setup.replace("'", "′") + ")"


def fmt(value: float | None, digits: int = 1) -> str:
    return "–" if value is None or math.isnan(value) else f"{value:.{digits}f}"


def _markdown(headers: list[str], rows: list[list[str]]) -> str:
    """Text in the first column, numbers (right-aligned) in the others."""
    return markdown_table(headers, rows, ["---"] + ["---:"] * (len(headers) - 1))


def _rows(points: list[dict[str, Any]], load: str) -> list[list[str]]:
    rows = []
    for p in sorted(points, key=lambda p: (p[load], ORDER.index(p["setup"]))):
        cpu = p["cpu_cores"]
        rows.append([
            label(p["setup"]), fmt(p[load], 0), fmt(p["throughput_rps"]), fmt(p["p50_ms"]), fmt(p["p99_ms"]),
            str(sum(p["errors"].values())), fmt(p["mean_batch"]), fmt(p["mean_padded_seq"], 0),
            fmt(cpu["server"], 2), fmt(cpu["generator"], 2), fmt(cpu["others"], 2),
        ])
    return rows


def ratios(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Goal ratios for (a); the same comparisons for (a-promote) are shown without a verdict."""
    closed = {(p["setup"], p["concurrency"]): p for p in points if p["concurrency"]}

    def peak(setup: str) -> float | None:
        values = [p["throughput_rps"] for (s, _), p in closed.items() if s == setup]
        return max(values) if values else None

    out: list[dict[str, Any]] = []
    for base in ("a", "a-promote"):
        judge = base == "a"
        for c in sorted({c for _, c in closed}):
            a, d = closed.get((base, c)), closed.get(("d", c))
            if a and d and d["throughput_rps"]:
                r = a["throughput_rps"] / d["throughput_rps"]
                out.append({
                    "name": f"{label(base)}/(d) throughput at concurrency {c}; p99 {fmt(a['p99_ms'])} vs "
                            f"{fmt(d['p99_ms'])} ms",
                    "value": r, "goal": "≥ 1.5× at ≤ p99" if judge and c >= 32 else "–",
                    "met": (r >= 1.5 and a["p99_ms"] <= d["p99_ms"]) if judge and c >= 32 else None,
                })
        for other, goal in (("b", 4.0), ("b'", 1.5), ("d", 1.5), ("c", None)):
            pa, po = peak(base), peak(other)
            if pa and po:
                out.append({"name": f"{label(base)}/{label(other)} best closed-loop throughput", "value": pa / po,
                            "goal": f"≥ {goal}×" if goal and judge else "–",
                            "met": pa / po >= goal if goal and judge else None})
        a32, c32 = closed.get((base, 32)), closed.get(("c", 32))
        if a32 and c32 and c32["throughput_rps"]:
            r = a32["throughput_rps"] / c32["throughput_rps"]
            out.append({"name": f"{label(base)}/(c) throughput at concurrency 32", "value": r,
                        "goal": "≥ 2×" if judge else "–", "met": r >= 2.0 if judge else None})
    return out


def tables(points: list[dict[str, Any]], found: list[dict[str, Any]]) -> str:
    met = {True: "yes", False: "**no**", None: "–"}
    return "\n\n".join([
        "### Closed loop (CPU in cores, of 2)",
        _markdown(["setup", "concurrency", *COLUMNS], _rows([p for p in points if p["concurrency"]], "concurrency")),
        "### Open loop, Poisson arrivals (same rates for every setup)",
        _markdown(["setup", "target req/s", *COLUMNS], _rows([p for p in points if p["rate"]], "rate")),
        "### Ratios measured in this run",
        _markdown(["comparison", "measured", "goal", "met"],
                 [[r["name"], f"{r['value']:.2f}×", r["goal"], met[r["met"]]] for r in found]),
    ])


def progress(setup: str, p: dict[str, Any]) -> str:
    load = f"c={p['concurrency']}" if p["concurrency"] else f"rate={p['rate']:g}"
    cpu = p["cpu_cores"]
    return (f"   {label(setup)} {load}: {p['throughput_rps']:.1f} req/s p50 {fmt(p['p50_ms'])} ms "
            f"p99 {fmt(p['p99_ms'])} ms errors {sum(p['errors'].values())} batch {fmt(p['mean_batch'])} "
            f"cpu server/gen/others {cpu['server']:.2f}/{cpu['generator']:.2f}/{cpu['others']:.2f} "
            f"(others per attempt {p['attempts_others_cores']})")
