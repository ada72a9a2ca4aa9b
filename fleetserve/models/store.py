"""The model store: exported models under ``$FLEETSERVE_HOME/models/<name>/`` (default ``~/.cache/fleetserve``).

Each entry holds ``model.onnx``, ``tokenizer.json`` (when the model takes text) and ``model.json`` (metadata).
Exports are written to a temporary directory and renamed into place, so a crash mid-export never leaves a
half-written model that serving would pick up.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from fleetserve.errors import ModelNotFound
from fleetserve.models.zoo import get_zoo_model


def publish(tmp: Path, final: Path) -> None:
    """Atomically move a finished directory into place. If another process published the same content
    first (two replicas exporting at once), keep theirs: replacing it would pull files from under a reader."""
    try:
        os.rename(tmp, final)
    except OSError:
        if not final.is_dir():
            raise


def fleetserve_home() -> Path:
    return Path(os.environ.get("FLEETSERVE_HOME") or Path.home() / ".cache" / "fleetserve")


@dataclass(frozen=True)
class ModelMeta:
    name: str
    hidden_size: int
    max_seq: int
    # Output holding the pooled sentence embedding, if the model has one.
    embedding_output: str | None = "sentence_embedding"

    def write(self, directory: Path) -> None:
        (directory / "model.json").write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def read(cls, directory: Path) -> ModelMeta:
        return cls(**json.loads((directory / "model.json").read_text()))


@dataclass(frozen=True)
class StoredModel:
    name: str
    directory: Path
    onnx_path: Path
    tokenizer_path: Path | None
    meta: ModelMeta | None


def shared_mode() -> int:
    """0777 less the process umask: what ``mkdir`` would have given a folder published into a shared home."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o777 & ~umask


class ModelStore:
    def __init__(self, home: Path | None = None) -> None:
        self.home = home or fleetserve_home()
        self.models_dir = self.home / "models"

    def resolve(self, model: str, *, export: bool = True) -> StoredModel:
        """A zoo name (exported on first use) or a path to an ONNX file (with optional sibling tokenizer.json)."""
        path = Path(model)
        if model.endswith(".onnx") or path.is_file():
            if not path.is_file():
                raise ModelNotFound(f"ONNX file not found: {model}")
            tok = path.parent / "tokenizer.json"
            meta = ModelMeta.read(path.parent) if (path.parent / "model.json").is_file() else None
            # An exported model directory (model.onnx + model.json, e.g. baked into an image) keeps its name.
            name = meta.name if meta is not None else path.stem
            return StoredModel(name, path.parent, path, tok if tok.is_file() else None, meta)
        zoo = get_zoo_model(model)
        directory = self.models_dir / zoo.name
        if not (directory / "model.onnx").is_file():
            if not export:
                raise ModelNotFound(f"model {model!r} is not exported yet; run `fleetserve build {model}`")
            self._materialize(zoo.name)
        return StoredModel(
            zoo.name, directory, directory / "model.onnx", directory / "tokenizer.json", ModelMeta.read(directory)
        )

    def _materialize(self, name: str) -> None:
        zoo = get_zoo_model(name)
        self.models_dir.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=self.models_dir))
        tmp.chmod(shared_mode())  # mkdtemp's 0700 would hide the model from other users of a shared home
        try:
            zoo.materializer()(tmp)
            ModelMeta(zoo.name, zoo.hidden_size, zoo.max_seq).write(tmp)
            publish(tmp, self.models_dir / name)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
