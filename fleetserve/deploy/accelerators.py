"""Replica settings per NVIDIA accelerator: a whole GPU and MIG slices, one kustomize overlay each.

The whole-GPU settings are the ones BENCHMARKS.md §5 measured best on an H200: the torch-cuda backend at
fp16, batches of up to 128 rows and 4 engine instances (17.4k sequences/s, 90% of the raw engine). A MIG
slice (``Ng.Mgb``: N of the GPU's 7 compute slices, M GB of memory) is a smaller GPU; its settings are the
whole GPU's scaled by its share of compute: instances in proportion (at least one) and the batch that keeps
that share as busy (a power of two, 16 to 128). The slices are exposed by NVIDIA's device plugin with the
``mixed`` MIG strategy as ``nvidia.com/mig-<profile>`` resources. The MIG numbers are derived, not measured:
no MIG-partitioned GPU was available (see deploy/README.md).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

GPU_SLICES = 7  # compute slices of an A100 / H100 / H200 in MIG mode
WHOLE_GPU_INSTANCES = 4
WHOLE_GPU_MAX_BATCH = 128
DEFAULT_MIG_PROFILES = ("1g.18gb", "3g.71gb")  # the H200's smallest slice and its half
_MIG = re.compile(r"^([1-7])g\.([0-9]{1,3})gb$")


@dataclass(frozen=True)
class Accelerator:
    """One overlay's accelerator: the extended resource a replica requests and the engine settings for it."""

    overlay: str
    resource: str
    instances: int
    max_batch: int
    title: str
    whole: bool  # NVML reports utilisation for whole GPUs only, so only those scale on it

    @property
    def settings_note(self) -> str:
        if self.whole:
            return ("Settings measured best on an H200 (BENCHMARKS.md section 5): torch-cuda fp16, "
                    f"max batch {self.max_batch}, {self.instances} instances.")
        return (f"Settings scaled from the whole GPU's by this slice's share of compute: instances "
                f"{self.instances}, max batch {self.max_batch} (derived, not measured on MIG).")


WHOLE_GPU = Accelerator("gpu", "nvidia.com/gpu", WHOLE_GPU_INSTANCES, WHOLE_GPU_MAX_BATCH,
                        "One whole NVIDIA GPU per replica", whole=True)


def mig_slice(profile: str) -> Accelerator:
    """The overlay for MIG profile ``Ng.Mgb`` (e.g. ``1g.18gb``); ValueError for another spelling."""
    match = _MIG.match(profile)
    if match is None:
        raise ValueError(f"MIG profile {profile!r} must look like 1g.18gb (compute slices g, memory gb)")
    share = int(match.group(1)) / GPU_SLICES
    instances = max(1, round(WHOLE_GPU_INSTANCES * share))
    batch = 2 ** math.ceil(math.log2(max(1.0, WHOLE_GPU_MAX_BATCH * share)))
    return Accelerator(f"mig-{profile}", f"nvidia.com/mig-{profile}", instances, min(128, max(16, batch)),
                       f"One MIG slice {profile} per replica", whole=False)
