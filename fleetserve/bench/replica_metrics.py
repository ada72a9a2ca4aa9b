"""What a replica's own ``/metrics`` says about its batcher and engine, as totals read between two scrapes.

``fleetserve profile``'s cost phase (:mod:`fleetserve.sim.costs`) takes the mean queue wait and engine-call
time per request at low load from the ``fleetserve_request_duration_seconds{stage}`` histogram; the scenario
harness (:mod:`fleetserve.bench.scenarios`) also takes rows and padded length per engine call from
``fleetserve_batch_size`` and ``fleetserve_batch_sequence_length``, to put beside the simulator's.
"""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from fleetserve.errors import FleetserveError

STAGE_HISTOGRAM = "fleetserve_request_duration_seconds"
# The figures :func:`batch_events` gives, in the order a report shows them.
BATCH_EVENTS = ("replica_mean_batch", "replica_mean_padded_len", "replica_compute_ms", "replica_queue_ms",
                "replica0_row_share")


def fetch(url: str, timeout_s: float = 10.0) -> str:
    """The text exposition of ``url``'s ``/metrics``."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=timeout_s) as response:
        return str(response.read().decode())


def stage_sums(metrics_text: str) -> dict[str, tuple[float, float]]:
    """(sum, count) of ``fleetserve_request_duration_seconds`` per stage in a replica's /metrics text."""
    out: dict[str, tuple[float, float]] = {}
    for family in text_string_to_metric_families(metrics_text):
        if family.name != STAGE_HISTOGRAM:
            continue
        for sample in family.samples:
            stage = sample.labels.get("stage", "")
            total, count = out.get(stage, (0.0, 0.0))
            if sample.name.endswith("_sum"):
                out[stage] = (total + sample.value, count)
            elif sample.name.endswith("_count"):
                out[stage] = (total, count + sample.value)
    return out


def stage_mean(before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]], stage: str) -> float:
    (s0, c0), (s1, c1) = before.get(stage, (0.0, 0.0)), after.get(stage, (0.0, 0.0))
    if c1 <= c0:
        raise FleetserveError(f"the replica recorded no '{stage}' time while measuring wall times")
    return (s1 - s0) / (c1 - c0)


def engine_counters(metrics_text: str) -> dict[str, float]:
    """Rows and engine calls, their padded lengths, and the seconds requests spent in the batcher's queue and
    in engine calls (with how many requests), as totals since the replica started."""
    batch = {"fleetserve_batch_size_sum": "rows", "fleetserve_batch_size_count": "batches",
             "fleetserve_batch_sequence_length_sum": "padded"}
    out = dict.fromkeys(batch.values(), 0.0)
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name in batch:
                out[batch[sample.name]] += sample.value
    stages = stage_sums(metrics_text)
    queue, compute = stages.get("queue", (0.0, 0.0)), stages.get("compute", (0.0, 0.0))
    return {**out, "queue_s": queue[0], "compute_s": compute[0], "requests": compute[1]}


def batch_events(before: list[dict[str, float]], after: list[dict[str, float]]) -> dict[str, float]:
    """What the replicas' engines did between two :func:`engine_counters` snapshots of each: mean rows and padded
    length per engine call, mean seconds per request in the queue and in its engine call, replica 0's share of
    the rows."""
    delta = [{k: a.get(k, 0.0) - b.get(k, 0.0) for k in a} for b, a in zip(before, after, strict=True)]
    total = {k: sum(d.get(k, 0.0) for d in delta) for k in ("rows", "batches", "padded", "compute_s", "queue_s",
                                                              "requests")}
    if total["batches"] <= 0 or total["requests"] <= 0:
        return {}
    figures = (total["rows"] / total["batches"], total["padded"] / total["batches"],
               total["compute_s"] / total["requests"] * 1e3, total["queue_s"] / total["requests"] * 1e3,
               delta[0].get("rows", 0.0) / total["rows"] if total["rows"] else 0.0)
    return dict(zip(BATCH_EVENTS, figures, strict=True))
