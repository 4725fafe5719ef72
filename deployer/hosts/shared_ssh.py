"""One SSH server's connections shared by many callers: their commands and sessions are channels
on one connection, as many as the server's MaxSessions allows, and on another connection only
past that.

A Slurm run reaches every node as job steps launched on the login node (step_transport.py).
With one connection per node, as any SSH host has, a run opened N + 2 connections to a login
node that hundreds of users share (the nodes' steps, the lease keeper, the cluster's commands):
at 64 nodes, 66 handshakes against OpenSSH's default MaxStartups 10:30:100, which drops
handshakes at random past 10 in flight. Here each caller (a node, the keeper, the cluster) gets
a `view`: an SSHTransport named after it, whose every channel is taken from the shared
connections and whose `close` closes only its own channels.

The rule for a new channel: the first connection with fewer than its limit open, its limit
being MAX_SESSIONS (OpenSSH's default MaxSessions) until the server refuses one; a connection
on which the server refused a channel with k others open has the limit k from then on (it is
the server's MaxSessions, or a close sshd had not processed yet). When every connection is at
its limit, a new connection is opened, with the largest such k seen as its limit (MaxSessions
is the server's, the same for every connection). A channel the server refuses is opened on
the next connection (or a new one) instead of failing. sshd frees a session only once both
sides' closes crossed, so a connection whose channels were all just closed may refuse one more
for a moment (seen at the end of a 16-node run, MaxSessions 10: every node's session closed,
then `scancel` refused): that refusal is waited out on the same connection (SETTLE_S at most),
not taken for a full one. Only a new connection refusing its first session fails: the server
takes none. Tunnels (direct-tcpip) are no sessions and ride on the first connection.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import paramiko

from deployer.core.errors import HostError
from deployer.hosts import ssh
from deployer.hosts.ssh_transport import SessionRefused, SSHTransport
from deployer.hosts.step_transport import put_with_shell

# OpenSSH's default MaxSessions: the session channels tried on one connection before another is
# opened. A server that allows more still gets 10 a connection; one that allows fewer refuses
# one earlier, and that connection's limit (and every later one's) drops to what it took.
MAX_SESSIONS = 10
# How long a connection with nothing open is asked again after refusing a session (the closes
# sshd has not processed yet), the pause doubling from SETTLE_FIRST_S.
SETTLE_S = 2.0
SETTLE_FIRST_S = 0.02


@dataclass
class _Lane:
    """One connection of the pool and the channels it carries."""

    connection: SSHTransport
    limit: int
    opening: int = 0  # channels being opened on it now
    opened: int = 0  # channels it ever opened: a new connection's first refusal is final
    channels: list[paramiko.Channel] = field(default_factory=list)

    def in_use(self) -> int:
        """Its channels the server may still count: opening, or not closed yet."""
        self.channels = [c for c in self.channels if not c.closed]
        return self.opening + len(self.channels)


class SharedSSH:
    """The connections to one SSH server (`endpoint`) that every view shares. Thread-safe;
    `close` ends them all, and with them every view's channels."""

    def __init__(
        self,
        endpoint: ssh.Endpoint,
        *,
        max_sessions: int = MAX_SESSIONS,
        connect: Callable[[ssh.Endpoint], SSHTransport] = SSHTransport,
    ) -> None:
        # connect: how one connection is made (its own hops, reconnecting when it died); tests
        # pass a scripted server's here.
        self.endpoint = endpoint
        self.max_sessions = max_sessions
        self._connect = connect
        self._lock = threading.Lock()
        self._lanes: list[_Lane] = []
        self._learned = 0  # the most channels a connection carried when one more was refused
        self._closed = False

    def view(self, name: str) -> SharedView:
        """A transport for one caller, named `name` in its errors (a node's, the keeper's)."""
        return SharedView(self, name)

    @property
    def connections(self) -> int:
        """How many connections the pool has opened and not closed (each lane's is one)."""
        with self._lock:
            return len(self._lanes)

    def session_channel(self) -> paramiko.Channel:
        """A new session channel on the first connection with room; a refused one is asked of
        the next connection, or of a new one (the module's rule)."""
        pause = SETTLE_FIRST_S
        waited = 0.0
        while True:
            lane = self._reserve()
            try:
                chan = lane.connection.session_channel()
            except SessionRefused as refused:
                if self._full(lane, refused, settled=waited >= SETTLE_S):
                    continue
                time.sleep(pause)  # its closes are on their way: the same connection again
                waited += pause
                pause *= 2
                continue
            except BaseException:
                with self._lock:
                    lane.opening -= 1
                raise
            with self._lock:
                lane.opening -= 1
                lane.opened += 1
                lane.channels.append(chan)
                if self._closed:  # closed meanwhile: nothing may outlive close()
                    chan.close()
                    raise self._gone()
            return chan

    def connection(self) -> paramiko.Transport:
        """The first connection (connected first), for what is no session: a tunnel."""
        with self._lock:
            if self._closed:
                raise self._gone()
            if not self._lanes:
                self._lanes.append(self._lane())
            first = self._lanes[0].connection
        return first.connection()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            lanes, self._lanes = self._lanes, []
        for lane in lanes:
            with contextlib.suppress(Exception):
                lane.connection.close()

    def _reserve(self) -> _Lane:
        with self._lock:
            if self._closed:
                raise self._gone()
            lane = next((x for x in self._lanes if x.in_use() < x.limit), None)
            if lane is None:
                lane = self._lane()
                self._lanes.append(lane)
            lane.opening += 1
            return lane

    def _full(self, lane: _Lane, refused: SessionRefused, *, settled: bool) -> bool:
        """The server refused a channel on `lane`. True: the lane is full at what it carries
        (its limit from now on; the next try goes elsewhere). False: nothing is open on it,
        so the refusal counts closes the server had not processed yet: ask it again after a
        pause. Raises it where it is the answer: a new connection's first session, or one
        refused past SETTLE_S."""
        with self._lock:
            lane.opening -= 1
            others = lane.in_use()
            if others > 0:
                lane.limit = min(lane.limit, others)
                self._learned = max(self._learned, others)
                return True
            if lane.opened == 0 or settled:
                raise refused
            return False

    def _lane(self) -> _Lane:
        limit = min(self.max_sessions, self._learned or self.max_sessions)
        return _Lane(self._connect(self.endpoint), limit)

    def _gone(self) -> HostError:
        return HostError(self.endpoint.name, "its shared SSH connection was closed")


