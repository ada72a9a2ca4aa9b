"""A stdlib HTTP server on 127.0.0.1 in a daemon thread, for stand-in peers that need no asyncio."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@contextlib.contextmanager
def serving(handler: type[BaseHTTPRequestHandler],
            server: type[ThreadingHTTPServer] = ThreadingHTTPServer) -> Iterator[str]:
    """Serves ``handler`` on a free port until the block ends; yields the base URL."""
    httpd = server(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
