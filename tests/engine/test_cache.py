from __future__ import annotations

from pathlib import Path

import pytest

from fleetserve.engine.cache import EngineCache, cache_key


def _writer(content: bytes):
    def build(tmp: Path) -> dict[str, object]:
        (tmp / "model.onnx").write_bytes(content)
        (tmp / "sub").mkdir()
        (tmp / "sub" / "extra.bin").write_bytes(b"x" * 10)
        return {"model": "m"}

    return build


def test_key_depends_on_every_field() -> None:
    base = {"backend": "onnxruntime", "precision": "fp32", "device": "cpu"}
    k = cache_key("digest", base)
    assert k == cache_key("digest", dict(reversed(list(base.items()))))
    assert k != cache_key("digest2", base)
    for field in base:
        assert k != cache_key("digest", {**base, field: "other"})


def test_put_get_roundtrip(tmp_path: Path) -> None:
    cache = EngineCache(tmp_path)
    entry = cache.put("k1", _writer(b"abc"))
    assert (entry.directory / "model.onnx").read_bytes() == b"abc"
    got = cache.get("k1")
    assert got is not None and got.meta["model"] == "m"
    assert [e.key for e in cache.entries()] == ["k1"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "temp dirs must not linger"


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete", "manifest"])
def test_corrupt_entry_is_never_served(tmp_path: Path, damage: str) -> None:
    cache = EngineCache(tmp_path)
    entry = cache.put("k1", _writer(b"abcdef"))
    target = entry.directory / "model.onnx"
    if damage == "flip":
        target.write_bytes(b"abcdeX")
    elif damage == "truncate":
        target.write_bytes(b"abc")
    elif damage == "delete":
        target.unlink()
    else:
        (entry.directory / "manifest.json").write_text("{not json")
    assert cache.get("k1") is None
    assert not entry.directory.exists(), "corrupt entry is removed so it gets rebuilt"


def test_failed_build_leaves_nothing(tmp_path: Path) -> None:
    cache = EngineCache(tmp_path)

    def boom(tmp: Path) -> dict[str, object]:
        (tmp / "partial").write_bytes(b"half")
        raise RuntimeError("build failed")

    with pytest.raises(RuntimeError):
        cache.put("k1", boom)
    assert cache.get("k1") is None
    assert list(tmp_path.iterdir()) == []


def test_remove_by_prefix(tmp_path: Path) -> None:
    cache = EngineCache(tmp_path)
    cache.put("aa1", _writer(b"1"))
    cache.put("ab2", _writer(b"2"))
    assert cache.remove("aa") == ["aa1"]
    assert [e.key for e in cache.entries()] == ["ab2"]


def test_concurrent_publish_keeps_the_first(tmp_path: Path) -> None:
    cache = EngineCache(tmp_path)
    first = cache.put("k1", _writer(b"first"))
    second = cache.put("k1", _writer(b"second"))
    assert (second.directory / "model.onnx").read_bytes() == b"first"
    assert first.directory == second.directory
    assert cache.get("k1") is not None
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
