"""An EC2 instance metadata service (IMDSv2) STAND-IN, just enough for spot interruption notices.

Tests never reach the real 169.254.169.254: a task's `spot.url` points here instead. Like IMDSv2
it hands out session tokens on `PUT /latest/api/token` (the TTL header is required) and answers
GETs only with a valid `X-aws-ec2-metadata-token` (401 otherwise). `/latest/meta-data/spot/
instance-action` is 404 until `notice()` switches a notice on.

The address is a parameter: in-process tests use loopback, lab tests bind a lab bridge address
the hosts can reach.
"""

from __future__ import annotations

import json
import secrets
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

TOKEN_PATH = "/latest/api/token"
ACTION_PATH = "/latest/meta-data/spot/instance-action"
TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"
TOKEN_HEADER = "X-aws-ec2-metadata-token"


class Imds:
    """`with Imds() as imds:` serves on `imds.url` in a thread; `requests` lists what came."""

    def __init__(self, address: str = "127.0.0.1", port: int = 0) -> None:
        self.address, self.port = address, port
        self.requests: list[tuple[str, str]] = []  # (method, path), in order
        self.answers: list[tuple[str, str, int]] = []  # (method, path, status)
        self.tokens: set[str] = set()
        self.action: dict[str, str] | None = None
        self.only: str | None = None  # the one client address a notice is for (None: all)
        self.once = False  # the notice is withdrawn once it was served
        self.served: list[float] = []  # when each notice was served (Unix time)
        self.lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"http://{host}:{self.port}"

    def start(self) -> Imds:
        server_class = _Server6 if ":" in self.address else ThreadingHTTPServer
        server = server_class((self.address, self.port), _handler(self))
        server.daemon_threads = True
        self._server, self.port = server, server.server_address[1]
        self._thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(5)

    def __enter__(self) -> Imds:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def notice(
        self,
        action: str = "terminate",
        seconds_from_now: float = 120,
        *,
        only: str | None = None,
        once: bool = False,
    ) -> float:
        """Switches a notice on, for the client at address `only` if given (each instance has
        its own metadata service: one stand-in serves several lab hosts); returns its time in
        Unix seconds (whole seconds, as AWS gives). `once`: withdrawn after it was served once,
        as for a machine that stays (a later attempt there gets no notice)."""
        at = int(time.time() + seconds_from_now)
        text = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))
        with self.lock:
            self.action, self.only, self.once = {"action": action, "time": text}, only, once
        return float(at)

    def clear(self) -> None:
        with self.lock:
            self.action = None

    def revoke_tokens(self) -> None:
        """Every token issued so far stops working (as when its TTL runs out)."""
        with self.lock:
            self.tokens.clear()

    def count(self, method: str, path: str) -> int:
        with self.lock:
            return self.requests.count((method, path))

    def answer(self, method: str, path: str, headers: Any, client: str = "") -> tuple[int, bytes]:
        """(status, body) for one request, recorded."""
        with self.lock:
            self.requests.append((method, path))
            status, body = self._answer(method, path, headers, client)
            self.answers.append((method, path, status))
        return status, body

    def _answer(self, method: str, path: str, headers: Any, client: str) -> tuple[int, bytes]:
        if method == "PUT":
            if path != TOKEN_PATH:
                return 405, b""
            ttl = headers.get(TTL_HEADER, "")
            if not ttl.isdigit() or not 1 <= int(ttl) <= 21600:
                return 400, b""
            token = secrets.token_urlsafe(32)
            self.tokens.add(token)
            return 200, token.encode()
        if headers.get(TOKEN_HEADER) not in self.tokens:
            return 401, b""
        noticed = self.action is not None and self.only in (None, client)
        if path == ACTION_PATH and noticed:
            body = json.dumps(self.action).encode()
            self.served.append(time.time())
            if self.once:
                self.action = None
            return 200, body
        return 404, b""


class _Server6(ThreadingHTTPServer):
    address_family = socket.AF_INET6


def _handler(imds: Imds) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_PUT(self) -> None:
            self._reply("PUT")

        def do_GET(self) -> None:
            self._reply("GET")

        def _reply(self, method: str) -> None:
            status, body = imds.answer(method, self.path, self.headers, self.client_address[0])
            self.send_response(status)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # tests read `requests`, not stderr

    return Handler
