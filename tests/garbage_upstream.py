"""An "OpenAI-compatible" upstream that answers garbage, one kind per mode: what a broken proxy, a captive portal, a
crashed worker or a half-written reply looks like from the client's side. Runs in a thread on loopback.

    with GarbageUpstream() as upstream:
        upstream.mode = "html"            # every request from now on gets that answer
        OpenAIBackend(upstream.url, ...)
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODES = {
    # mode: (status, content type, body); None body: special handling below
    "html": (200, "text/html", b"<html><body>Please log in to the Wi-Fi</body></html>"),
    "not-json": (200, "application/json", b'{"choices": [{"index": 0, "message": '),
    "empty": (200, "application/json", b""),
    "json-array": (200, "application/json", b"[1, 2, 3]"),
    "no-choices": (200, "application/json", b'{"id": "x", "object": "chat.completion", "created": 1, "model": "m"}'),
    "null-choices": (200, "application/json", b'{"id": "x", "object": "chat.completion", "created": 1, "model": "m", '
                                              b'"choices": null}'),
    "wrong-types": (200, "application/json", b'{"id": 5, "object": "chat.completion", "created": "x", "model": [], '
                                             b'"choices": [{"index": "a", "message": 7, "finish_reason": 3}]}'),
    "not-utf8": (200, "application/json", b'{"choices": "\xff\xfe"}'),
    "error-html-500": (500, "text/html", b"<h1>Internal Server Error</h1>"),
    "error-garbled-400": (400, "application/json", b'{"error": '),
    "stream-garbage": (200, "text/event-stream", b"data: {not json\n\ndata: [DONE]\n\n"),
    "truncated": (200, "application/json", None),  # promises more bytes than it sends, then closes
    "hang-up": (None, None, None),  # closes the connection without a word
}
MODELS = json.dumps({"object": "list", "data": [{"id": "m", "object": "model", "created": 0, "owned_by": "x"}]})


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):  # quiet
        pass

    def do_GET(self):
        self._send(200, "application/json", MODELS.encode())

    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length") or 0))
        status, kind, body = MODES[self.server.mode]
        if status is None:
            self.close_connection = True
            self.connection.close()
            return
        if body is None:
            self.send_response(status)
            self.send_header("content-type", kind)
            self.send_header("content-length", "500")
            self.end_headers()
            self.wfile.write(b'{"id": "x", "choices": [{"ind')
            self.wfile.flush()
            self.close_connection = True
            self.connection.close()
            return
        self._send(status, kind, body)

    def _send(self, status: int, kind: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class GarbageUpstream:
    def __init__(self):
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.server.daemon_threads = True
        self.server.handle_error = lambda request, address: None  # clients hanging up on garbage is the point
        self.server.mode = "html"
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def mode(self) -> str:
        return self.server.mode

    @mode.setter
    def mode(self, value: str) -> None:
        self.server.mode = value

    def __enter__(self) -> "GarbageUpstream":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
