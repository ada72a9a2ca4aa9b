"""KServe v2 / Open Inference Protocol REST routes (health, metadata, inference) for aiohttp.

Shapes of the answers mirror Triton's so NVIDIA's ``tritonclient.http`` works unmodified. Every error
leaves as ``{"error": message}`` with the status of its :class:`~fleetserve.errors.FleetserveError`
(``Retry-After`` in whole seconds when the error carries one); anything unexpected is logged and answered
500 without a traceback. A forwarded deadline (``X-Fleetserve-Timeout-Ms``, see :mod:`.deadline`)
bounds the request's time in the queue, together with Triton's ``timeout`` parameter. Large bodies
are decoded and encoded on a worker thread so one big request does not stall the event loop for
everyone else.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from aiohttp import web

from fleetserve.engine.base import TensorSpec
from fleetserve.errors import FleetserveError, NotReady
from fleetserve.replica.codec import HEADER_LENGTH, CodecLimits, decode_infer_request, encode_infer_response
from fleetserve.replica.deadline import forwarded_deadline
from fleetserve.replica.model import ModelRepository, ServedModel
from fleetserve.replica.tracing import SPAN_KEY, RequestSpans
from fleetserve.telemetry import otel
from fleetserve.wire import RETRY_AFTER, TIMEOUT_HEADER, error_response, retry_after

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
T = TypeVar("T")

# Bodies above this size are (de)serialized off the event loop; below it the thread hop costs more.
_OFFLOAD_BYTES = 1 << 20


def error_answer(error: FleetserveError) -> web.Response:
    """The JSON error answer for ``error``, with ``Retry-After`` if it carries one."""
    headers = None if error.retry_after_s is None else {RETRY_AFTER: retry_after(error.retry_after_s)}
    return error_response(error.http_status, error.message, headers)


def guarded(handler: Handler) -> Handler:
    @functools.wraps(handler)
    async def guarded(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except FleetserveError as e:
            return error_answer(e)
        except web.HTTPException as e:
            # aiohttp raises these itself, e.g. 413 when the body passes client_max_size.
            if e.status < 400:
                raise
            return error_response(e.status, e.text or e.reason)
        except Exception:
            log.exception("unhandled error in %s %s", request.method, request.path)
            return error_response(500, "internal error")

    return guarded


async def _maybe_offload(nbytes: int, fn: Callable[..., T], *args: object, **kwargs: object) -> T:
    if nbytes > _OFFLOAD_BYTES:
        return await asyncio.to_thread(fn, *args, **kwargs)
    return fn(*args, **kwargs)


def model_metadata(model: ServedModel) -> dict[str, object]:
    return {
        "name": model.name,
        "versions": [model.version],
        "platform": model.platform,
        "inputs": [s.to_json() for s in model.inputs],
        "outputs": [s.to_json() for s in model.outputs],
    }


def model_config(model: ServedModel) -> dict[str, object]:
    """Triton's model-configuration answer (``GET .../config``), which ``perf_analyzer`` reads before it
    sends anything. With batching, Triton's ``dims`` leave out the leading batch dimension."""
    skip = 1 if model.max_batch_size > 0 else 0

    def tensor(spec: TensorSpec) -> dict[str, object]:
        dtype = "STRING" if spec.datatype == "BYTES" else spec.datatype
        return {"name": spec.name, "data_type": f"TYPE_{dtype}", "dims": list(spec.shape[skip:])}

    config: dict[str, object] = {
        "name": model.name,
        "platform": model.platform,
        "max_batch_size": model.max_batch_size,
        "input": [tensor(s) for s in model.inputs],
        "output": [tensor(s) for s in model.outputs],
    }
    if model.max_batch_size > 0:
        config["dynamic_batching"] = {}
    return config


class _KServeHandlers:
    def __init__(self, repo: ModelRepository, limits: CodecLimits, tracing: otel.Tracing | None) -> None:
        self._repo = repo
        self._limits = limits
        self._tracing = tracing

    def _model(self, request: web.Request) -> ServedModel:
        return self._repo.get(request.match_info["model"], request.match_info.get("version"))

    async def server_metadata(self, request: web.Request) -> web.StreamResponse:
        return web.json_response(self._repo.info.to_json())

    async def live(self, request: web.Request) -> web.StreamResponse:
        if not self._repo.is_live():
            raise NotReady("the server is not live")
        return web.json_response({"live": True})

    async def ready(self, request: web.Request) -> web.StreamResponse:
        if not self._repo.is_ready():
            raise NotReady("the server is draining" if self._repo.draining else "the server is not ready")
        return web.json_response({"ready": True})

    async def model_metadata(self, request: web.Request) -> web.StreamResponse:
        return web.json_response(model_metadata(self._model(request)))

    async def model_config(self, request: web.Request) -> web.StreamResponse:
        return web.json_response(model_config(self._model(request)))

    async def model_ready(self, request: web.Request) -> web.StreamResponse:
        model = self._model(request)
        if not model.is_ready():
            raise NotReady(f"model {model.name!r} is not ready")
        return web.json_response({"name": model.name, "ready": True})

    async def infer(self, request: web.Request) -> web.StreamResponse:
        spans = None if self._tracing is None else RequestSpans.of(self._tracing, request.get(SPAN_KEY))
        deadline = forwarded_deadline(request.headers.get(TIMEOUT_HEADER))
        model = self._model(request)
        with _stage(spans, "decode"):
            body = await request.read()
            decoded = await _maybe_offload(
                len(body),
                decode_infer_request,
                body,
                request.headers.get(HEADER_LENGTH),
                inputs=model.inputs,
                outputs=model.outputs,
                limits=self._limits,
            )
        with contextlib.nullcontext() if spans is None else spans.batched():  # queue wait and batch
            results = await model.infer(
                decoded.inputs, priority=decoded.priority, timeout_s=decoded.timeout_s,
                outputs=[o.name for o in decoded.outputs], deadline=deadline,
            )
        with _stage(spans, "encode"):
            payload, header_length = await _maybe_offload(
                sum(getattr(a, "nbytes", 0) for a in results.values()),
                encode_infer_response,
                model_name=model.name,
                model_version=model.version,
                request=decoded,
                results=results,
                outputs=model.outputs,
            )
        if header_length is None:
            return web.Response(body=payload, content_type="application/json")
        return web.Response(
            body=payload,
            content_type="application/octet-stream",
            headers={HEADER_LENGTH: str(header_length)},
        )


def _stage(spans: RequestSpans | None, name: str) -> contextlib.AbstractContextManager[None]:
    """A span around a stage of a traced request; nothing for an untraced one."""
    return contextlib.nullcontext() if spans is None else spans.stage(name)


def add_kserve_routes(app: web.Application, repo: ModelRepository, limits: CodecLimits,
                      tracing: otel.Tracing | None = None) -> None:
    """Mount ``/v2`` health, metadata and inference routes (with ``/versions/{version}`` forms) on ``app``.

    The request body bound is the application's ``client_max_size``; keep it above
    ``limits.max_json_bytes`` plus ``limits.max_total_bytes`` so the codec's clearer limits apply first.
    """
    h = _KServeHandlers(repo, limits, tracing)
    app.router.add_get("/v2", guarded(h.server_metadata))
    app.router.add_get("/v2/health/live", guarded(h.live))
    app.router.add_get("/v2/health/ready", guarded(h.ready))
    for base in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
        app.router.add_get(base, guarded(h.model_metadata))
        app.router.add_get(base + "/ready", guarded(h.model_ready))
        app.router.add_get(base + "/config", guarded(h.model_config))
        app.router.add_post(base + "/infer", guarded(h.infer))
