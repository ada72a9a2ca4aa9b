"""Proxy weights per GPU model from measured throughput (``fleetserve deploy nginx --weights-from FILE``).

The article fronts a mixed fleet with NGINX's weighted round robin, "initial weights by GPU model". Here a
weight is the throughput one replica of that model measured, never a guess: the file names, per GPU model,
either sequences per second or a ``fleetserve bench --out`` report of a saturating run against one replica
of that model (throughput = ok requests per second × rows per request), and lists each backend's model::

    {"gpu_models": {"H200": "bench-h200.json", "L4": 2950.0},
     "backends": {"http://10.0.0.5:8000": "H200", "http://10.0.0.6:8000": "L4"}}

Report paths are relative to the file. The proxies then scale the ratios to small integers
(:func:`fleetserve.deploy.proxy.integer_weights`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from fleetserve.deploy.proxy import Backend
from fleetserve.errors import UsageError


def _read_json(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UsageError(f"cannot read {what} {path}: {exc.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"{what} {path} is not JSON: {exc}") from None


def report_throughput(path: Path) -> float:
    """Sequences per second of a ``fleetserve bench --out`` report: ok req/s × rows per request."""
    report = _read_json(path, "bench report")
    try:
        rps = float(report["achieved_rps"])
        rows = int(report.get("config", {}).get("rows", 1) or 1)
    except (KeyError, TypeError, ValueError, AttributeError):
        raise UsageError(f"{path} is not a `fleetserve bench --out` report (no achieved_rps)") from None
    if report.get("ok", 1) == 0:
        raise UsageError(f"bench report {path} has no successful request; measure again")
    return rps * rows


def _throughput(model: str, value: object, base: Path) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise UsageError(f"gpu model {model!r}: give sequences per second or a bench report path, got {value!r}")
    measured = report_throughput(base / value) if isinstance(value, str) else float(value)
    if not (math.isfinite(measured) and measured > 0):
        raise UsageError(f"gpu model {model!r}: measured throughput must be positive, got {measured}")
    return measured


def weighted_backends(path: Path) -> tuple[Backend, ...]:
    """The backends of a weights file, each weighted by its GPU model's measured throughput."""
    data = _read_json(path, "weights file")
    if not isinstance(data, dict) or not isinstance(data.get("gpu_models"), dict) \
            or not isinstance(data.get("backends"), dict) or not data["backends"]:
        raise UsageError(f"weights file {path} needs objects 'gpu_models' (model -> seq/s or bench report) "
                         "and 'backends' (URL -> model)")
    throughput = {m: _throughput(m, v, path.parent) for m, v in data["gpu_models"].items()}
    backends = []
    for url, model in data["backends"].items():
        if model not in throughput:
            raise UsageError(f"weights file {path}: backend {url} runs {model!r}, which has no measured throughput "
                             f"(gpu_models: {', '.join(sorted(throughput)) or 'none'})")
        try:
            backends.append(Backend.from_url(url, throughput[model]))
        except ValueError as exc:
            raise UsageError(f"weights file {path}: {exc}") from None
    return tuple(backends)
