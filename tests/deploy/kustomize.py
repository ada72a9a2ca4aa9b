"""Render a kustomize tree with the real ``kubectl kustomize`` and index the objects it prints."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml


def docs(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d is not None]


def by_kind_name(objects: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(d["kind"], d["metadata"]["name"]): d for d in objects}


def kustomize(kubectl: str, path: Path) -> list[dict[str, Any]]:
    result = subprocess.run([kubectl, "kustomize", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return docs(result.stdout)


def with_components(root: Path, name: str, components: tuple[str, ...]) -> Path:
    """An overlay beside the rendered ones: the base plus the given components of ``root/components``."""
    overlay = root / "overlays" / name
    overlay.mkdir(parents=True)
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": ["../../base"], "components": [f"../../components/{c}" for c in components],
    }))
    return overlay
