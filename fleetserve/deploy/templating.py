"""Fill the package's template files and write rendered trees to disk.

Placeholders are ``@{name}``: NGINX variables (``$upstream_addr``), HAProxy log formats (``%Tr``) and
Prometheus alert templates (``{{ $value }}``) all appear verbatim in templates, so neither ``$`` nor
``%`` nor ``{{`` could serve as the delimiter without escaping half the file.
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from importlib import resources
from pathlib import Path

_PACKAGE = "fleetserve.deploy"


class AtTemplate(string.Template):
    """``string.Template`` with ``@`` as the delimiter."""

    delimiter = "@"


def template_text(name: str) -> str:
    """The raw text of ``templates/<name>`` (``name`` uses ``/`` separators)."""
    node = resources.files(_PACKAGE).joinpath("templates")
    for part in name.split("/"):
        node = node.joinpath(part)
    return node.read_text(encoding="utf-8")


def render(name: str, values: Mapping[str, object]) -> str:
    """``templates/<name>`` with every ``@{key}`` replaced; a placeholder without a value raises KeyError."""
    return AtTemplate(template_text(name)).substitute({k: str(v) for k, v in values.items()})


def write_tree(root: Path, files: Mapping[str, str]) -> list[Path]:
    """Write ``files`` (relative path -> text) under ``root``, creating folders; returns the paths written."""
    written = []
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written
