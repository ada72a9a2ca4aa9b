"""Tokenise the texts of concurrent ``/inference`` requests together, in a thread beside the event loop.

Tokenising one short text costs a fixed ~100-200 µs of CPU in the Rust tokenizer whatever the batching; done
on the event-loop thread it is a large share of what that one thread can serve. Here a request parks its
texts and a future; at the end of the event-loop pass, if no tokenising job is running, the parked texts go
to a worker thread as one batch call to the tokenizer (which releases the interpreter lock), and the texts that
arrive meanwhile wait for the next job. Batches therefore grow with the load and a lone request waits for
no timer (the scheme of Nagle's algorithm, RFC 896, and of group commit). At most ``max_jobs`` jobs run at
once; a job starts early only when ``max_texts`` are parked. The parked texts are bounded: past
``max_pending`` a request is refused (``Overloaded``, answered 503 with ``Retry-After``).

With ``max_jobs=0`` the end-of-pass job runs on the event-loop thread itself: the same batching, without the
two thread hand-offs per job (the worker's wake-up, and the loop's to take the result). That spends the
loop's own CPU on the tokenizer, so it suits a front end whose loop has time to spare, as on a many-core GPU
host; where the loop is the bottleneck, the thread keeps the tokenizer off it.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

from fleetserve.errors import Overloaded
from fleetserve.models.tokenizer import Encoded, TextTokenizer


class TextBatcher:
    def __init__(self, tokenizer: TextTokenizer, max_texts: int = 256, max_jobs: int = 2,
                 max_pending: int = 8192) -> None:
        if min(max_texts, max_pending) < 1 or max_jobs < 0:
            raise ValueError("max_texts and max_pending must be >= 1, max_jobs >= 0")
        self.tokenizer = tokenizer
        self.max_texts = max_texts
        self.max_jobs = max_jobs
        self.max_pending = max_pending
        self._groups: list[list[str]] = []
        self._waiters: list[asyncio.Future[Encoded]] = []
        self._texts = 0
        self._jobs = 0
        self._kick_scheduled = False
        self._pool = ThreadPoolExecutor(max_jobs, thread_name_prefix="tokenize") if max_jobs else None

    async def encode(self, chunks: list[list[str]]) -> list[Encoded]:
        """Each chunk's :class:`Encoded`, as ``tokenizer.encode(chunk)`` would return it."""
        count = sum(len(c) for c in chunks)
        if self._texts + count > self.max_pending:
            raise Overloaded(f"{self._texts} texts are waiting to be tokenised; the limit is {self.max_pending}")
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[Encoded]] = [loop.create_future() for _ in chunks]
        self._groups.extend(chunks)
        self._waiters.extend(futures)
        self._texts += count
        if self._texts >= self.max_texts and self._jobs < self.max_jobs:
            self._start(loop)
        elif self._jobs == 0 and not self._kick_scheduled:
            self._kick_scheduled = True
            loop.call_soon(self._kick, loop)
        if len(futures) == 1:  # one chunk, the common case: no gather of one
            return [await futures[0]]
        return list(await asyncio.gather(*futures))

    def _kick(self, loop: asyncio.AbstractEventLoop) -> None:
        self._kick_scheduled = False
        if self._groups and self._pool is None:
            self._run_here()
        elif self._groups and self._jobs < self.max_jobs:
            self._start(loop)

    def _take(self) -> tuple[list[list[str]], list[asyncio.Future[Encoded]]]:
        groups, waiters = self._groups, self._waiters
        self._groups, self._waiters, self._texts = [], [], 0
        return groups, waiters

    def _run_here(self) -> None:
        groups, waiters = self._take()
        try:
            results = self.tokenizer.encode_groups(groups)
        except Exception as exc:  # delivered to each caller, whose handler maps it
            self._deliver(waiters, exc)
        else:
            self._deliver(waiters, results)

    def _start(self, loop: asyncio.AbstractEventLoop) -> None:
        groups, waiters = self._take()
        self._jobs += 1
        job = loop.run_in_executor(self._pool, self.tokenizer.encode_groups, groups)
        job.add_done_callback(lambda done: self._finish(loop, done, waiters))

    def _finish(self, loop: asyncio.AbstractEventLoop, job: asyncio.Future[list[Encoded]],
                waiters: list[asyncio.Future[Encoded]]) -> None:
        self._jobs -= 1
        exc = job.exception()
        self._deliver(waiters, exc if exc is not None else job.result())
        if self._groups and self._jobs < self.max_jobs:
            self._start(loop)

    @staticmethod
    def _deliver(waiters: list[asyncio.Future[Encoded]], outcome: list[Encoded] | BaseException) -> None:
        for i, f in enumerate(waiters):
            if f.done():  # a cancelled caller
                continue
            if isinstance(outcome, BaseException):
                f.set_exception(outcome)
            else:
                f.set_result(outcome[i])
