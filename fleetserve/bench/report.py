"""A load run's report: totals, errors by kind, latency percentiles and a per-second time series.

Latency statistics cover successful (2xx) responses, in seconds; failures are counted by kind and
never enter the latency samples, where a fast error would flatter the tail. In open-loop mode each
latency runs from the request's *scheduled* send time; ``service_latency_s`` runs from the moment
the generator actually sent it, so the two differ by the generator's own lag (timer resolution,
CPU starvation). Only the first is free of coordinated omission; a large gap between them means
the generator, not the server, fell behind. A time series row ``t`` covers completions in
``[t, t + 1)`` seconds after the measured window began (``sent`` counts scheduled sends in it), and
may run past the window while the last requests drain. Missing values (no samples) are NaN in
Python and ``null`` in JSON.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import numpy as np

from fleetserve.bench.recorder import RawResult

QUANTILES: tuple[tuple[str, float], ...] = (("p50", 50.0), ("p90", 90.0), ("p99", 99.0), ("p99.9", 99.9))
# The generator is probably the bottleneck past these: its numbers then understate the server.
SATURATED_CPU = 0.9
LATE_MEAN_S = 0.005
NAN = float("nan")


def _nan_to_none(x: float) -> float | None:
    return None if math.isnan(x) else x


def _none_to_nan(x: float | None) -> float:
    return NAN if x is None else float(x)


@dataclass(frozen=True)
class SecondStats:
    t: int
    sent: int
    ok: int
    errors: int
    p50_s: float
    p99_s: float

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["p50_s"], d["p99_s"] = _nan_to_none(self.p50_s), _nan_to_none(self.p99_s)
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> SecondStats:
        return cls(
            t=int(d["t"]),
            sent=int(d["sent"]),
            ok=int(d["ok"]),
            errors=int(d["errors"]),
            p50_s=_none_to_nan(d["p50_s"]),
            p99_s=_none_to_nan(d["p99_s"]),
        )


@dataclass(frozen=True)
class LoadReport:
    mode: str
    config: Mapping[str, Any]
    duration_s: float
    elapsed_s: float
    requests: int
    sent: int
    ok: int
    errors_by_type: Mapping[str, int]
    target_rps: float | None
    achieved_rps: float
    latency_s: Mapping[str, float]
    service_latency_s: Mapping[str, float]
    timeseries: tuple[SecondStats, ...]
    samples_kept: int
    schedule_lag_mean_s: float
    schedule_lag_max_s: float
    generator_cpu_s: float
    processes: int = 1
    samples: np.ndarray | None = field(default=None, compare=False, repr=False)

    @property
    def errors(self) -> int:
        return sum(self.errors_by_type.values())

    def percentile(self, q: float) -> float:
        """Latency percentile ``q`` (in percent, 0–100) of ok responses, in seconds; NaN without samples.

        Any ``q`` works while the samples are in memory; a report read back from JSON knows p50, p90,
        p99 and p99.9 only."""
        if not 0.0 <= q <= 100.0:
            raise ValueError(f"percentile takes q in percent (0-100), got {q}")
        if self.samples is not None:
            return float(np.percentile(self.samples, q)) if len(self.samples) else NAN
        for name, known in QUANTILES:
            if known == q:
                return self.latency_s[name]
        raise ValueError(f"report has no samples (loaded from JSON); only {[q for _, q in QUANTILES]} known")

    @property
    def generator_saturated(self) -> bool:
        busy = self.generator_cpu_s / (self.elapsed_s * self.processes) if self.elapsed_s > 0 else 0.0
        return busy >= SATURATED_CPU or self.schedule_lag_mean_s >= LATE_MEAN_S

    def to_json(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("samples", "timeseries")}
        d["config"] = dict(self.config)
        d["errors_by_type"] = dict(self.errors_by_type)
        d["latency_s"] = {k: _nan_to_none(v) for k, v in self.latency_s.items()}
        d["service_latency_s"] = {k: _nan_to_none(v) for k, v in self.service_latency_s.items()}
        d["errors"] = self.errors
        d["timeseries"] = [row.to_json() for row in self.timeseries]
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> LoadReport:
        return cls(
            mode=d["mode"],
            config=dict(d["config"]),
            duration_s=float(d["duration_s"]),
            elapsed_s=float(d["elapsed_s"]),
            requests=int(d["requests"]),
            sent=int(d["sent"]),
            ok=int(d["ok"]),
            errors_by_type={str(k): int(v) for k, v in d["errors_by_type"].items()},
            target_rps=None if d["target_rps"] is None else float(d["target_rps"]),
            achieved_rps=float(d["achieved_rps"]),
            latency_s={k: _none_to_nan(v) for k, v in d["latency_s"].items()},
            service_latency_s={k: _none_to_nan(v) for k, v in d["service_latency_s"].items()},
            timeseries=tuple(SecondStats.from_json(row) for row in d["timeseries"]),
            samples_kept=int(d["samples_kept"]),
            schedule_lag_mean_s=float(d["schedule_lag_mean_s"]),
            schedule_lag_max_s=float(d["schedule_lag_max_s"]),
            generator_cpu_s=float(d["generator_cpu_s"]),
            processes=int(d["processes"]),
        )

    def summary_table(self, *, per_second: bool = False) -> str:
        c = self.config
        load = (
            f"open loop, {c.get('arrivals')} arrivals at {self.target_rps:g} req/s"
            if self.mode == "open"
            else f"closed loop, {c.get('concurrency')} concurrent"
        )
        errors = ", ".join(f"{k} {v}" for k, v in sorted(self.errors_by_type.items())) or "none"
        lat = self.latency_s
        names = [*(n for n, _ in QUANTILES), "max", "mean"]
        lines = [
            f"fleetserve bench {c.get('url')}  workload {c.get('workload')}  {load}",
            f"measured {self.duration_s:.2f} s (warmup {c.get('warmup_s', 0)} s excluded)",
            f"requests {self.requests}  sent {self.sent}  ok {self.ok}  errors {self.errors} ({errors})",
            f"throughput {self.achieved_rps:.1f} ok req/s",
            "latency ms " + "".join(f"{n:>10}" for n in names),
            "           " + "".join(f"{lat[n] * 1e3:>10.2f}" for n in names),
            "  from send" + "".join(f"{self.service_latency_s[n] * 1e3:>10.2f}" for n in names),
            f"generator: {self.processes} process(es), cpu {self.generator_cpu_s:.1f} s over "
            f"{self.elapsed_s:.1f} s, schedule lag mean {self.schedule_lag_mean_s * 1e3:.2f} ms "
            f"max {self.schedule_lag_max_s * 1e3:.2f} ms, {self.samples_kept} latency samples kept",
        ]
        if self.generator_saturated:
            lines.append("WARNING: the generator was saturated; the server may be faster than measured")
        if per_second:
            lines.append(f"{'t':>5}{'sent':>8}{'ok':>8}{'errors':>8}{'p50 ms':>10}{'p99 ms':>10}")
            lines += [
                f"{r.t:>5}{r.sent:>8}{r.ok:>8}{r.errors:>8}{r.p50_s * 1e3:>10.2f}{r.p99_s * 1e3:>10.2f}"
                for r in self.timeseries
            ]
        return "\n".join(lines)


def _latency_stats(samples: np.ndarray) -> dict[str, float]:
    if not len(samples):
        return {**{name: NAN for name, _ in QUANTILES}, "max": NAN, "mean": NAN}
    values = np.percentile(samples, [q for _, q in QUANTILES])
    stats = {name: float(v) for (name, _), v in zip(QUANTILES, values, strict=True)}
    stats["max"] = float(samples.max())
    stats["mean"] = float(samples.mean())
    return stats


def _timeseries(raw: RawResult) -> tuple[SecondStats, ...]:
    seconds = np.floor(raw.done_s).astype(np.int64)
    order = np.argsort(seconds, kind="stable")
    keys, starts = np.unique(seconds[order], return_index=True)
    groups: dict[int, np.ndarray] = {}
    if len(keys):
        groups = dict(zip(keys.tolist(), np.split(raw.latency_s[order], starts[1:]), strict=True))
    last = max([-1, *raw.sent_per_s, *raw.ok_per_s, *raw.errors_per_s, *groups])
    rows = []
    for t in range(last + 1):
        group = groups.get(t)
        p50, p99 = np.percentile(group, [50.0, 99.0]) if group is not None and len(group) else (NAN, NAN)
        rows.append(
            SecondStats(
                t=t,
                sent=raw.sent_per_s.get(t, 0),
                ok=raw.ok_per_s.get(t, 0),
                errors=raw.errors_per_s.get(t, 0),
                p50_s=float(p50),
                p99_s=float(p99),
            )
        )
    return tuple(rows)


def build_report(
    raw: RawResult,
    *,
    mode: str,
    config: Mapping[str, Any],
    target_rps: float | None,
    elapsed_s: float,
    processes: int = 1,
) -> LoadReport:
    return LoadReport(
        mode=mode,
        config=dict(config),
        duration_s=raw.duration_s,
        elapsed_s=elapsed_s,
        requests=raw.requests,
        sent=raw.sent,
        ok=raw.ok,
        errors_by_type=dict(sorted(raw.errors.items())),
        target_rps=target_rps,
        achieved_rps=raw.ok / raw.duration_s if raw.duration_s > 0 else 0.0,
        latency_s=_latency_stats(raw.latency_s),
        service_latency_s=_latency_stats(raw.service_s),
        timeseries=_timeseries(raw),
        samples_kept=len(raw.latency_s),
        schedule_lag_mean_s=raw.lag_sum_s / raw.lag_count if raw.lag_count else 0.0,
        schedule_lag_max_s=raw.lag_max_s,
        generator_cpu_s=raw.cpu_s,
        processes=processes,
        samples=raw.latency_s,
    )
