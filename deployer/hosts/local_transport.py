"""Reach "this machine" (`transport = "local"`) with subprocess, with the SSH transport's semantics.

Commands start in a new session, as sshd starts them, and with the environment a login would
have rather than the controller's whole one: a local task must not see the user's
AWS_SECRET_ACCESS_KEY any more than a remote one does (`forward_env` is the way in).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import secrets
import select
import signal
import socket
import subprocess
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

from deployer.core.errors import HostError
from deployer.hosts.session import CHUNK, StreamSession
from deployer.hosts.transport import (
    CommandResult,
    OutputTooLarge,
    SessionEnded,
    render,
    short,
)

# What sshd hands a command besides its own SSH_* variables: who and where the user is, the
# search path and the locale. Everything else of the controller's environment stays here.
LOGIN_ENV = ("HOME", "USER", "LOGNAME", "PATH", "SHELL", "LANG", "LANGUAGE", "TZ", "TMPDIR")


def login_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The subset of `environ` (default os.environ) a login on this machine would start with."""
    environ = os.environ if environ is None else environ
    env = {k: v for k, v in environ.items() if k in LOGIN_ENV or k.startswith("LC_")}
    if not env.get("HOME"):  # HOME="" would make ~/x mean /x; a login has the passwd entry's
        env["HOME"] = _passwd_home()
    return env


def _passwd_home() -> str:
    return pwd.getpwuid(os.getuid()).pw_dir


def _expand_home(path: str) -> str:
    """~ and ~/x as a login would read them: an empty HOME counts as unset."""
    if path == "~" or path.startswith("~/"):
        return (os.environ.get("HOME") or _passwd_home()) + path[1:]
    return os.path.expanduser(path)


def _spawn(argv: Sequence[str], env: Mapping[str, str]) -> subprocess.Popen[bytes]:
    # new session: like a command started by sshd, and lets a timeout kill the whole group
    return subprocess.Popen(
        list(argv),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        env={**login_env(), **env},
    )


def _read_bounded(
    proc: subprocess.Popen[bytes],
    stdin: bytes,
    timeout: float | None,
    limit: int,
    argv: Sequence[str],
    host: str,
) -> tuple[bytes, bytes]:
    """communicate(), but ending the command once stdout and stderr hold over `limit` bytes
    (OutputTooLarge), before they can fill this machine's memory."""
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    feeder = threading.Thread(target=_feed_and_close, args=(proc.stdin, stdin), daemon=True)
    feeder.start()
    deadline = None if timeout is None else time.monotonic() + timeout
    got: dict[int, bytearray] = {
        proc.stdout.fileno(): bytearray(),
        proc.stderr.fileno(): bytearray(),
    }
    open_fds = set(got)
    while open_fds:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            raise subprocess.TimeoutExpired(list(argv), timeout or 0.0)
        ready, _, _ = select.select(list(open_fds), [], [], left)
        for fd in ready:
            chunk = os.read(fd, CHUNK)
            if not chunk:
                open_fds.discard(fd)
            got[fd] += chunk
        if sum(len(b) for b in got.values()) > limit:
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGKILL)
            raise OutputTooLarge(host, argv, limit)
    proc.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
    return bytes(got[proc.stdout.fileno()]), bytes(got[proc.stderr.fileno()])


def _feed_and_close(pipe: Any, data: bytes) -> None:
    with contextlib.suppress(OSError):
        pipe.write(data)
    with contextlib.suppress(OSError):
        pipe.close()


class LocalTransport:
    """Runs argv on this machine (no shell); `env` adds to the login environment (tests' knobs)."""

    def __init__(self, name: str, *, env: Mapping[str, str] | None = None) -> None:
        self.name = name
        self.env = dict(env or {})

    def run(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes = b"",
        timeout: float | None = None,
        max_output: int | None = None,
    ) -> CommandResult:
        render(argv)  # same argv validation as over SSH
        try:
            proc = _spawn(argv, self.env)
        except FileNotFoundError:
            return CommandResult(127, b"", f"{argv[0]}: not found\n".encode())
        except PermissionError:
            return CommandResult(126, b"", f"{argv[0]}: permission denied\n".encode())
        with proc:
            try:
                if max_output is None:
                    out, err = proc.communicate(stdin, timeout=timeout)
                else:
                    out, err = _read_bounded(proc, stdin, timeout, max_output, argv, self.name)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(OSError):
                    os.killpg(proc.pid, signal.SIGKILL)
                # a grandchild that left the group may hold the pipes open: don't wait for it
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.communicate(timeout=1.0)
                raise HostError(self.name, f"{short(argv)} timed out after {timeout:g} s") from None
        return CommandResult(proc.returncode, out, err)

    def put(self, data: bytes, remote_path: str, *, mode: int = 0o600) -> None:
        path = _expand_home(remote_path)
        if not os.path.isabs(path):
            raise ValueError(f"remote path must be absolute, not {remote_path!r}")
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        part = f"{path}.part-{secrets.token_hex(6)}"
        try:
            fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
            with os.fdopen(fd, "wb") as f:
                os.fchmod(f.fileno(), mode)  # the umask must not narrow the requested mode
                f.write(data)
            os.replace(part, path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(part)
            reason = os.strerror(exc.errno) if exc.errno else str(exc)
            raise HostError(self.name, f"cannot write {remote_path}: {reason}") from exc

    def open_port(self, port: int) -> socket.socket:
        try:
            sock = socket.create_connection(("127.0.0.1", port), timeout=5.0)
            sock.settimeout(None)
            return sock
        except OSError as exc:
            reason = exc.strerror or str(exc)
            raise HostError(
                self.name, f"nothing accepts connections on its port {port} ({reason})"
            ) from None

    def open_session(self, argv: Sequence[str]) -> LocalSession:
        return LocalSession(self.name, argv, self.env)

    def connect(self) -> None:
        """This machine is always reached."""

    def close(self) -> None:
        pass


class LocalSession(StreamSession):
    """A session over a child's stdin/stdout; its stderr is kept (last 64 lines) for errors."""

    def __init__(self, name: str, argv: Sequence[str], env: Mapping[str, str]) -> None:
        super().__init__(name)
        render(argv)
        self._err: deque[bytes] = deque(maxlen=64)
        try:
            self._proc = _spawn(argv, env)
        except FileNotFoundError:
            raise SessionEnded(127, f"{argv[0]}: not found\n".encode()) from None
        self._drainer = threading.Thread(target=self._drain, name="session-stderr", daemon=True)
        self._drainer.start()

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
        return os.read(fd, CHUNK) if ready else None

    def _ended(self) -> SessionEnded:
        try:
            code = self._proc.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            code = -1
        # the child's last words may still be in the pipe: read them before saying why it ended
        self._drainer.join(timeout=1.0)
        return SessionEnded(code, b"".join(self._err))

    def close(self) -> None:
        with contextlib.suppress(Exception):
            if self._proc.stdin is not None:
                self._proc.stdin.close()
        with contextlib.suppress(Exception):
            self._proc.wait(timeout=2.0)
        with contextlib.suppress(Exception):
            self._proc.kill()
