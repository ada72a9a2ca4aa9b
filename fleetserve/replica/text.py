"""``POST /inference``: text in, results out — the seed's simple route, tokenization on the server.

``{"texts": [...]}`` returns ``{"embeddings": [[...]], "truncated": [i, ...]}``; ``{"query": "...",
"candidates": [...], "top_k": K}`` ranks the candidates by cosine similarity to the query (one engine
request of 1 + N rows) and returns ``{"results": [{"index", "text", "score"}, ...]}``. Texts longer than the
model maximum are truncated and their indices listed under ``truncated`` (documented, never silent). A call
with more texts than one engine batch is split into batch-sized requests that run concurrently. ``timeout_ms``
in the body and a forwarded ``X-Fleetserve-Timeout-Ms`` bound the time those requests may wait in the queue.
Concurrent requests are tokenised together (:mod:`fleetserve.replica.text_batch`); bodies are parsed and
answers written with orjson, which writes the float32 embedding straight from the array (no ``tolist``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
from aiohttp import web

from fleetserve.errors import InvalidInput, PayloadTooLarge
from fleetserve.models.tokenizer import Encoded, TextTokenizer
from fleetserve.replica.deadline import forwarded_deadline
from fleetserve.replica.kserve_http import guarded
from fleetserve.replica.model import ServedModel
from fleetserve.replica.text_batch import TextBatcher
from fleetserve.wire import TIMEOUT_HEADER


@dataclass(frozen=True)
class TextLimits:
    max_texts: int = 1024
    max_chars: int = 100_000  # per text; tokens beyond the model maximum are truncated anyway


class TextService:
    def __init__(
        self, model: ServedModel, tokenizer: TextTokenizer, embedding_output: str, limits: TextLimits,
        on_truncated: Callable[[int], None] | None = None, tokenize_threads: int = 2,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.batcher = TextBatcher(tokenizer, max_texts=max(limits.max_texts, 1), max_jobs=tokenize_threads)
        self.output = embedding_output
        self.limits = limits
        self._chunk = max(1, model.max_batch_size)
        self._on_truncated = on_truncated

    def _texts(self, value: object, field: str) -> list[str]:
        if not isinstance(value, list):
            raise InvalidInput(f"'{field}' must be a list of strings")
        if not value:
            raise InvalidInput(f"'{field}' must not be empty")
        if len(value) > self.limits.max_texts:
            raise PayloadTooLarge(f"'{field}' has {len(value)} texts; the limit is {self.limits.max_texts}")
        for i, t in enumerate(value):
            if not isinstance(t, str):
                raise InvalidInput(f"'{field}[{i}]' must be a string, got {type(t).__name__}")
            if len(t) > self.limits.max_chars:
                raise PayloadTooLarge(f"'{field}[{i}]' has {len(t)} characters; the limit is {self.limits.max_chars}")
        return value

    async def embed(
        self, texts: list[str], priority: int | None, timeout_s: float | None, deadline: float | None = None
    ) -> tuple[np.ndarray, list[int]]:
        chunks = [texts[i : i + self._chunk] for i in range(0, len(texts), self._chunk)]
        encoded = await self.batcher.encode(chunks)

        def infer(e: Encoded) -> Coroutine[Any, Any, dict[str, np.ndarray]]:
            return self.model.infer(e.as_inputs(), priority=priority, timeout_s=timeout_s, outputs=(self.output,),
                                    deadline=deadline)

        if len(encoded) == 1:  # the common case: no task and no gather of one
            return (await infer(encoded[0]))[self.output], self._truncated(encoded)
        tasks = [asyncio.ensure_future(infer(e)) for e in encoded]
        try:
            results = await asyncio.gather(*tasks)
        except BaseException:
            # One chunk failed (e.g. expired): the others' answers are useless, so leave the queue unrun.
            for task in tasks:
                task.cancel()
            raise
        return np.concatenate([r[self.output] for r in results]), self._truncated(encoded)

    def _truncated(self, encoded: list[Encoded]) -> list[int]:
        """Indices of the texts cut to the model's maximum length (counted in the metrics)."""
        truncated = [i for i, flag in enumerate(f for e in encoded for f in e.truncated) if flag]
        if truncated and self._on_truncated is not None:
            self._on_truncated(len(truncated))
        return truncated

    async def handle(self, body: dict[str, object], deadline: float | None = None) -> dict[str, object]:
        """Answer one ``/inference`` body; ``deadline`` (``time.monotonic()`` seconds) bounds its queueing."""
        priority = body.get("priority")
        if priority is not None and (not isinstance(priority, int) or isinstance(priority, bool)):
            raise InvalidInput("'priority' must be an integer")
        timeout_ms = body.get("timeout_ms")
        if timeout_ms is not None and (not isinstance(timeout_ms, int | float) or timeout_ms <= 0):
            raise InvalidInput("'timeout_ms' must be a positive number")
        timeout_s = timeout_ms / 1000 if timeout_ms else None
        if "texts" in body:
            texts = self._texts(body["texts"], "texts")
            emb, truncated = await self.embed(texts, priority, timeout_s, deadline)
            return {"embeddings": np.ascontiguousarray(emb, dtype=np.float32), "truncated": truncated}
        if "query" in body:
            query = body["query"]
            if not isinstance(query, str) or not query:
                raise InvalidInput("'query' must be a non-empty string")
            candidates = self._texts(body.get("candidates"), "candidates")
            top_k = body.get("top_k", len(candidates))
            if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1:
                raise InvalidInput("'top_k' must be a positive integer")
            emb, truncated = await self.embed([query, *candidates], priority, timeout_s, deadline)
            q, c = emb[0], emb[1:]
            norms = np.linalg.norm(c, axis=1) * max(float(np.linalg.norm(q)), 1e-12)
            scores = (c @ q) / np.maximum(norms, 1e-12)
            order = np.argsort(-scores, kind="stable")[:top_k]
            return {
                "results": [{"index": int(i), "text": candidates[i], "score": float(scores[i])} for i in order],
                "truncated": [i - 1 for i in truncated if i > 0],
                "query_truncated": 0 in truncated,
            }
        raise InvalidInput("body needs 'texts' (embeddings) or 'query' + 'candidates' (ranking)")


def add_text_route(app: web.Application, service: TextService) -> None:
    @guarded
    async def inference(request: web.Request) -> web.Response:
        deadline = forwarded_deadline(request.headers.get(TIMEOUT_HEADER))
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError as exc:
            raise InvalidInput(f"body is not valid JSON: {exc}") from None
        if not isinstance(body, dict):
            raise InvalidInput("body must be a JSON object")
        answer = orjson.dumps(await service.handle(body, deadline), option=orjson.OPT_SERIALIZE_NUMPY)
        return web.Response(body=answer, content_type="application/json")

    app.router.add_post("/inference", inference)
