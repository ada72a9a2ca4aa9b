"""The load generator's aiohttp client: a ClientSession over a bounded keep-alive connector.

Heavier per request than :mod:`fleetserve.bench.fastclient`, but it speaks TLS and serves as an
independent cross-check of the fast client's numbers.
"""

from __future__ import annotations

from typing import cast

import aiohttp

from fleetserve.bench.client import CONNECT, CONNECTION, TIMEOUT, ClientConfig, RequestError
from fleetserve.bench.fastclient import USER_AGENT
from fleetserve.bench.workloads import Payload


class AiohttpClient:
    def __init__(self, config: ClientConfig) -> None:
        self._config = config
        self._session: aiohttp.ClientSession | None = None

    def prepare(self, payload: Payload) -> tuple[str, dict[str, str], bytes]:
        headers = {"User-Agent": USER_AGENT, "Content-Type": payload.content_type}
        headers.update(payload.headers)
        headers.update(self._config.headers)
        return self._config.url.rstrip("/") + payload.path, headers, payload.body

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=self._config.connections, limit_per_host=0)
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=self._config.timeout_s),
            # The generator sets exactly the headers it means to send.
            skip_auto_headers=("Accept-Encoding",),
        )

    async def send(self, prepared: object) -> int:
        assert self._session is not None, "start() first"
        url, headers, body = cast("tuple[str, dict[str, str], bytes]", prepared)
        try:
            async with self._session.post(url, data=body, headers=headers) as response:
                await response.read()
                return response.status
        except TimeoutError:
            raise RequestError(TIMEOUT, f"no response within {self._config.timeout_s} s") from None
        except aiohttp.ClientConnectorError as exc:
            raise RequestError(CONNECT, str(exc)) from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise RequestError(CONNECTION, str(exc)) from exc

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
