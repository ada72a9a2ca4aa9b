"""One engine instance on a GPU: CUDA graphs per (batch bucket, sequence bucket), static buffers, own stream.

Every instance owns a CUDA stream, pinned host buffers and a device input buffer sized once for
``max_batch × max_seq`` (times three inputs), and one captured CUDA graph per bucket pair (captured when the
instance is created, so the first request never pays for it). A call copies the request into the pinned
buffer, padded to the nearest captured bucket, with the three inputs back to back, uploads them in one
asynchronous copy, replays the graph, downloads only the outputs asked for and cuts them back to the
request's own shape. Each bucket's graph reads its inputs where that layout puts them, and its views of the
buffers are made once, at capture: a call for embeddings makes four CUDA calls (upload, replay, download,
wait), each a release of the interpreter lock, which the engine process's other threads may be holding when
the call wants it back (eight calls before: the engine process's call took 1.23-1.31 ms for 0.2 ms of GPU
work, now 0.91-1.03 ms; BENCHMARKS.md §10.13). The graphs of one instance share one memory pool: an instance
runs one batch at a time, so their intermediates never live at once. Instances share the engine's weights,
so several of them run concurrently on one GPU.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from fleetserve.engine.base import ShapeProfile
from fleetserve.engine.gpu_io import (
    EMBEDDING,
    HIDDEN,
    INPUT_NAMES,
    bucket_for,
    check_inputs,
    stage_packed,
    wanted_outputs,
)
from fleetserve.engine.torch_encoder import Encoder, EncoderConfig

WARMUP_RUNS = 2


def token_limits(cfg: EncoderConfig) -> dict[str, int]:
    return {"input_ids": cfg.vocab_size, "attention_mask": 2, "token_type_ids": cfg.type_vocab}


@dataclass(frozen=True)
class _Captured:
    """One bucket pair's graph, its outputs, and the buffer views a call on it copies between."""

    graph: torch.cuda.CUDAGraph
    hidden: torch.Tensor
    emb: torch.Tensor
    dev_in: torch.Tensor  # the device inputs, back to back
    host_in: torch.Tensor  # the same span of the pinned staging buffer
    host_emb: torch.Tensor  # pinned, batch bucket × hidden


class GraphInstance:
    """``infer`` is safe to call from any thread; calls on one instance are serialised."""

    def __init__(self, encoder: Encoder, profile: ShapeProfile, device: torch.device) -> None:
        self._enc = encoder
        self._profile = profile
        self._device = device
        self._hidden = encoder.cfg.hidden
        self._lock = threading.Lock()
        self._stream = torch.cuda.Stream(device)
        cap = profile.max_batch * profile.max_seq
        self._limits = token_limits(encoder.cfg)
        self._max_seq = min(profile.max_seq, encoder.cfg.max_positions)
        self._host_in = torch.zeros(len(INPUT_NAMES) * cap, dtype=torch.int64, pin_memory=True)
        self._host_in_np = self._host_in.numpy()
        self._dev_in = torch.zeros(len(INPUT_NAMES) * cap, dtype=torch.int64, device=device)
        self._host_emb = torch.empty(profile.max_batch * self._hidden, dtype=torch.float32, pin_memory=True)
        self._host_emb_np = self._host_emb.numpy()
        # The hidden-state buffer is max_batch × max_seq × hidden floats: pinned only once someone asks for it.
        self._host_hidden: torch.Tensor | None = None
        self._graphs: dict[tuple[int, int], _Captured] = {}
        self._capture_all()

    def _static_inputs(self, b: int, s: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The device views a ``b × s`` bucket's graph reads: the inputs back to back (``stage_packed``)."""
        n = b * s
        ids, mask, types = (self._dev_in[i * n:(i + 1) * n].view(b, s) for i in range(len(INPUT_NAMES)))
        return ids, mask, types

    def _capture_all(self) -> None:
        pool = torch.cuda.graph_pool_handle()
        with torch.cuda.device(self._device), torch.inference_mode():
            # Largest shapes first: the shared pool then grows once instead of once per bucket.
            for b in sorted(self._profile.batch_buckets, reverse=True):
                for s in sorted(self._profile.seq_buckets, reverse=True):
                    ids, mask, types = self._static_inputs(b, s)
                    mask.fill_(1)
                    with torch.cuda.stream(self._stream):
                        # Warm-up on the capture stream: Triton compiles, cuBLAS sets up its workspace.
                        for _ in range(WARMUP_RUNS):
                            self._enc.forward(ids, mask, types)
                    self._stream.synchronize()
                    graph = torch.cuda.CUDAGraph()
                    # thread_local: other threads may keep serving on this GPU while an instance is captured.
                    with torch.cuda.graph(graph, pool=pool, stream=self._stream, capture_error_mode="thread_local"):
                        hidden, emb = self._enc.forward(ids, mask, types)
                    n = len(INPUT_NAMES) * b * s
                    self._graphs[(b, s)] = _Captured(graph, hidden, emb, self._dev_in[:n], self._host_in[:n],
                                                     self._host_emb[: b * self._hidden].view(b, self._hidden))
            self._stream.synchronize()

    @property
    def stream(self) -> torch.cuda.Stream:
        return self._stream

    @property
    def buckets(self) -> list[tuple[int, int]]:
        return sorted(self._graphs)

    def replay(self, batch: int, seq: int) -> None:
        """Run the captured graph of a bucket pair on whatever the device inputs hold (benchmarks)."""
        with torch.cuda.device(self._device), torch.cuda.stream(self._stream):
            self._graphs[(batch, seq)].graph.replay()

    def infer(self, inputs: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        """Run one batch; ``outputs`` limits which outputs are copied back (default: both)."""
        b, s = check_inputs(inputs, self._limits, self._profile.max_batch, self._max_seq)
        want = wanted_outputs(outputs)
        bb = bucket_for(self._profile.batch_buckets, b, "batch")
        sb = bucket_for(self._profile.seq_buckets, s, "sequence length")
        captured = self._graphs[(bb, sb)]
        result: dict[str, np.ndarray] = {}
        with self._lock, torch.cuda.device(self._device), torch.cuda.stream(self._stream):
            stage_packed(self._host_in_np, inputs, bb, sb)
            captured.dev_in.copy_(captured.host_in, non_blocking=True)
            captured.graph.replay()
            if EMBEDDING in want:
                captured.host_emb.copy_(captured.emb, non_blocking=True)
            host_hidden = None
            if HIDDEN in want:
                host_hidden = self._hidden_buffer()[: b * sb * self._hidden].view(b, sb, self._hidden)
                host_hidden.copy_(captured.hidden[:b], non_blocking=True)
            self._stream.synchronize()
            # Copies: the pinned buffers are reused by the next call.
            if EMBEDDING in want:
                result[EMBEDDING] = self._host_emb_np[: b * self._hidden].reshape(b, self._hidden).copy()
            if host_hidden is not None:
                result[HIDDEN] = host_hidden.numpy()[:, :s].copy()
        return result

    def _hidden_buffer(self) -> torch.Tensor:
        if self._host_hidden is None:
            size = self._profile.max_batch * self._profile.max_seq * self._hidden
            self._host_hidden = torch.empty(size, dtype=torch.float32, pin_memory=True)
        return self._host_hidden

    def close(self) -> None:
        with self._lock:
            self._graphs.clear()
