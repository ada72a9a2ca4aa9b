"""A real tiny ONNX encoder, built with ``onnx.helper`` and run by onnxruntime behind the Engine protocol.

The model embeds tokens (word + token type), adds a masked mean over the sequence to every position
(so a wrongly padded or unmasked position would change every output), applies tanh, and mean-pools
with the mask: ``last_hidden_state [n, seq, H]`` and ``sentence_embedding [n, H]``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from fleetserve.engine.base import ShapeProfile, TensorSpec

HIDDEN = 8
VOCAB = 50
PROFILE = ShapeProfile(max_batch=8, max_seq=64, seq_buckets=(8, 16, 32, 64), batch_buckets=(1, 2, 4, 8))

Feeds = Mapping[str, np.ndarray]


def build_tiny_encoder(path: Path) -> None:
    rng = np.random.default_rng(7)
    inits = [
        numpy_helper.from_array(rng.normal(size=(VOCAB, HIDDEN)).astype(np.float32), "word_embeddings"),
        numpy_helper.from_array(rng.normal(size=(2, HIDDEN)).astype(np.float32), "type_embeddings"),
        numpy_helper.from_array(np.array([1], dtype=np.int64), "axis1"),
        numpy_helper.from_array(np.array([2], dtype=np.int64), "axis2"),
        numpy_helper.from_array(np.array(1e-6, dtype=np.float32), "eps"),
    ]
    node = helper.make_node
    nodes = [
        node("Gather", ["word_embeddings", "input_ids"], ["words"]),
        node("Gather", ["type_embeddings", "token_type_ids"], ["types"]),
        node("Add", ["words", "types"], ["h0"]),
        node("Cast", ["attention_mask"], ["mask"], to=TensorProto.FLOAT),
        node("Unsqueeze", ["mask", "axis2"], ["mask3"]),
        node("Mul", ["h0", "mask3"], ["h0_masked"]),
        node("ReduceSum", ["h0_masked", "axis1"], ["h0_sum"], keepdims=0),
        node("ReduceSum", ["mask3", "axis1"], ["count"], keepdims=0),
        node("Max", ["count", "eps"], ["count_safe"]),
        node("Div", ["h0_sum", "count_safe"], ["context"]),
        node("Unsqueeze", ["context", "axis1"], ["context3"]),
        node("Add", ["h0", "context3"], ["h1"]),
        node("Tanh", ["h1"], ["last_hidden_state"]),
        node("Mul", ["last_hidden_state", "mask3"], ["last_masked"]),
        node("ReduceSum", ["last_masked", "axis1"], ["last_sum"], keepdims=0),
        node("Div", ["last_sum", "count_safe"], ["sentence_embedding"]),
    ]
    seq_input = [
        helper.make_tensor_value_info(name, TensorProto.INT64, ["batch", "seq"])
        for name in ("input_ids", "attention_mask", "token_type_ids")
    ]
    outputs = [
        helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["batch", "seq", HIDDEN]),
        helper.make_tensor_value_info("sentence_embedding", TensorProto.FLOAT, ["batch", HIDDEN]),
    ]
    graph = helper.make_graph(nodes, "tiny_encoder", seq_input, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def session(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


class OrtInstance:
    def __init__(self, path: Path) -> None:
        self._session = session(path)
        self._names = [o.name for o in self._session.get_outputs()]

    def infer(self, inputs: Feeds, outputs: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        names = list(outputs) if outputs else self._names
        return dict(zip(names, self._session.run(names, dict(inputs)), strict=True))


class TinyEngine:
    """The tiny ONNX encoder as an Engine, with every engine call recorded as (rows, seq).

    ``before`` runs on the instance's thread before each call: tests hold it (a gate) or make it fail.
    """

    inputs: Sequence[TensorSpec] = (
        TensorSpec("input_ids", "INT64", (-1, -1)),
        TensorSpec("attention_mask", "INT64", (-1, -1)),
        TensorSpec("token_type_ids", "INT64", (-1, -1)),
    )
    outputs: Sequence[TensorSpec] = (
        TensorSpec("last_hidden_state", "FP32", (-1, -1, HIDDEN)),
        TensorSpec("sentence_embedding", "FP32", (-1, HIDDEN)),
    )
    profile: ShapeProfile = PROFILE
    device: str = "cpu"

    def __init__(self, path: Path) -> None:
        self.path = path
        self.before: Callable[[Feeds], None] | None = None
        self.calls: list[tuple[int, int]] = []
        self.fed_ids: list[np.ndarray] = []
        self.requested_outputs: list[tuple[str, ...] | None] = []
        self.max_concurrent = 0
        self._running = 0
        self._lock = threading.Lock()

    def instance(self) -> _RecordingInstance:
        return _RecordingInstance(self, OrtInstance(self.path))

    def close(self) -> None:
        pass


class _RecordingInstance:
    """Records calls and refuses to be entered twice at once, as a real execution context would break."""

    def __init__(self, engine: TinyEngine, inner: OrtInstance) -> None:
        self._engine = engine
        self._inner = inner
        self._busy = threading.Lock()

    def infer(self, inputs: Feeds, outputs: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        if not self._busy.acquire(blocking=False):
            raise RuntimeError("engine instance entered by two batches at once")
        try:
            return self._infer(inputs, outputs)
        finally:
            self._busy.release()

    def _infer(self, inputs: Feeds, outputs: Sequence[str] | None) -> dict[str, np.ndarray]:
        engine = self._engine
        with engine._lock:
            rows, seq = inputs["input_ids"].shape
            engine.calls.append((rows, seq))
            engine.requested_outputs.append(tuple(outputs) if outputs else None)
            engine.fed_ids.append(inputs["input_ids"].copy())
            engine._running += 1
            engine.max_concurrent = max(engine.max_concurrent, engine._running)
        try:
            if engine.before is not None:
                engine.before(inputs)
            return self._inner.infer(inputs, outputs)
        finally:
            with engine._lock:
                engine._running -= 1


class Gate:
    """Holds engine calls on their thread until released; ``started`` is set once one is held."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()

    def __call__(self, inputs: Feeds) -> None:
        self.started.set()
        if not self.release.wait(10):
            raise TimeoutError("the test never released the gate")
