"""How fast this machine runs now against when a profile was measured: one shape of the profile, timed again.

A shared VM's speed drifts by several percent over tens of seconds with nothing else of ours running (BENCHMARKS.md
§8.2: one engine call's 5-second medians from 0.91 to 1.10 times its profiled time within three minutes), and near
capacity a fleet's tail latency follows its speed closely, so a prediction for a run minutes after the profile
carries that drift as error. :class:`SpeedProbe` times the profile's smallest batch at its second sequence length
back to back for ``seconds`` (one instance, the profile's intra-op threads, token ids drawn the same way) and
returns the ratio of the median call to the profile's median of that shape:
:meth:`fleetserve.sim.profile.Profile.slowed` takes it. Medians, since a stray preemption moves a mean of a few
hundred calls by more than the drift being measured. Time it only while nothing else of the experiment runs: it
measures the machine, not the fleet. How much it buys is modest: in two validations its prediction was the closer
in 8 of 16 rows, since its 2-second samples move about as much as the drift they track (BENCHMARKS.md §8.2).
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from fleetserve.sim.profile import Profile

if TYPE_CHECKING:
    from fleetserve.engine.config import EngineConfig

Call = Callable[[], object]


class SpeedProbe:
    def __init__(self, profile: Profile, call: Call, *, seconds: float = 2.0,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        if seconds <= 0:
            raise ValueError(f"a speed probe needs seconds > 0, got {seconds}")
        self.reference_s = profile.service[0][self._seq_index(profile)].p50_s  # the profile's median of the shape
        self._call = call
        self._seconds = seconds
        self._clock = clock

    @staticmethod
    def _seq_index(profile: Profile) -> int:
        """The probed shape's sequence length: the second (a small call that still runs the model's full depth;
        the first is often dominated by fixed per-call cost), or the only one."""
        return min(1, len(profile.seq_lengths) - 1)

    @classmethod
    def shape(cls, profile: Profile) -> tuple[int, int]:
        """The (rows, tokens) the probe times: the profile's smallest batch at its second sequence length."""
        return profile.batch_sizes[0], profile.seq_lengths[cls._seq_index(profile)]

    @classmethod
    def for_engine(cls, profile: Profile, config: EngineConfig, seconds: float = 2.0) -> SpeedProbe:
        """A probe running the engine ``fleetserve profile`` timed, as configured (from ``fleetserve build``'s
        cache)."""
        from fleetserve.engine.builder import build
        from fleetserve.sim.profiler import ProfileConfig, engine_inputs, feeds

        engine = build(config, quiet=True).load(profile.threads)
        inputs = engine_inputs(engine)
        feed = feeds(inputs, *cls.shape(profile), random.Random(ProfileConfig().seed))
        infer = engine.instance().infer
        return cls(profile, lambda: infer(feed), seconds=seconds)

    def factor(self) -> float:
        """The machine's slowness now over the profile's: > 1 when calls take longer than they did then."""
        self._call()  # untimed: the first call after a pause pays for waking the core and its caches
        samples: list[float] = []
        end = self._clock() + self._seconds
        while True:
            t0 = self._clock()
            self._call()
            t1 = self._clock()
            samples.append(t1 - t0)
            if t1 >= end:
                return statistics.median(samples) / self.reference_s
