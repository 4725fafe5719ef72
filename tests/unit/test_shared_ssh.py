"""The shared SSH connections (deployer/hosts/shared_ssh.py) against a scripted server whose
connections refuse a session past their MaxSessions, as sshd does ("no more sessions": the
channel open fails, the connection lives). What is checked is the rule: channels on the first
connection with room, a refused one on another connection instead of an error, a new
connection only when every one is full, and each caller's close closing its channels only."""

from __future__ import annotations

from dataclasses import dataclass, field

import paramiko
import pytest

from deployer.config.model import SSHSettings
from deployer.core.errors import HostError, HostKeyRefused
from deployer.hosts import ssh
from deployer.hosts.shared_ssh import MAX_SESSIONS, SharedSSH
from deployer.hosts.ssh_transport import SessionRefused, refused

LOGIN = ssh.Endpoint("login (Slurm login)", "login.example.edu", SSHSettings())


class Channel:
    """A session channel: closed by either side."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self.closed = False

    def close(self) -> None:
        if not self.closed and self.connection.server.lag:
            self.connection.closing += 1  # the server still counts it, for a moment
        self.closed = True


@dataclass
class Server:
    """sshd with `max_sessions` (its MaxSessions); every connection made to it is kept."""

    max_sessions: int
    connections: list[Connection] = field(default_factory=list)
    refused: int = 0
    lag: bool = False  # a closed channel is still counted until the next refusal (sshd's GC)

    def connect(self, endpoint: ssh.Endpoint) -> Connection:
        self.connections.append(Connection(self, endpoint.name))
        return self.connections[-1]


@dataclass
class Connection:
    server: Server
    name: str
    channels: list[Channel] = field(default_factory=list)
    closed: bool = False
    closing: int = 0  # closed here, not yet freed by the server

    def session_channel(self) -> Channel:
        assert not self.closed
        if sum(not c.closed for c in self.channels) + self.closing >= self.server.max_sessions:
            self.server.refused += 1
            self.closing = 0  # processed by the time anyone asks again
            raise SessionRefused(self.name, paramiko.ChannelException(1, "open failed"))
        self.channels.append(Channel(self))
        return self.channels[-1]

    def close(self) -> None:
        self.closed = True
        for chan in self.channels:
            chan.close()


def _pool(server: Server) -> SharedSSH:
    return SharedSSH(LOGIN, connect=server.connect)  # type: ignore[arg-type]


def test_every_channel_rides_one_connection_up_to_the_default_max_sessions() -> None:
    server = Server(max_sessions=200)  # the lab's: the pool still asks no more than 10 of one
    pool = _pool(server)
    channels = [pool.session_channel() for _ in range(MAX_SESSIONS)]
    assert len(server.connections) == 1 == pool.connections
    channels.append(pool.session_channel())
    assert len(server.connections) == 2 and server.refused == 0
    assert [c.connection for c in channels].count(server.connections[0]) == MAX_SESSIONS


def test_a_refused_channel_opens_on_another_connection_and_that_one_is_full_from_then_on() -> None:
    server = Server(max_sessions=2)
    pool = _pool(server)
    channels = [pool.session_channel() for _ in range(5)]
    # The third was refused on the first connection, and opened on a second, which is known
    # to take two as the first did (the server's MaxSessions): the fifth went to a third
    # without being refused again.
    assert server.refused == 1
    assert [server.connections.index(c.connection) for c in channels] == [0, 0, 1, 1, 2]
    channels[0].close()  # room again on the first connection: the next channel goes there
    assert pool.session_channel().connection is server.connections[0]
    assert len(server.connections) == 3 and server.refused == 1


def test_a_new_connection_that_refuses_its_first_session_is_the_answer() -> None:
    server = Server(max_sessions=0)  # refuses every session: no connection would do better
    pool = _pool(server)
    with pytest.raises(SessionRefused, match="refused another session"):
        pool.session_channel()
    assert len(server.connections) == 1


def test_closes_the_server_has_not_processed_yet_are_waited_out_on_the_same_connection() -> None:
    """As at a run's end: every node's session closed at once, then the cluster's `scancel`
    is refused by a connection with nothing open (sshd frees a session once both closes
    crossed). Before, that refusal failed the release; now it is asked again there."""
    server = Server(max_sessions=10, lag=True)
    pool = _pool(server)
    channels = [pool.session_channel() for _ in range(MAX_SESSIONS)]
    for chan in channels:
        chan.close()
    again = pool.session_channel()
    assert server.refused == 1 and again.connection is server.connections[0]
    assert len(server.connections) == 1  # no connection opened for a refusal that passes


def test_a_callers_close_closes_its_channels_and_no_others() -> None:
    server = Server(max_sessions=10)
    pool = _pool(server)
    node, keeper = pool.view("node1"), pool.view("keeper")
    mine = [node.session_channel() for _ in range(3)]
    theirs = keeper.session_channel()
    assert node.name == "node1" and keeper.name == "keeper"  # errors name the caller
    node.close()
    assert all(c.closed for c in mine) and not theirs.closed
    assert not server.connections[0].closed  # the connection stays for the others
    pool.close()
    assert theirs.closed and server.connections[0].closed
    with pytest.raises(HostError, match="its shared SSH connection was closed"):
        keeper.session_channel()


def test_a_failure_of_the_shared_connection_is_said_of_each_caller_as_its_own() -> None:
    """The watch counts a lost host by the name its error gives: a node whose login connection
    failed is that node's loss, not a host named after the login node (which no task has)."""

    class Unverified(Connection):
        def session_channel(self) -> Channel:  # connecting first, as SSHTransport does
            raise HostKeyRefused(self.name, "its host key changed", hint="check it")

    pool = SharedSSH(LOGIN, connect=lambda e: Unverified(Server(10), e.name))  # type: ignore[arg-type]
    with pytest.raises(HostKeyRefused) as info:
        pool.view("node7").session_channel()
    said = info.value
    assert (said.host, said.message, said.hint) == (
        "node7",
        "node7: its host key changed",
        "check it",
    )
    assert pool.connections == 1  # tried once, on the one connection; nothing held open


class Link:
    """What `refused` asks of a paramiko connection: whether it still lives."""

    def __init__(self, active: bool) -> None:
        self.active = active

    def is_active(self) -> bool:
        return self.active


def test_a_refusal_is_told_from_a_lost_connection_and_a_timeout() -> None:
    """paramiko keeps one saved exception per connection: of two opens refused at once, one
    gets the ChannelException and the other a bare "Unable to open channel." (seen on the lab
    at MaxSessions 2: taken for a lost connection, it failed the run)."""
    live, gone = Link(active=True), Link(active=False)
    assert refused(live, paramiko.ChannelException(1, "Administratively prohibited"))  # type: ignore[arg-type]
    assert refused(live, paramiko.SSHException("Unable to open channel."))  # type: ignore[arg-type]
    assert not refused(gone, paramiko.SSHException("Unable to open channel."))  # type: ignore[arg-type]
    assert not refused(live, paramiko.SSHException("Timeout opening channel."))  # type: ignore[arg-type]
