"""NVIDIA PyTriton serving fleetserve's ONNX engine file: the Triton baseline of ``benchmarks/replica.py``.

A real Triton Inference Server (bundled in the ``nvidia-pytriton`` wheel) runs its dynamic batcher in
front of a Python infer function that does what a typical PyTriton deployment of a sentence encoder
does: decode the batch of texts, tokenize them with the model's own ``tokenizer.json`` (padded to the
longest text of the batch, truncated at ``--max-seq``) and run the same ONNX file with onnxruntime.

The model ``--model-name`` takes one ``text`` input (``BYTES``, shape ``[-1, 1]``) and returns
``sentence_embedding`` (``FP32 [-1, 384]``) over KServe v2 HTTP and gRPC. It runs in its own virtual
environment, because PyTriton pins versions the project's venv does not share::

    python3 -m venv /tmp/pytriton-venv
    /tmp/pytriton-venv/bin/pip install nvidia-pytriton onnxruntime tokenizers
    LD_LIBRARY_PATH=$(python3 -c 'import sysconfig; print(sysconfig.get_config_var("LIBDIR"))') \\
        /tmp/pytriton-venv/bin/python benchmarks/pytriton_server.py --onnx MODEL.onnx --tokenizer tokenizer.json

Triton's python backend stub loads ``libpython3.x.so`` at run time, hence ``LD_LIBRARY_PATH``. SIGTERM or
SIGINT stops Triton and removes PyTriton's workspace.
"""

from __future__ import annotations

import argparse
import signal
from pathlib import Path

import numpy as np
import onnxruntime as ort
from pytriton.decorators import batch
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig, TritonSecurityConfig
from tokenizers import Tokenizer

EMBEDDING = "sentence_embedding"
# PyTriton's defaults minus "statistics": the benchmark reads batch counts from /v2/models/{m}/stats.
RESTRICTED = ["shared-memory", "model-repository", "trace", "logging"]
# Triton waits this long for open client connections on shutdown (its default is 30 s).
EXIT_TIMEOUT_S = 3


class Encoder:
    """Tokenizer + onnxruntime session; one instance serves one Triton model instance."""

    def __init__(self, onnx_path: Path, tokenizer_path: Path, max_seq: int, threads: int) -> None:
        self._tok = Tokenizer.from_file(str(tokenizer_path))
        self._tok.enable_truncation(max_seq)
        self._tok.enable_padding()
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self._session = ort.InferenceSession(str(onnx_path), opts, providers=["CPUExecutionProvider"])

    def embed(self, texts: list[str]) -> np.ndarray:
        encs = self._tok.encode_batch(texts)
        feeds = {
            "input_ids": np.array([e.ids for e in encs], dtype=np.int64),
            "attention_mask": np.array([e.attention_mask for e in encs], dtype=np.int64),
            "token_type_ids": np.array([e.type_ids for e in encs], dtype=np.int64),
        }
        (embedding,) = self._session.run([EMBEDDING], feeds)
        return np.asarray(embedding, dtype=np.float32)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--onnx", type=Path, required=True, help="the engine's model.onnx")
    parser.add_argument("--tokenizer", type=Path, required=True, help="the model's tokenizer.json")
    parser.add_argument("--model-name", default="minilm")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--http-port", type=int, default=8000)
    parser.add_argument("--grpc-port", type=int, default=8001)
    parser.add_argument("--metrics-port", type=int, default=8002)
    parser.add_argument("--max-batch", type=int, default=32)
    parser.add_argument("--max-delay-ms", type=float, default=2.0, help="Triton's max_queue_delay_microseconds")
    parser.add_argument("--max-seq", type=int, default=256, help="truncate texts at this many tokens")
    parser.add_argument("--threads", type=int, default=2, help="onnxruntime intra-op threads")
    args = parser.parse_args()

    # PyTriton stops cleanly on KeyboardInterrupt. A process started in the background inherits SIGINT
    # ignored, and a supervisor sends SIGTERM: make both raise it.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.default_int_handler)
    encoder = Encoder(args.onnx, args.tokenizer, args.max_seq, args.threads)

    @batch
    def infer(text: np.ndarray) -> dict[str, np.ndarray]:
        return {EMBEDDING: encoder.embed([t.decode("utf-8") for t in text[:, 0]])}

    dim = encoder.embed(["warm up"]).shape[1]
    config = TritonConfig(
        http_address=args.host, http_port=args.http_port, grpc_address=args.host, grpc_port=args.grpc_port,
        metrics_address=args.host, metrics_port=args.metrics_port, log_verbose=0,
        exit_timeout_secs=EXIT_TIMEOUT_S,
    )
    with Triton(config=config, security_config=TritonSecurityConfig(restricted_endpoints=RESTRICTED)) as triton:
        triton.bind(
            model_name=args.model_name,
            infer_func=infer,
            inputs=[Tensor(name="text", dtype=bytes, shape=(1,))],
            outputs=[Tensor(name=EMBEDDING, dtype=np.float32, shape=(dim,))],
            config=ModelConfig(
                max_batch_size=args.max_batch,
                batcher=DynamicBatcher(max_queue_delay_microseconds=round(args.max_delay_ms * 1000)),
            ),
            strict=True,
        )
        triton.serve()


if __name__ == "__main__":
    main()