class SharedView(SSHTransport):
    """One caller's transport over a SharedSSH: an SSHTransport (runs, sessions, tunnels, the
    same errors, named after the caller) whose channels come from the shared connections. Its
    `close` closes the channels it opened, a command in flight included (as closing a host's
    own connection would: Fleet.interrupt relies on it), and nothing of the others'."""

    def __init__(self, pool: SharedSSH, name: str) -> None:
        super().__init__(ssh.Endpoint(name, pool.endpoint.address, pool.endpoint.settings))
        self._pool = pool
        self._mine: list[paramiko.Channel] = []
        self._mine_lock = threading.Lock()

    def session_channel(self) -> paramiko.Channel:
        try:
            chan = self._pool.session_channel()
        except HostError as exc:  # the shared connection's failure is this caller's too
            raise exc.of_host(self.name) from exc
        with self._mine_lock:
            self._mine = [c for c in self._mine if not c.closed]
            self._mine.append(chan)
        return chan

    def _transport(self) -> paramiko.Transport:
        try:
            return self._pool.connection()
        except HostError as exc:
            raise exc.of_host(self.name) from exc

    def put(self, data: bytes, remote_path: str, *, mode: int = 0o600) -> None:
        """Written by a shell command: an SFTP session would hold a channel for good."""
        put_with_shell(self, data, remote_path, mode)

    def close(self) -> None:
        with self._mine_lock:
            mine, self._mine = self._mine, []
        for chan in mine:
            with contextlib.suppress(Exception):
                chan.close()
