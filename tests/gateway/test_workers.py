"""The gateway process's garbage-collector settings (:func:`fleetserve.gateway.workers._tune_gc`), checked in a
fresh interpreter: they are process-wide."""

from __future__ import annotations

import json
import subprocess
import sys

from fleetserve.gateway.workers import YOUNG_THRESHOLD

_PROBE = """
import gc, json
from fleetserve.gateway.workers import _tune_gc
before = gc.get_threshold()
_tune_gc()
print(json.dumps([before, gc.get_threshold(), gc.get_freeze_count()]))
"""


def test_start_up_objects_are_frozen_and_the_young_generation_waits_for_a_real_build_up() -> None:
    out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True, timeout=60)
    before, after, frozen = json.loads(out.stdout)
    assert after == [YOUNG_THRESHOLD, *before[1:]] and before[0] < YOUNG_THRESHOLD
    assert frozen > 0
