"""What tfdeploy needs from a way of reaching a host: the interface, and nothing behind it.

A transport runs an argv, writes a file and opens a request/reply session; `ssh_transport.py`
and `local_transport.py` implement it, `tests/support/fakehost.py` scripts it. Nothing here
imports paramiko, so code that only plans or renders never loads an SSH stack.
"""

from __future__ import annotations

import shlex
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from deployer.core.errors import HostError


@dataclass(frozen=True)
class CommandResult:
    exit_code: int
    stdout: bytes
    stderr: bytes


class OutputTooLarge(HostError):
    """A command printed more than its caller's `max_output`: it was ended unread."""

    def __init__(self, host: str, argv: Sequence[str], limit: int) -> None:
        super().__init__(host, f"`{argv[0]}` printed more than {limit} bytes; it was ended")
        self.limit = limit


class SessionEnded(Exception):
    """The command on the host exited (or never started): its exit code and stderr say why."""

    def __init__(self, exit_code: int, stderr: bytes) -> None:
        super().__init__(f"exit code {exit_code}")
        self.exit_code = exit_code
        self.stderr = stderr


class Session(Protocol):
    """A long-lived command on a host that answers one line per request line (`agent serve`).

    A one-shot call costs the host an sshd session and a Python start (~50 ms of CPU); a session
    pays that once per connection. Callers hold `lock` for one request at a time.
    """

    name: str
    lock: threading.Lock

    def request(self, data: bytes, timeout: float | None, body: Iterable[bytes] = ()) -> bytes:
        """Send `data` and then `body` piece by piece, return the reply line; SessionEnded if
        the command exited."""
        ...

    def send(self, data: bytes) -> None:
        """A request sent without waiting: pipelined, its reply read later by `reply`."""
        ...

    def reply(self, timeout: float | None) -> bytes:
        """The next reply line, in the order the requests were sent."""
        ...

    def read_raw(self, size: int, sink: Callable[[bytes], None], timeout: float | None) -> None:
        """The `size` raw bytes after the last reply line, to `sink` as they arrive."""
        ...

    def close(self) -> None: ...


class Stream(Protocol):
    """A byte stream to a TCP port on the host (a socket, or an SSH direct-tcpip channel)."""

    def recv(self, size: int) -> bytes: ...

    def sendall(self, data: bytes) -> None: ...

    def fileno(self) -> int: ...

    def shutdown(self, how: int) -> None:
        """socket.SHUT_WR: no more to send (the peer reads an end), still receiving."""
        ...

    def close(self) -> None: ...


class Transport(Protocol):
    """Run argv lists, write files and hold sessions on one host; safe to share between threads.

    Failures to reach the host raise errors.HostError naming the host and the cause.
    """

    name: str

    def connect(self) -> None:
        """Reaches the host now (every other call connects on first use): how a caller waits
        for a new machine to answer. HostError when it cannot (a refused key among them)."""
        ...

    def run(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes = b"",
        timeout: float | None = None,
        max_output: int | None = None,
    ) -> CommandResult:
        """`max_output`: the bytes of stdout and stderr together that are kept at most; past
        them the command is ended and OutputTooLarge raised (a host's command is untrusted:
        what it prints must not fill this machine's memory before anyone looks at it)."""
        ...

    def put(self, data: bytes, remote_path: str, *, mode: int = 0o600) -> None: ...

    def open_session(self, argv: Sequence[str]) -> Session: ...

    def open_port(self, port: int) -> Stream:
        """A connection to `port` on the host's loopback, made from the host (a tunnel)."""
        ...

    def close(self) -> None: ...


def render(argv: Sequence[str]) -> str:
    """Quote argv for the remote shell: the one place tfdeploy turns a command into a string."""
    if not argv:
        raise ValueError("argv must not be empty")
    if any("\0" in arg for arg in argv):
        raise ValueError("argv must not contain NUL bytes")
    return shlex.join(argv)


def short(argv: Sequence[str]) -> str:
    """argv for a message: quoted, cut to 80 characters."""
    text = shlex.join(argv)
    return text if len(text) <= 80 else text[:77] + "..."
