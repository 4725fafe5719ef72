"""How tfdeploy reaches a host: run an argv and put a file, over SSH or on this machine."""

from __future__ import annotations

import contextlib
import os
import posixpath
import secrets
import select
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import paramiko

from deployer import ssh
from deployer.errors import HostError

# Stdin up to this size fits in the server's initial channel window, so it is sent inline;
# larger stdin is sent from a helper thread so a command that writes before it reads can't
# deadlock against us.
_INLINE_STDIN = 256 * 1024
_READ_CHUNK = 256 * 1024
_POLL_S = 0.5  # how often a waiting run re-checks its deadline and the connection


@dataclass(frozen=True)
class SSHTarget:
    """Where and how to reach one host over SSH; explicit fields win over ssh_config."""

    name: str
    address: str
    port: int = 22  # 22 lets an ssh_config Port apply
    user: str | None = None
    identity: str | None = None
    jump: str | None = None
    host_keys: str = "strict"
    known_hosts: str | None = None
    connect_timeout: float = 10.0
    ssh_config: str | None = None


@dataclass(frozen=True)
class CommandResult:
    exit_code: int
    stdout: bytes
    stderr: bytes


class Transport(Protocol):
    """Run argv lists and write files on one host; safe to share between threads."""

    name: str

    def run(
        self, argv: Sequence[str], *, stdin: bytes = b"", timeout: float | None = None
    ) -> CommandResult: ...

    def put(self, data: bytes, remote_path: str, *, mode: int = 0o600) -> None: ...

    def close(self) -> None: ...


def open_transport(target: SSHTarget, *, local: bool = False) -> Transport:
    """The transport for a host: local for `transport = "local"` hosts, else SSH (not connected)."""
    return LocalTransport(target.name) if local else SSHTransport(target)


def render(argv: Sequence[str]) -> str:
    """Quote argv for the remote shell: the one place tfdeploy turns a command into a string."""
    if not argv:
        raise ValueError("argv must not be empty")
    if any("\0" in arg for arg in argv):
        raise ValueError("argv must not contain NUL bytes")
    return shlex.join(argv)


def _short(argv: Sequence[str]) -> str:
    text = shlex.join(argv)
    return text if len(text) <= 80 else text[:77] + "..."


