"""How a fleet member's process starts: a fresh interpreter, or a fork of a server that imported the replica once.

``spawn`` runs ``python -m fleetserve.fleet.child CONFIG PARENT``: every start pays the interpreter and the
imports (aiohttp, numpy, onnxruntime, gRPC: about 0.8 s of CPU on a 2-core box). ``forkserver`` uses the
standard library's fork server (:mod:`multiprocessing`, ``forkserver`` start method with
``set_forkserver_preload``): one helper process imports the replica's modules once, and each start forks it, so
a replica from a warm engine cache turns ready in about a third of a second. The autoscaler uses it because its
goal is a replica receiving traffic within 2 s of the decision (BENCHMARKS.md, autoscaling).

Either way the child reads its config from a file and nothing else (:mod:`fleetserve.fleet.child`), and is
asked to stop when its parent (the supervisor, or the fork server, which exits with the supervisor) dies.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import multiprocessing.forkserver
import os
import sys
from collections.abc import Mapping, Sequence
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Protocol

# What the fork server imports before its first fork: everything a replica imports before it loads its engine.
FORKSERVER_PRELOAD = ("fleetserve.fleet.child", "fleetserve.replica.server", "fleetserve.engine.onnxruntime",
                      "onnxruntime")


class Child(Protocol):
    """A started process, as :class:`asyncio.subprocess.Process` offers it."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...

    def send_signal(self, sig: int) -> None: ...

    def kill(self) -> None: ...

    async def wait(self) -> int: ...


class Launcher(Protocol):
    async def start(self, prefix: Sequence[str], config_file: Path, env: Mapping[str, str]) -> Child: ...


class SpawnLauncher:
    """A fresh interpreter per start (``prefix`` may put it elsewhere, e.g. ``ip netns exec NAME``)."""

    async def start(self, prefix: Sequence[str], config_file: Path, env: Mapping[str, str]) -> Child:
        return await asyncio.create_subprocess_exec(
            *prefix, sys.executable, "-m", "fleetserve.fleet.child", str(config_file), str(os.getpid()),
            stdin=asyncio.subprocess.DEVNULL, env=dict(env),
        )


class ForkedChild:
    """A fork server's child behind the :class:`Child` interface; its exit is awaited on the process sentinel
    (a pipe the kernel closes when it exits), so no thread waits on it."""

    def __init__(self, process: BaseProcess) -> None:
        self._process = process
        self._exited: asyncio.Future[int] | None = None

    @property
    def pid(self) -> int:
        assert self._process.pid is not None
        return self._process.pid

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode

    def send_signal(self, sig: int) -> None:
        if self._process.exitcode is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        if self._process.exitcode is None:
            self._process.kill()

    async def wait(self) -> int:
        if self._exited is None:
            loop = asyncio.get_running_loop()
            self._exited = loop.create_future()
            sentinel = self._process.sentinel

            def exited() -> None:
                loop.remove_reader(sentinel)
                self._process.join()
                assert self._exited is not None and self._process.exitcode is not None
                if not self._exited.done():
                    self._exited.set_result(self._process.exitcode)

            loop.add_reader(sentinel, exited)
        return await asyncio.shield(self._exited)


def run_forked(config_file: str, env: dict[str, str]) -> None:
    """The fork server child's entry: the environment a spawned child would get, then the member's main."""
    from fleetserve.fleet.child import main

    os.environ.clear()
    os.environ.update(env)
    sys.exit(main(config_file, os.getppid()))


class ForkServerLauncher:
    """Forks of one pre-imported server (:data:`FORKSERVER_PRELOAD`). ``prefix`` must be empty: a fork cannot
    enter another network namespace's command."""

    def __init__(self, preload: Sequence[str] = FORKSERVER_PRELOAD) -> None:
        self._context = multiprocessing.get_context("forkserver")
        self._context.set_forkserver_preload(list(preload))

    async def prepare(self) -> None:
        """Start the fork server now (it imports for about a second), not on the first scale-up."""
        await asyncio.to_thread(multiprocessing.forkserver.ensure_running)

    async def start(self, prefix: Sequence[str], config_file: Path, env: Mapping[str, str]) -> Child:
        if prefix:
            raise ValueError(f"a forked replica cannot run under a command prefix, got {list(prefix)}")
        process = self._context.Process(target=run_forked, args=(str(config_file), dict(env)),
                                        name=config_file.stem, daemon=False)
        await asyncio.to_thread(process.start)
        return ForkedChild(process)

