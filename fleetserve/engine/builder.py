"""Build-or-load: model name -> stored ONNX -> cache key -> (cache hit | build + accuracy gate + publish) -> Engine.

The accuracy gate runs every reduced-precision build against the FP32 ONNX graph on held-out texts and
refuses to publish an engine whose mean cosine similarity is under the threshold, so a bad quantization is
never cached and never served.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort
from tqdm import tqdm

from fleetserve.engine.accuracy import cosine_report
from fleetserve.engine.base import Backend, BuildReport, BuildSpec, Engine, EngineError, Precision, ShapeProfile
from fleetserve.engine.cache import CacheEntry, EngineCache, cache_key, file_digest
from fleetserve.engine.calibration import calibration_texts, held_out_texts
from fleetserve.engine.config import EngineConfig
from fleetserve.engine.registry import get_backend
from fleetserve.models.store import ModelStore, StoredModel, fleetserve_home
from fleetserve.models.tokenizer import TextTokenizer

REPORT = "report.json"


@dataclass(frozen=True)
class BuiltEngine:
    key: str
    entry: CacheEntry
    report: dict[str, object]
    cache_hit: bool
    model: StoredModel
    backend: Backend
    profile: ShapeProfile

    def load(self, threads: int = 0) -> Engine:
        return self.backend.load(self.entry.directory, self.profile, threads=threads)


def engine_cache(config: EngineConfig) -> EngineCache:
    return EngineCache((config.home or fleetserve_home()) / "engines")


def _sample_batches(model: StoredModel, profile: ShapeProfile, batch: int = 16) -> list[dict[str, np.ndarray]]:
    """Held-out inputs: tokenized held-out texts, or seeded random token ids for a model without a tokenizer."""
    texts = held_out_texts()
    if model.tokenizer_path is not None:
        tok = TextTokenizer(model.tokenizer_path, profile.max_seq)
        return [tok.encode(texts[i : i + batch]).as_inputs() for i in range(0, len(texts), batch)]
    rng = np.random.default_rng(0)
    out = []
    for _ in range(4):
        ids = rng.integers(1, 1000, size=(batch, 32), dtype=np.int64)
        out.append({"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)})
    return out


def _runner(session_or_engine: ort.InferenceSession | Engine) -> Callable[[Mapping[str, np.ndarray]], dict]:
    if isinstance(session_or_engine, ort.InferenceSession):
        sess = session_or_engine
        names = [o.name for o in sess.get_outputs()]
        wanted = {i.name for i in sess.get_inputs()}
        def run(feed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
            outs = sess.run(names, {k: v for k, v in feed.items() if k in wanted})
            return dict(zip(names, outs, strict=True))

        return run
    inst = session_or_engine.instance()
    return lambda feed: inst.infer(feed)


def build(config: EngineConfig, *, quiet: bool = False, store: ModelStore | None = None) -> BuiltEngine:
    # disable=None: progress only on a terminal; logs and pipes get the result lines alone.
    with tqdm(total=4, desc="build", disable=True if quiet else None, unit="step", leave=False) as steps:
        return _build(config, steps, store or ModelStore(config.home))


def _build(config: EngineConfig, steps: tqdm, store: ModelStore) -> BuiltEngine:
    steps.set_description("export/resolve model")
    model = store.resolve(config.model)
    steps.update()
    precision = Precision(config.precision)
    backend = get_backend(config.backend, precision, config.device)
    if not backend.supports(precision, config.device):
        raise EngineError(
            f"backend {backend.name} does not support {precision} on {config.device}; "
            f"supported here: {', '.join(p for p in Precision if backend.supports(p, config.device))}"
        )
    profile = config.profile(model.meta.max_seq if model.meta else 512)
    options = dict(config.options)
    if config.int8_method:
        options["int8_method"] = config.int8_method
    calib = calibration_texts(config.calibration) if precision is not Precision.FP32 else []
    key_fields = {
        "backend": backend.name,
        "backend_version": backend.version(),
        "precision": str(precision),
        "device": config.device,
        "profile": profile.key(),
        "calibration": _text_digest(calib) if config.calibration else "default",
        **{f"opt.{k}": v for k, v in sorted(options.items())},
    }
    key = cache_key(file_digest(model.onnx_path), key_fields)
    cache = engine_cache(config)
    entry = cache.get(key)
    if entry is not None:
        return BuiltEngine(key, entry, _read_report(entry), True, model, backend, profile)

    if model.tokenizer_path is not None:
        options["tokenizer"] = str(model.tokenizer_path)
    spec = BuildSpec(model.name, model.onnx_path, precision, profile, config.device, tuple(calib), options)

    def do_build(tmp: Path) -> dict[str, object]:
        t0 = time.perf_counter()
        steps.set_description(f"build {backend.name} {precision}")
        report = backend.build(spec, tmp)
        steps.update()
        steps.set_description("accuracy vs fp32")
        _accuracy_gate(report, model, backend, tmp, profile, config)
        steps.update()
        report.build_seconds = round(time.perf_counter() - t0, 2)
        (tmp / REPORT).write_text(json.dumps(asdict(report), indent=2))
        steps.set_description("publish to cache")
        return {"model": model.name, **{k: v for k, v in key_fields.items() if not k.startswith("opt.")}}

    entry = cache.put(key, do_build)
    steps.update()
    return BuiltEngine(key, entry, _read_report(entry), False, model, backend, profile)


def _accuracy_gate(
    report: BuildReport, model: StoredModel, backend: Backend, tmp: Path, profile: ShapeProfile,
    config: EngineConfig,
) -> None:
    if report.accuracy:  # the backend measured it itself (GPU backends compare on device)
        acc = report.accuracy
    elif Precision(config.precision) is Precision.FP32:
        return
    else:
        reference = ort.InferenceSession(str(model.onnx_path), providers=["CPUExecutionProvider"])
        candidate = backend.load(tmp, profile)
        emb = model.meta.embedding_output if model.meta else None
        acc = cosine_report(_runner(reference), _runner(candidate), _sample_batches(model, profile), emb)
        candidate.close()
        report.accuracy = acc
    if acc["mean_cosine"] < config.accuracy_threshold:
        raise EngineError(
            f"{config.precision} engine is not accurate enough: mean cosine {acc['mean_cosine']:.4f} "
            f"(min {acc['min_cosine']:.4f}) < threshold {config.accuracy_threshold}; not cached"
        )


def _text_digest(texts: list[str]) -> str:
    return hashlib.sha256("\n".join(texts).encode()).hexdigest()[:16]


def _read_report(entry: CacheEntry) -> dict[str, object]:
    path = entry.directory / REPORT
    report: dict[str, object] = json.loads(path.read_text()) if path.is_file() else {}
    return report
