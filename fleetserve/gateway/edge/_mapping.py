"""Typed reading of one section of a parsed YAML/JSON config, with errors that name the bad key.

Every ``from_mapping`` of the edge config reads its section through a :class:`Section`, so a typo or a
wrong type is reported as ``edge.jwt.keys[1].algorithms: ...`` instead of a ``KeyError`` or a silently
ignored setting. Unknown keys are errors for the same reason.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

T = TypeVar("T")


class Section:
    """A mapping being read; remembers its dotted path and which keys were consumed."""

    def __init__(self, data: object, path: str) -> None:
        if not isinstance(data, Mapping):
            raise ValueError(f"{path} must be a mapping, got {type(data).__name__}")
        for key in data:
            if not isinstance(key, str):
                raise ValueError(f"{path}: keys must be strings, got {key!r}")
        self._data: Mapping[str, Any] = data
        self.path = path
        self._read: set[str] = set()

    def has(self, key: str) -> bool:
        return key in self._data and self._data[key] is not None

    def _take(self, key: str) -> Any:
        self._read.add(key)
        return self._data.get(key)

    def where(self, key: str) -> str:
        return f"{self.path}.{key}"

    def number(self, key: str, default: float) -> float:
        value = self._take(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ValueError(f"{self.where(key)} must be a finite number, got {value!r}")
        return float(value)

    def integer(self, key: str, default: int) -> int:
        value = self._take(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{self.where(key)} must be an integer, got {value!r}")
        return value

    def optional_integer(self, key: str) -> int | None:
        if self.has(key):
            return self.integer(key, 0)
        self._read.add(key)
        return None

    def string(self, key: str, default: str) -> str:
        value = self._take(key)
        if value is None:
            return default
        if not isinstance(value, str):
            raise ValueError(f"{self.where(key)} must be a string, got {value!r}")
        return value

    def optional_string(self, key: str) -> str | None:
        if self.has(key):
            return self.string(key, "")
        self._read.add(key)
        return None

    def strings(self, key: str, default: tuple[str, ...]) -> tuple[str, ...]:
        """A list of strings; a single string is accepted as a one-element list."""
        value = self._take(key)
        if value is None:
            return default
        if isinstance(value, str):
            return (value,)
        if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
            raise ValueError(f"{self.where(key)} must be a list of strings, got {value!r}")
        return tuple(value)

    def string_map(self, key: str) -> tuple[tuple[str, str], ...]:
        value = self._take(key)
        if value is None:
            return ()
        if not isinstance(value, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()
        ):
            raise ValueError(f"{self.where(key)} must be a mapping of strings to strings, got {value!r}")
        return tuple(sorted(value.items()))

    def section(self, key: str) -> Section | None:
        value = self._take(key)
        return None if value is None else Section(value, self.where(key))

    def sections(self, key: str) -> list[Section]:
        value = self._take(key)
        if value is None:
            return []
        if not isinstance(value, list | tuple):
            raise ValueError(f"{self.where(key)} must be a list, got {type(value).__name__}")
        return [Section(item, f"{self.where(key)}[{i}]") for i, item in enumerate(value)]

    def build(self, factory: Callable[..., T], **kwargs: Any) -> T:
        """Reject unread keys, then construct, prefixing the constructor's ValueError with the path."""
        unknown = sorted(set(self._data) - self._read)
        if unknown:
            raise ValueError(
                f"{self.path}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(self._read))}"
            )
        try:
            return factory(**kwargs)
        except ValueError as exc:
            raise ValueError(f"{self.path}: {exc}") from exc
