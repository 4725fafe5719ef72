"""A long-lived command on a host that answers one line per request line (the agent's `serve`).

One-shot agent calls cost the host an sshd session, a shell and a Python start with its imports
(~50 ms of CPU each: on a 2-core controller driving 32 hosts, most of `up`). A session pays that
once per connection; a request is then a single round trip on an open channel.
"""

from __future__ import annotations

import contextlib
import select
import subprocess
import threading
import time
from collections import deque
from collections.abc import Sequence

import paramiko

from deployer.errors import HostError
from deployer.transport import LocalTransport, SSHTransport, Transport, render

_WAIT_S = 0.5  # how often a waiting request re-checks its deadline and the connection
_CHUNK = 256 * 1024


class SessionEnded(Exception):
    """The command on the host exited (or never started): its exit code and stderr say why."""

    def __init__(self, exit_code: int, stderr: bytes) -> None:
        super().__init__(f"exit code {exit_code}")
        self.exit_code = exit_code
        self.stderr = stderr


class Session:
    """Send a request (a JSON line, maybe raw bytes after it), read one reply line."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.lock = threading.Lock()  # one request at a time; busy callers use a one-shot call
        self._buf = bytearray()

    def request(self, data: bytes, timeout: float | None) -> bytes:
        deadline = None if timeout is None else time.monotonic() + timeout
        self._send(data)
        while True:
            end = self._buf.find(b"\n")
            if end >= 0:
                line = bytes(self._buf[: end + 1])
                del self._buf[: end + 1]
                return line
            if deadline is not None and time.monotonic() >= deadline:
                self.close()  # its state is unknown now: never reuse it
                raise HostError(self.name, f"the agent did not answer within {timeout:g} s")
            wait = (
                _WAIT_S if deadline is None else max(0.0, min(_WAIT_S, deadline - time.monotonic()))
            )
            chunk = self._recv(wait)
            if chunk is None:
                continue
            if not chunk:
                raise self._ended()
            self._buf += chunk

    def _send(self, data: bytes) -> None:
        raise NotImplementedError

    def _recv(self, wait: float) -> bytes | None:
        """Bytes read, b"" at end of stream, None if nothing arrived within `wait` seconds."""
        raise NotImplementedError

    def _ended(self) -> SessionEnded:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class _SSHSession(Session):
    def __init__(self, transport: SSHTransport, argv: Sequence[str]) -> None:
        super().__init__(transport.name)
        self._owner = transport
        self._argv = list(argv)
        conn = transport._transport()
        try:
            self._chan = conn.open_session(timeout=transport.target.connect_timeout)
            self._chan.exec_command(render(argv).encode("utf-8", "surrogateescape"))
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise self._lost(exc) from exc

    def _lost(self, exc: BaseException | None) -> HostError:
        why = f" ({exc})" if exc is not None and str(exc) else ""
        return HostError(
            self.name,
            f"connection lost while talking to the tfdeploy agent{why}",
            hint="the host or the network to it went away; check it and retry",
        )

    def _send(self, data: bytes) -> None:
        try:
            self._chan.sendall(data)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            if self._chan.exit_status_ready():
                raise self._ended() from exc
            raise self._lost(exc) from exc

    def _recv(self, wait: float) -> bytes | None:
        chan = self._chan
        if not chan.recv_ready() and not (chan.eof_received or chan.closed):
            select.select([chan.fileno()], [], [], wait)
        if chan.recv_ready():
            return bytes(chan.recv(_CHUNK))
        if chan.eof_received or chan.closed:
            return b""
        if chan.transport is None or not chan.transport.is_active():
            raise self._lost(None)
        return None

    def _ended(self) -> SessionEnded:
        chan = self._chan
        if not chan.status_event.wait(2.0) and (
            chan.transport is None or not chan.transport.is_active()
        ):
            raise self._lost(None)
        err = bytearray()
        while chan.recv_stderr_ready():
            err += chan.recv_stderr(_CHUNK)
        return SessionEnded(chan.exit_status, bytes(err))

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._chan.close()


class _LocalSession(Session):
    def __init__(self, transport: LocalTransport, argv: Sequence[str]) -> None:
        super().__init__(transport.name)
        render(argv)
        self._err: deque[bytes] = deque(maxlen=64)
        try:
            self._proc = subprocess.Popen(
                list(argv),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except FileNotFoundError:
            raise SessionEnded(127, f"{argv[0]}: not found\n".encode()) from None
        threading.Thread(target=self._drain, name="session-stderr", daemon=True).start()

    def _drain(self) -> None:
        assert self._proc.stderr is not None
        for line in self._proc.stderr:
            self._err.append(line)

    def _send(self, data: bytes) -> None:
        assert self._proc.stdin is not None
        try:
            self._proc.stdin.write(data)
            self._proc.stdin.flush()
        except BrokenPipeError:
            raise self._ended() from None

    def _recv(self, wait: float) -> bytes | None:
        assert self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        ready, _, _ = select.select([fd], [], [], wait)
        if not ready:
            return None
        import os

        return os.read(fd, _CHUNK)

    def _ended(self) -> SessionEnded:
        try:
            code = self._proc.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            code = -1
        return SessionEnded(code, b"".join(self._err))

    def close(self) -> None:
        with contextlib.suppress(Exception):
            if self._proc.stdin is not None:
                self._proc.stdin.close()
        with contextlib.suppress(Exception):
            self._proc.wait(timeout=2.0)
        with contextlib.suppress(Exception):
            self._proc.kill()


def open_session(transport: Transport, argv: Sequence[str]) -> Session | None:
    """A session over this transport, or None when it cannot hold one (then use one-shot runs)."""
    if isinstance(transport, SSHTransport):
        return _SSHSession(transport, argv)
    if isinstance(transport, LocalTransport):
        return _LocalSession(transport, argv)
    return None