class SSHTransport:
    """One SSH connection per host, shared by every run and put (paramiko multiplexes channels)."""

    def __init__(self, target: SSHTarget) -> None:
        self.name = target.name
        self.target = target
        self._lock = threading.Lock()  # guards connect/close and the hop list
        self._hops: list[ssh.Hop] = []
        self._sessions = threading.BoundedSemaphore(ssh.MAX_EXEC_SESSIONS)
        self._sftp_lock = threading.Lock()
        self._sftp: paramiko.SFTPClient | None = None

    def connect(self) -> None:
        self._transport()

    def _transport(self) -> paramiko.Transport:
        """The live connection, (re)connecting first if there is none; raises HostError."""
        with self._lock:
            live = self._live()
            if live is not None:
                return live
            self._close_hops()
            hops = ssh.plan_hops(self.target)
            ssh.open_hops(self.target, hops)
            self._hops = hops
            live = self._live()
            assert live is not None
            return live

    def _live(self) -> paramiko.Transport | None:
        if not self._hops:
            return None
        transport = self._hops[-1].conn.client.get_transport()
        return transport if transport is not None and transport.is_active() else None

    def close(self) -> None:
        with self._lock:
            self._close_hops()

    def _close_hops(self) -> None:
        with self._sftp_lock:
            if self._sftp is not None:
                self._sftp.close()
                self._sftp = None
        for hop in reversed(self._hops):  # target first, then the jump hosts it rode through
            hop.conn.client.close()
            hop.conn.transport = None
        self._hops = []

    def run(
        self, argv: Sequence[str], *, stdin: bytes = b"", timeout: float | None = None
    ) -> CommandResult:
        command = render(argv)
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._sessions:
            transport = self._transport()
            try:
                chan = transport.open_session(timeout=self.target.connect_timeout)
            except (paramiko.SSHException, OSError, EOFError) as exc:
                raise self._lost(argv, exc) from exc
            try:
                return self._exec(chan, command, argv, stdin, deadline, timeout)
            finally:
                chan.close()

    def _exec(
        self,
        chan: paramiko.Channel,
        command: str,
        argv: Sequence[str],
        stdin: bytes,
        deadline: float | None,
        timeout: float | None,
    ) -> CommandResult:
        try:
            # surrogateescape: argv from os.fsdecode() keeps its original bytes
            chan.exec_command(command.encode("utf-8", "surrogateescape"))
            writer = self._feed(chan, stdin)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise self._lost(argv, exc) from exc
        out, err = bytearray(), bytearray()
        fd = chan.fileno()  # a pipe paramiko marks readable when stdout/stderr data or EOF arrive
        while True:
            done = chan.eof_received or chan.closed  # read before draining: no data is lost
            while chan.recv_ready():
                out += chan.recv(_READ_CHUNK)
            while chan.recv_stderr_ready():
                err += chan.recv_stderr(_READ_CHUNK)
            if done:
                break
            self._check_deadline(argv, deadline, timeout)
            select.select([fd], [], [], _wait(deadline))
        while not chan.status_event.wait(_wait(deadline)):
            self._check_deadline(argv, deadline, timeout)
        if writer is not None:
            writer.join(timeout=1)
        code = chan.exit_status
        if code == -1 and (chan.transport is None or not chan.transport.is_active()):
            raise self._lost(argv, None)
        return CommandResult(code, bytes(out), bytes(err))

    @staticmethod
    def _feed(chan: paramiko.Channel, stdin: bytes) -> threading.Thread | None:
        if len(stdin) <= _INLINE_STDIN:
            if stdin:
                chan.sendall(stdin)
            chan.shutdown_write()
            return None

        def feed() -> None:
            try:
                chan.sendall(stdin)
                chan.shutdown_write()
            except (OSError, EOFError, paramiko.SSHException):
                pass  # the reader reports the lost connection or the timeout

        writer = threading.Thread(target=feed, name="ssh-stdin", daemon=True)
        writer.start()
        return writer

    def _check_deadline(
        self, argv: Sequence[str], deadline: float | None, timeout: float | None
    ) -> None:
        if deadline is not None and time.monotonic() >= deadline:
            raise HostError(self.name, f"{_short(argv)} timed out after {timeout:g} s")

    def _lost(self, argv: Sequence[str], exc: BaseException | None) -> HostError:
        why = f" ({exc})" if exc is not None and str(exc) else ""
        return HostError(
            self.name,
            f"connection lost while running {_short(argv)}{why}",
            hint="the host or the network to it went away; check it and retry",
        )

    def put(self, data: bytes, remote_path: str, *, mode: int = 0o600) -> None:
        # Connect before taking the SFTP lock: connect/close take the locks in the other order.
        transport = self._transport()
        with self._sftp_lock:
            try:
                sftp = self._sftp_client(transport)
                path = self._absolute(sftp, remote_path)
                self._makedirs(sftp, posixpath.dirname(path))
                part = f"{path}.part-{secrets.token_hex(6)}"
                try:
                    with sftp.open(part, "wb") as f:
                        f.chmod(mode)  # before any byte lands, so a secret is never world-readable
                        f.set_pipelined(True)
                        f.write(data)
                    sftp.posix_rename(part, path)
                except BaseException:
                    with contextlib.suppress(OSError, paramiko.SSHException, EOFError):
                        sftp.remove(part)
                    raise
            except OSError as exc:
                if exc.errno is None:  # paramiko's socket-level failures carry no errno
                    raise self._lost(["put", remote_path], exc) from exc
                raise HostError(
                    self.name, f"cannot write {remote_path}: {os.strerror(exc.errno)}"
                ) from exc
            except (paramiko.SSHException, EOFError) as exc:
                raise self._lost(["put", remote_path], exc) from exc

    def _sftp_client(self, transport: paramiko.Transport) -> paramiko.SFTPClient:
        if self._sftp is None or self._sftp.sock.closed:
            sftp = paramiko.SFTPClient.from_transport(transport)
            if sftp is None:
                raise HostError(self.name, "the SFTP subsystem is not available")
            self._sftp = sftp
        return self._sftp

    @staticmethod
    def _absolute(sftp: paramiko.SFTPClient, path: str) -> str:
        if path == "~" or path.startswith("~/"):
            return posixpath.join(sftp.normalize("."), path[2:])
        if not path.startswith("/"):
            raise ValueError(f"remote path must be absolute, not {path!r}")
        return path

    def _makedirs(self, sftp: paramiko.SFTPClient, path: str) -> None:
        try:
            sftp.stat(path)
            return
        except FileNotFoundError:
            pass
        self._makedirs(sftp, posixpath.dirname(path))
        try:
            sftp.mkdir(path, 0o700)  # private by default; the agent loosens what needs it
        except OSError:
            sftp.stat(path)  # created meanwhile by another process is fine


def _wait(deadline: float | None) -> float:
    if deadline is None:
        return _POLL_S
    return max(0.0, min(_POLL_S, deadline - time.monotonic()))


class LocalTransport:
    """Runs argv on this machine with subprocess (no shell), with SSHTransport's semantics."""

    def __init__(self, name: str) -> None:
        self.name = name

    def run(
        self, argv: Sequence[str], *, stdin: bytes = b"", timeout: float | None = None
    ) -> CommandResult:
        render(argv)  # same argv validation as over SSH
        try:
            # new session: like a command started by sshd, and lets a timeout kill the whole group
            proc = subprocess.Popen(
                list(argv),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except FileNotFoundError:
            return CommandResult(127, b"", f"{argv[0]}: not found\n".encode())
        except PermissionError:
            return CommandResult(126, b"", f"{argv[0]}: permission denied\n".encode())
        with proc:
            try:
                out, err = proc.communicate(stdin, timeout=timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(OSError):
                    os.killpg(proc.pid, signal.SIGKILL)
                # a grandchild that left the group may hold the pipes open: don't wait for it
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.communicate(timeout=1.0)
                raise HostError(
                    self.name, f"{_short(argv)} timed out after {timeout:g} s"
                ) from None
        return CommandResult(proc.returncode, out, err)

    def put(self, data: bytes, remote_path: str, *, mode: int = 0o600) -> None:
        path = os.path.expanduser(remote_path)
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

    def close(self) -> None:
        pass


__all__ = [
    "CommandResult",
    "LocalTransport",
    "SSHTarget",
    "SSHTransport",
    "Transport",
    "open_transport",
]
