"""The SSH transport: one paramiko connection per host, shared by runs, puts and sessions.

Connecting (ssh_config, jump chains, keys, readable errors) lives in `ssh.py`; this module moves
commands, files and session bytes over the connection it opens.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import secrets
import select
import threading
import time
from collections.abc import Sequence

import paramiko

from deployer.core.errors import HostError
from deployer.hosts import paramiko_tuning, ssh
from deployer.hosts.session import CHUNK, StreamSession, wait_s
from deployer.hosts.transport import (
    CommandResult,
    OutputTooLarge,
    SessionEnded,
    render,
    short,
)


class SessionRefused(HostError):
    """sshd refused to open another session on a live connection: the connection has as many
    as its MaxSessions allows (OpenSSH's default is 10). Another connection may be given one."""

    def __init__(self, host: str, exc: paramiko.SSHException) -> None:
        why = exc.text if isinstance(exc, paramiko.ChannelException) else str(exc)
        super().__init__(
            host,
            f"the SSH server refused another session on its connection ({why}: its "
            "MaxSessions is reached)",
            hint="raise MaxSessions in the host's sshd_config, or run fewer commands at once",
        )


def refused(transport: paramiko.Transport, exc: paramiko.SSHException) -> bool:
    """Whether a failed channel open was the server's no (not a lost connection, not a
    timeout). paramiko keeps one saved exception per connection: of two opens refused at
    once, one gets the ChannelException and the other a bare "Unable to open channel." while
    the connection lives on (seen with MaxSessions 2 and 16 sessions opened at once)."""
    if isinstance(exc, paramiko.ChannelException):
        return True
    return transport.is_active() and str(exc) != "Timeout opening channel."


# Stdin up to this size fits in the server's initial channel window, so it is sent inline;
# larger stdin is sent from a helper thread so a command that writes before it reads can't
# deadlock against us.
_INLINE_STDIN = 256 * 1024


class SSHTransport:
    """One SSH connection per host, shared by every run and put (paramiko multiplexes channels)."""

    def __init__(self, endpoint: ssh.Endpoint) -> None:
        self.name = endpoint.name
        self.target = endpoint
        self._lock = threading.Lock()  # guards connect/close and the hop list
        self._hops: list[ssh.Hop] = []
        self._sessions = threading.BoundedSemaphore(ssh.MAX_EXEC_SESSIONS)
        self._sftp_lock = threading.Lock()
        self._sftp: paramiko.SFTPClient | None = None

    def connect(self) -> None:
        self._transport()

    def connection(self) -> paramiko.Transport:
        """The live connection, connecting first; raises HostError."""
        return self._transport()

    def session_channel(self) -> paramiko.Channel:
        """A new session channel on this host's connection, connecting first. SessionRefused
        when sshd refuses another session on it (its MaxSessions), a HostError when it cannot
        connect; paramiko's own errors when the connection is lost meanwhile."""
        transport = self._transport()
        try:
            return transport.open_session(timeout=self.target.settings.connect_timeout)
        except paramiko.SSHException as exc:
            if refused(transport, exc):
                raise SessionRefused(self.name, exc) from exc
            raise

    def open_session(self, argv: Sequence[str]) -> SSHSession:
        """Start argv on its own channel of this connection, for request/reply traffic."""
        try:
            chan = self.session_channel()
            paramiko_tuning.keep_pieces(chan)
            chan.exec_command(render(argv).encode("utf-8", "surrogateescape"))
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise _session_lost(self.name, exc) from exc
        return SSHSession(self.name, chan)

    def open_port(self, port: int) -> paramiko.Channel:
        """direct-tcpip through the SSH connection (jump hosts included): the host connects to
        its own 127.0.0.1:port, so nothing is opened in its firewall."""
        transport = self._transport()
        try:
            return transport.open_channel(
                "direct-tcpip",
                ("127.0.0.1", port),
                ("127.0.0.1", 0),
                timeout=self.target.settings.connect_timeout,
            )
        except paramiko.ChannelException as exc:
            raise HostError(
                self.name, f"nothing accepts connections on its port {port} ({exc})"
            ) from None
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise self._lost(["tunnel", str(port)], exc) from exc

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
        transport = self._hops[-1].client.get_transport()
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
            hop.client.close()
        self._hops = []

    def run(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes = b"",
        timeout: float | None = None,
        max_output: int | None = None,
    ) -> CommandResult:
        command = render(argv)
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._sessions:
            try:
                chan = self.session_channel()
            except (paramiko.SSHException, OSError, EOFError) as exc:
                raise self._lost(argv, exc) from exc
            try:
                return self._exec(chan, command, argv, stdin, deadline, timeout, max_output)
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
        max_output: int | None = None,
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
                out += chan.recv(ssh.CHANNEL_WINDOW)
            while chan.recv_stderr_ready():
                err += chan.recv_stderr(CHUNK)
            if max_output is not None and len(out) + len(err) > max_output:
                raise OutputTooLarge(self.name, argv, max_output)  # the caller closes chan
            if done:
                break
            self._check_deadline(argv, deadline, timeout)
            select.select([fd], [], [], wait_s(deadline))
        while not chan.status_event.wait(wait_s(deadline)):
            self._check_deadline(argv, deadline, timeout)
        if writer is not None:
            writer.join(timeout=1)
        code = chan.exit_status
        if code == NO_EXIT_STATUS and _connection_gone(chan):
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
            raise HostError(self.name, f"{short(argv)} timed out after {timeout:g} s")

    def _lost(self, argv: Sequence[str], exc: BaseException | None) -> HostError:
        why = f" ({exc})" if exc is not None and str(exc) else ""
        return HostError(
            self.name,
            f"connection lost while running {short(argv)}{why}",
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


class SSHSession(StreamSession):
    """A session over one exec channel of the host's connection."""

    def __init__(self, name: str, chan: paramiko.Channel) -> None:
        super().__init__(name)
        self._chan = chan

    def _lost(self, exc: BaseException | None) -> HostError:
        return _session_lost(self.name, exc)

    def _send(self, data: bytes) -> None:
        try:
            # A memoryview: paramiko's sendall slices off what each packet took, which on a
            # bytes object copies the rest every time (quadratic in the size of `data`).
            self._chan.sendall(memoryview(data))
        except (paramiko.SSHException, OSError, EOFError) as exc:
            if self._chan.exit_status_ready():
                raise self._ended() from exc
            raise self._lost(exc) from exc

    def _recv(self, wait: float) -> bytes | None:
        chan = self._chan
        # A timed recv waits on paramiko's own condition: no fileno(), whose pipe paramiko
        # would then write and read once per packet for as long as the channel lives.
        # One packet's payload a read, as it came (paramiko_tuning.keep_pieces: no copy).
        chan.settimeout(max(wait, 0.001))
        try:
            data = chan.recv(ssh.CHANNEL_WINDOW)
        except TimeoutError:
            if chan.transport is None or not chan.transport.is_active():
                raise self._lost(None) from None
            return None
        return bytes(data)  # b"": the command's end, or the connection's (_ended tells which)

    def _ended(self) -> SessionEnded:
        chan = self._chan
        if not chan.status_event.wait(2.0) and (
            chan.transport is None or not chan.transport.is_active()
        ):
            raise self._lost(None)
        if chan.exit_status == NO_EXIT_STATUS and _connection_gone(chan):
            raise self._lost(None)  # a cut link, never "the agent failed: exit code -1"
        err = bytearray()
        while chan.recv_stderr_ready():
            err += chan.recv_stderr(CHUNK)
        return SessionEnded(chan.exit_status, bytes(err))

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._chan.close()


# paramiko's exit_status while no exit-status message came: the channel was closed because the
# connection was (a cut link, a killed sshd), or sshd reported a signal (exit-signal, which
# paramiko does not record).
NO_EXIT_STATUS = -1
# paramiko's transport thread closes every channel first and marks itself inactive after: a
# channel closed by a lost connection can be seen before the connection is seen as lost.
CONNECTION_SETTLE_S = 1.0


def _connection_gone(chan: paramiko.Channel) -> bool:
    """Whether the channel's connection is lost (waits out the thread's close-then-mark race)."""
    deadline = time.monotonic() + CONNECTION_SETTLE_S
    while chan.transport is not None and chan.transport.is_active():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True


def _session_lost(name: str, exc: BaseException | None) -> HostError:
    why = f" ({exc})" if exc is not None and str(exc) else ""
    return HostError(
        name,
        f"connection lost while talking to the tfdeploy agent{why}",
        hint="the host or the network to it went away; check it and retry",
    )
