"""KServe v2 / Open Inference Protocol gRPC service (``inference.GRPCInferenceService``) on grpc.aio.

Serves ServerLive, ServerReady, ModelReady, ServerMetadata, ModelMetadata and ModelInfer so that NVIDIA's
``tritonclient.grpc`` works unmodified; other RPCs of the protocol answer UNIMPLEMENTED. Inputs arrive
as ``raw_input_contents`` (one entry per input) or as typed ``contents``; outputs always leave as
``raw_output_contents``, which is what tritonclient reads. A
:class:`~fleetserve.errors.FleetserveError` becomes the gRPC status named by its ``grpc_code`` (with a
``retry-after`` trailer when it carries one); anything else is logged and answered INTERNAL. Every call's
trailing metadata carries the replica's ORCA load report (``endpoint-load-metrics``), as HTTP responses do.

A call's deadline bounds its time in the batcher's queue (work still queued at the deadline is dropped,
never run), and a call the client cancels, or whose deadline passes, has its handler cancelled by grpc.aio,
which takes its request out of the queue.

``ModelInfer`` writes one access-log line per call and, with tracing on, the spans of :mod:`.tracing`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, NoReturn, TypeVar

import grpc
import grpc.aio
import numpy as np

from fleetserve.errors import FleetserveError, InvalidInput
from fleetserve.replica.codec import (
    CodecLimits,
    InferRequest,
    InputCollector,
    RequestedOutput,
    output_array,
    raw_to_array,
    request_options,
    resolve_outputs,
    tensor_to_raw,
    values_to_array,
)
from fleetserve.replica.deadline import remaining_deadline
from fleetserve.replica.load import LoadReporter
from fleetserve.replica.model import ModelRepository, ServedModel
from fleetserve.replica.proto import grpc_service_pb2 as pb
from fleetserve.replica.proto import grpc_service_pb2_grpc as pb_grpc
from fleetserve.replica.tracing import RequestSpans, server_span
from fleetserve.telemetry import otel
from fleetserve.telemetry.access_log import AccessLog
from fleetserve.wire import LOAD_REPORT_HEADER, RETRY_AFTER, retry_after

log = logging.getLogger(__name__)

_SERVICE = "inference.GRPCInferenceService"
_INFER_METHOD = f"/{_SERVICE}/ModelInfer"

Req = TypeVar("Req")
Resp = TypeVar("Resp")

# The typed field that carries each datatype's elements; FP16 has none and must travel raw.
_CONTENTS_FIELD = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


@dataclass(frozen=True)
class GrpcServerConfig:
    """Where the gRPC server listens and how much one call may carry."""

    host: str = "0.0.0.0"
    port: int = 8001  # 0 picks a free port; the handle reports the bound one
    max_message_bytes: int = 128 << 20
    max_concurrent_rpcs: int = 1024  # beyond this, calls fail fast with RESOURCE_EXHAUSTED

    def __post_init__(self) -> None:
        if not self.host:
            raise ValueError("GrpcServerConfig.host must not be empty")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"GrpcServerConfig.port must be in 0..65535, got {self.port}")
        if self.max_message_bytes < 1 << 16:
            raise ValueError(f"GrpcServerConfig.max_message_bytes must be at least 65536, got {self.max_message_bytes}")
        if self.max_concurrent_rpcs < 1:
            raise ValueError(f"GrpcServerConfig.max_concurrent_rpcs must be positive, got {self.max_concurrent_rpcs}")

    def address(self) -> str:
        host = f"[{self.host}]" if ":" in self.host and not self.host.startswith("[") else self.host
        return f"{host}:{self.port}"


@dataclass(frozen=True)
class GrpcServerHandle:
    """A started server and the port it is bound to."""

    server: grpc.aio.Server
    port: int

    async def stop(self, grace_s: float | None = None) -> None:
        """Stop accepting calls; in-flight calls get ``grace_s`` seconds to finish (None: wait for all)."""
        await self.server.stop(grace_s)


async def _abort(
    context: grpc.aio.ServicerContext, code: grpc.StatusCode, details: str, trailer: tuple[tuple[str, str], ...] = ()
) -> NoReturn:
    await context.abort(code, details, trailing_metadata=trailer)
    raise AssertionError("ServicerContext.abort returned instead of raising")


def _rpc(
    method: Callable[[InferenceServicer, Req, grpc.aio.ServicerContext], Awaitable[Resp]],
) -> Callable[[InferenceServicer, Req, grpc.aio.ServicerContext], Awaitable[Resp]]:
    @functools.wraps(method)
    async def wrapped(self: InferenceServicer, request: Req, context: grpc.aio.ServicerContext) -> Resp:
        try:
            response = await method(self, request, context)
        except FleetserveError as e:
            trailer = self._load_trailer()
            if e.retry_after_s is not None:
                trailer += ((RETRY_AFTER.lower(), retry_after(e.retry_after_s)),)
            await _abort(context, grpc.StatusCode[e.grpc_code], e.message, trailer)
        except Exception:
            log.exception("unhandled error in gRPC %s", method.__name__)
            await _abort(context, grpc.StatusCode.INTERNAL, "internal error", self._load_trailer())
        context.set_trailing_metadata(self._load_trailer())
        return response

    return wrapped


def _param_value(param: pb.InferParameter) -> object:
    choice = param.WhichOneof("parameter_choice")
    return None if choice is None else getattr(param, choice)


def _contents_values(name: str, datatype: str, count: int, contents: pb.InferTensorContents) -> list[Any]:
    field = _CONTENTS_FIELD.get(datatype)
    used = sorted(f.name for f, _ in contents.ListFields())
    if field is None:
        if count:
            raise InvalidInput(f"input {name!r}: {datatype} elements must be sent in raw_input_contents")
        return []
    if any(u != field for u in used):
        raise InvalidInput(f"input {name!r}: {datatype} elements belong in contents.{field}, got {used}")
    return list(getattr(contents, field))


def decode_model_infer(request: pb.ModelInferRequest, model: ServedModel, limits: CodecLimits) -> InferRequest:
    """Validate a ModelInferRequest against ``model`` into the codec's request form."""
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise InvalidInput(f"raw_input_contents has {len(raw)} entries for {len(request.inputs)} inputs")
    collector = InputCollector(model.inputs, limits)
    for i, tensor in enumerate(request.inputs):
        header = collector.header(tensor.name, tensor.datatype, list(tensor.shape))
        if "shared_memory_region" in tensor.parameters:
            raise InvalidInput(f"input {header.name!r}: the shared memory extension is not supported")
        if raw:
            if tensor.HasField("contents"):
                raise InvalidInput(f"input {header.name!r} has both contents and raw_input_contents")
            array = raw_to_array(header, raw[i])
        else:
            values = _contents_values(header.name, header.datatype, header.count, tensor.contents)
            array = values_to_array(header, values)
        collector.add(header, array)
    requested = []
    for out in request.outputs:
        if "classification" in out.parameters and _param_value(out.parameters["classification"]):
            raise InvalidInput(f"output {out.name!r}: the classification extension is not supported")
        requested.append(RequestedOutput(out.name, True))
    priority, timeout_s = request_options({k: _param_value(v) for k, v in request.parameters.items()})
    return InferRequest(
        inputs=collector.finish(),
        outputs=resolve_outputs(requested or None, model.outputs, True),
        id=request.id or None,
        priority=priority,
        timeout_s=timeout_s,
    )


