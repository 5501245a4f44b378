"""A stand-in for the one hub call the gpupool service makes on its own: ``GET /hub/api/user`` with a token.

For tests that run the service without a JupyterHub: known tokens get their model (name, kind, scopes,
groups), any other token a 403, as the hub answers.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@contextmanager
def token_hub(callers: Mapping[str, Mapping[str, Any]]) -> Iterator[str]:
    """Serve ``callers`` (token -> the hub's model of its owner) on loopback; yields the hub API's URL."""

    class Hub(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            token = (self.headers.get("Authorization") or "").partition(" ")[2]
            model = callers.get(token) if self.path == "/hub/api/user" else None
            body = json.dumps(model or {"status": 403}).encode()
            self.send_response(200 if model else 403)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/hub/api"
    finally:
        server.shutdown()
        server.server_close()
