"""A webhook receiver for [job.notify] tests: `with Receiver(address) as hook:` serves on
`hook.url` in a thread and keeps each POSTed JSON document in `hook.received`; `status` is what
it answers (a failing receiver: 500). The address is the lab bridge's, which the hosts reach."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Receiver:
    def __init__(self, address: str = "127.0.0.1", status: int = 200) -> None:
        self.received: list[dict[str, Any]] = []
        self.status = status
        self.changed = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                size = int(self.headers.get("Content-Length") or 0)
                document = json.loads(self.rfile.read(size))
                with receiver.changed:
                    receiver.received.append(document)
                    receiver.changed.notify_all()
                self.send_response(receiver.status)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer((address, 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}/hooks/T0/SECRET-TOKEN"

    def wait_for(self, event: str, timeout: float = 60) -> dict[str, Any]:
        """The first document of `event`, once it came."""
        with self.changed:
            found = self.changed.wait_for(
                lambda: any(d.get("event") == event for d in self.received), timeout
            )
            assert found, f"no {event!r} came within {timeout:g} s: {self.received}"
            return next(d for d in self.received if d.get("event") == event)

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
