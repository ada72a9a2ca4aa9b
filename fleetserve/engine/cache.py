"""Content-addressed engine cache under ``$FLEETSERVE_HOME/engines/<key>/``.

The key hashes everything that determines the artifact: model bytes, backend name and version, precision,
device, shape profile and build options. Entries are built in a temporary directory and published with an
atomic rename, with a ``manifest.json`` of per-file SHA-256 checksums; ``get`` verifies every file, and a
corrupt or truncated entry is removed and reported (the caller rebuilds it) instead of being served.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from fleetserve.models.store import publish, shared_mode

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
_CHUNK = 1 << 20


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def cache_key(model_digest: str, fields: Mapping[str, str]) -> str:
    h = hashlib.sha256(model_digest.encode())
    for k in sorted(fields):
        h.update(f"\0{k}={fields[k]}".encode())
    return h.hexdigest()[:32]


@dataclass(frozen=True)
class CacheEntry:
    key: str
    directory: Path
    meta: dict[str, object]

    @property
    def size_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.directory.rglob("*") if p.is_file())


class CorruptEntry(Exception):
    pass


class EngineCache:
    def __init__(self, root: Path) -> None:
        self.root = root

    def _dir(self, key: str) -> Path:
        return self.root / key

    def get(self, key: str) -> CacheEntry | None:
        """The verified entry, or None when absent; a corrupt entry is removed with a warning."""
        directory = self._dir(key)
        if not directory.is_dir():
            return None
        try:
            return self._verify(key, directory)
        except CorruptEntry as exc:
            log.warning("engine cache entry %s is corrupt (%s); removing it so it is rebuilt", key, exc)
            shutil.rmtree(directory, ignore_errors=True)
            return None

    def _verify(self, key: str, directory: Path) -> CacheEntry:
        try:
            manifest = json.loads((directory / MANIFEST).read_text())
            files: dict[str, str] = manifest["files"]
        except (OSError, ValueError, KeyError) as exc:
            raise CorruptEntry(f"unreadable manifest: {exc}") from None
        for rel, digest in files.items():
            path = directory / rel
            if not path.is_file():
                raise CorruptEntry(f"missing file {rel}")
            if file_digest(path) != digest:
                raise CorruptEntry(f"checksum mismatch in {rel}")
        return CacheEntry(key, directory, manifest.get("meta", {}))

    def put(self, key: str, build: Callable[[Path], Mapping[str, object]]) -> CacheEntry:
        """Run ``build(tmpdir) -> meta`` and publish its output atomically under ``key``."""
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=self.root))
        tmp.chmod(shared_mode())  # readable by replicas running as another user (an init container builds it)
        try:
            meta = dict(build(tmp))
            files = {
                str(p.relative_to(tmp)): file_digest(p) for p in sorted(tmp.rglob("*")) if p.is_file()
            }
            meta.setdefault("created", time.time())
            (tmp / MANIFEST).write_text(json.dumps({"key": key, "files": files, "meta": meta}, indent=2))
            final = self._dir(key)
            publish(tmp, final)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        return CacheEntry(key, final, meta)

    def entries(self) -> list[CacheEntry]:
        if not self.root.is_dir():
            return []
        out = []
        for d in sorted(self.root.iterdir()):
            if d.is_dir() and not d.name.startswith("."):
                try:
                    meta = json.loads((d / MANIFEST).read_text()).get("meta", {})
                except (OSError, ValueError):
                    meta = {"corrupt": True}
                out.append(CacheEntry(d.name, d, meta))
        return out

    def remove(self, key_prefix: str) -> list[str]:
        removed = []
        for entry in self.entries():
            if entry.key.startswith(key_prefix):
                shutil.rmtree(entry.directory)
                removed.append(entry.key)
        return removed