def encode_model_infer(
    model: ServedModel, request: InferRequest, results: dict[str, np.ndarray]
) -> pb.ModelInferResponse:
    datatypes = {s.name: s.datatype for s in model.outputs}
    response = pb.ModelInferResponse(model_name=model.name, model_version=model.version, id=request.id or "")
    for wanted in request.outputs:
        datatype = datatypes[wanted.name]
        array = output_array(results, wanted.name, datatype)
        response.outputs.add(name=wanted.name, datatype=datatype, shape=list(array.shape))
        response.raw_output_contents.append(tensor_to_raw(array, datatype))
    return response


class InferenceServicer:
    """The ``inference.GRPCInferenceService`` methods over a :class:`ModelRepository`."""

    def __init__(self, repo: ModelRepository, limits: CodecLimits, load: LoadReporter | None = None,
                 tracing: otel.Tracing | None = None, access: AccessLog | None = None) -> None:
        self._repo = repo
        self._limits = limits
        self._load = load
        self._tracing = tracing
        self._access = access

    def _load_trailer(self) -> tuple[tuple[str, str], ...]:
        return () if self._load is None else ((LOAD_REPORT_HEADER, self._load.report()),)

    @_rpc
    async def ServerLive(
        self, request: pb.ServerLiveRequest, context: grpc.aio.ServicerContext
    ) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=self._repo.is_live())

    @_rpc
    async def ServerReady(
        self, request: pb.ServerReadyRequest, context: grpc.aio.ServicerContext
    ) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self._repo.is_ready())

    @_rpc
    async def ModelReady(
        self, request: pb.ModelReadyRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelReadyResponse:
        return pb.ModelReadyResponse(ready=self._repo.get(request.name, request.version).is_ready())

    @_rpc
    async def ServerMetadata(
        self, request: pb.ServerMetadataRequest, context: grpc.aio.ServicerContext
    ) -> pb.ServerMetadataResponse:
        info = self._repo.info
        return pb.ServerMetadataResponse(name=info.name, version=info.version, extensions=list(info.extensions))

    @_rpc
    async def ModelMetadata(
        self, request: pb.ModelMetadataRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelMetadataResponse:
        model = self._repo.get(request.name, request.version)
        tensor = pb.ModelMetadataResponse.TensorMetadata
        return pb.ModelMetadataResponse(
            name=model.name,
            versions=[model.version],
            platform=model.platform,
            inputs=[tensor(name=s.name, datatype=s.datatype, shape=list(s.shape)) for s in model.inputs],
            outputs=[tensor(name=s.name, datatype=s.datatype, shape=list(s.shape)) for s in model.outputs],
        )

    @_rpc
    async def ModelInfer(
        self, request: pb.ModelInferRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelInferResponse:
        tracing = self._tracing
        if tracing is None and self._access is None:
            return await self._infer(request, context, None)
        started = time.perf_counter()
        carrier = {k: v for k, v in (context.invocation_metadata() or ()) if isinstance(v, str)}
        attributes = {"rpc.system": "grpc", "rpc.service": _SERVICE, "rpc.method": "ModelInfer"}
        span = None
        if tracing is not None and tracing.samples(carrier.get("traceparent")):
            span = server_span(tracing, f"{_SERVICE}/ModelInfer", carrier, attributes)
        status, code, answer = 500, grpc.StatusCode.INTERNAL, None
        try:
            answer = await self._infer(request, context, RequestSpans.of(tracing, span))
            status, code = 200, grpc.StatusCode.OK
            return answer
        except FleetserveError as exc:
            status, code = exc.http_status, grpc.StatusCode[exc.grpc_code]
            raise
        except asyncio.CancelledError:
            status, code = 499, grpc.StatusCode.CANCELLED
            raise
        finally:
            if span is not None:
                otel.end_server_span(span, status, grpc_code=code.value[0])
            if self._access is not None:
                trace_id = None if span is None else otel.trace_id(span)
                self._access.request("POST", _INFER_METHOD, status, time.perf_counter() - started,
                                     trace_id=trace_id, bytes_in=request.ByteSize(),
                                     bytes_out=0 if answer is None else answer.ByteSize())

    async def _infer(self, request: pb.ModelInferRequest, context: grpc.aio.ServicerContext,
                     spans: RequestSpans | None) -> pb.ModelInferResponse:
        deadline = remaining_deadline(context.time_remaining())
        model = self._repo.get(request.model_name, request.model_version)
        with contextlib.nullcontext() if spans is None else spans.stage("decode"):
            decoded = decode_model_infer(request, model, self._limits)
        with contextlib.nullcontext() if spans is None else spans.batched():  # queue wait and batch
            results = await model.infer(
                decoded.inputs, priority=decoded.priority, timeout_s=decoded.timeout_s,
                outputs=[o.name for o in decoded.outputs], deadline=deadline,
            )
        with contextlib.nullcontext() if spans is None else spans.stage("encode"):
            return encode_model_infer(model, decoded, results)


async def start_grpc_server(repo: ModelRepository, config: GrpcServerConfig, limits: CodecLimits,
                            load: LoadReporter | None = None, tracing: otel.Tracing | None = None,
                            access: AccessLog | None = None) -> GrpcServerHandle:
    """Bind and start the gRPC server; stop it with ``await handle.stop(grace_s)``."""
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", config.max_message_bytes),
            ("grpc.max_send_message_length", config.max_message_bytes),
        ],
        maximum_concurrent_rpcs=config.max_concurrent_rpcs,
    )
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(InferenceServicer(repo, limits, load, tracing, access), server)
    port = server.add_insecure_port(config.address())
    await server.start()
    return GrpcServerHandle(server, port)
