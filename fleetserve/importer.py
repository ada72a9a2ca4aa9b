"""Import strings and the registries built on them: a short name users type -> ``"package.module:attribute"``.

Every extension point (commands, engine backends, balancing policies, load-generator clients, zoo models'
exporters) is a table of import strings resolved only when chosen, so ``fleetserve gateway`` never imports
ONNX Runtime and a CPU machine never imports torch. Modelled on uvicorn's ``importer.py``: one helper, one
error for a malformed string, and ``ImportError`` left to the caller so an ``auto`` chooser can fall back.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from typing import Any, Generic, TypeVar, cast

T = TypeVar("T")


def import_from_string(target: str) -> Any:
    """The object ``"module:attribute"`` names, or the module itself for ``"module"``.

    ``ImportError`` propagates (a missing optional dependency); a malformed string or a missing attribute is
    a ``ValueError``.
    """
    module_name, sep, attribute = target.partition(":")
    if not module_name or (sep and not attribute):
        raise ValueError(f"import string must be 'module' or 'module:attribute', got {target!r}")
    module = importlib.import_module(module_name)
    if not sep:
        return module
    found: Any = module
    for part in attribute.split("."):
        try:
            found = getattr(found, part)
        except AttributeError:
            raise ValueError(f"{target!r}: module {module_name!r} has no attribute {attribute!r}") from None
    return found


class Registry(Generic[T]):
    """Names -> import strings for one kind of extension; :meth:`load` imports the chosen one."""

    def __init__(self, kind: str, entries: Mapping[str, str]) -> None:
        self.kind = kind
        self._entries = dict(entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def names(self) -> list[str]:
        return list(self._entries)

    def target(self, name: str) -> str:
        """The import string registered as ``name`` (ValueError listing the choices)."""
        try:
            return self._entries[name]
        except KeyError:
            raise ValueError(f"unknown {self.kind} {name!r}; choose one of {', '.join(self._entries)}") from None

    def load(self, name: str) -> T:
        """Import what ``name`` names; ``ImportError`` propagates for a missing optional dependency."""
        return cast(T, import_from_string(self.target(name)))
