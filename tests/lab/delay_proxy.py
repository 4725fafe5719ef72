"""A user-space TCP proxy that adds a fixed delay each way (the kernel here has no netem)."""

from __future__ import annotations

import contextlib
import queue
import socket
import threading
import time


class DelayProxy:
    """Listens on 127.0.0.1 and forwards every connection to `target`, `delay` seconds late.

    Each direction has a reader that timestamps chunks and a writer that sends them once their
    time has come, so the delay adds latency without cutting throughput to one chunk per delay.
    """

    def __init__(self, target: tuple[str, int], delay: float) -> None:
        self.target = target
        self.delay = delay
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address: tuple[str, int] = self._listener.getsockname()[:2]
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()
        self._closed = False
        # Turns: how often the target answered after the client had sent something since the
        # target last spoke. Each sequential round trip is one turn whatever the machine's
        # load, which wall time divided by the delay is not (tests/integration/test_round_trips).
        self.turns = 0
        self._client_spoke: dict[socket.socket, bool] = {}
        threading.Thread(target=self._accept, name="delay-proxy", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # listener closed by stop()
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._closed:
                    client.close()
                    upstream.close()
                    return
                self._socks += [client, upstream]
                self._client_spoke[upstream] = False
            for src, dst in ((client, upstream), (upstream, client)):
                chunks: queue.Queue[tuple[float, bytes]] = queue.Queue()
                args = (src, chunks, upstream, src is upstream)
                threading.Thread(target=self._read, args=args, daemon=True).start()
                threading.Thread(target=self._write, args=(dst, chunks), daemon=True).start()

    def _read(
        self,
        src: socket.socket,
        chunks: queue.Queue[tuple[float, bytes]],
        conn: socket.socket,
        from_target: bool,
    ) -> None:
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            if data:
                with self._lock:
                    if from_target and self._client_spoke[conn]:
                        self.turns += 1
                    self._client_spoke[conn] = not from_target
            chunks.put((time.monotonic() + self.delay, data))
            if not data:
                return

    def _write(self, dst: socket.socket, chunks: queue.Queue[tuple[float, bytes]]) -> None:
        while True:
            due, data = chunks.get()
            time.sleep(max(0.0, due - time.monotonic()))
            try:
                if not data:
                    dst.shutdown(socket.SHUT_WR)  # pass the EOF on, as late as the data
                    return
                dst.sendall(data)
            except OSError:
                return

    def stop(self) -> None:
        """Close the listener and every proxied connection; idempotent."""
        with self._lock:
            self._closed = True
            socks, self._socks = self._socks, []
        self._listener.close()
        for s in socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()
