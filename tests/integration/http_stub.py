"""An in-process HTTP stub for tests of the bench scripts' ``--url`` modes (no SGLang server)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class JsonHandler(BaseHTTPRequestHandler):
    """Request handler base: quiet, and ``send_json(code, payload)`` (a dict/list, or raw bytes)."""

    def log_message(self, *args):
        pass

    def send_json(self, code, payload):
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def read_json(self):
        return json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")


def start(handler_cls):
    """Serve ``handler_cls`` on a free local port in a daemon thread; returns ``(server, base_url)``.
    Stop it with ``server.shutdown()``."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler_cls)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"
