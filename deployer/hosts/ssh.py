"""Opening SSH connections: ssh_config, jump chains, socket options, keys, and readable errors."""

from __future__ import annotations

import errno
import getpass
import logging
import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import paramiko
from paramiko.auth_strategy import AuthStrategy, InMemoryPrivateKey, OnDiskPrivateKey

from deployer.config import sshconfig
from deployer.config.model import SSHSettings
from deployer.core.errors import HostError
from deployer.core.lines import clean
from deployer.core.perfile import PerFile
from deployer.hosts import hostkeys, paramiko_tuning

# paramiko logs a failed handshake ("Exception (client): Error reading SSH protocol banner", with
# tracebacks) at ERROR, and with no handler configured Python prints that on stderr. Each such
# failure already becomes one HostError that says what happened; the log must not reach a user.
logging.getLogger("paramiko").addHandler(logging.NullHandler())

# --- Every connection option tfdeploy sets, in one place -------------------------------------
# A cut link (cable, security group, instance gone) never sends a FIN or RST, so without these an
# SSH read blocks for many minutes. Kernel keepalive catches an idle link: first probe after
# KEEPIDLE s, then every KEEPINTVL s, dead after KEEPCNT misses (~8 s in all).
TCP_KEEPIDLE_S = 2
TCP_KEEPINTVL_S = 2
TCP_KEEPCNT = 3
# Keepalive only probes idle sockets; when we have unacknowledged data in flight (stdin, a put,
# a keepalive request) the kernel retransmits for ~15 min instead. This caps that at 8 s.
TCP_USER_TIMEOUT_MS = 8000
# SSH-level keepalive: keeps NAT and firewall state warm on long-idle connections (tails, waits);
# it does not detect a dead link by itself (lab-measured). It must be longer than the keepalive
# window above: a keepalive sent into a dead link restarts detection as USER_TIMEOUT (5 s + 8 s).
SSH_KEEPALIVE_S = 15
# OpenSSH's default MaxSessions is 10 per connection; we keep 8 for exec, 1 for SFTP, 1 spare.
MAX_EXEC_SESSIONS = 8
# Bulk bytes (push, pull): paramiko's 2 MiB window and 32 KiB packets keep a fast link waiting
# on window updates and cost a Python round per 32 KiB; an 8 MiB window and larger packets
# (sshd sends up to the size we name) moved 300 MB down in 0.7 s instead of 1.5 s (lab). Not
# larger than 128 KiB: paramiko assembles a packet by appending what each socket read brings,
# which costs more CPU the larger the packet (1 GB pulled: 3.0 s of CPU at 128 KiB, 4.6 at 256).
CHANNEL_WINDOW = 8 * 1024 * 1024
CHANNEL_PACKET = 128 * 1024
# AES-GCM first: one AEAD pass instead of AES-CTR plus a separate HMAC per packet (about half
# the controller's CPU per MB here); both are in OpenSSH's defaults, the rest follow as before.
PREFERRED_CIPHERS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")


@dataclass(frozen=True)
class Endpoint:
    """A host as SSH sees it: the inventory's name (for messages), its address, its settings."""

    name: str
    address: str
    settings: SSHSettings


@dataclass
class Hop:
    """One SSH connection of a chain: zero or more jump hosts, then the target."""

    host: str  # the address to connect to (ssh_config's HostName applied)
    port: int
    user: str
    keys: list[str]
    explicit_keys: bool
    label: str  # "" for the target itself, else "jump host SPEC (addr:port)"
    client: paramiko.SSHClient = field(default_factory=paramiko.SSHClient)
    loaded: list[tuple[str, paramiko.PKey]] = field(default_factory=list)
    encrypted: list[str] = field(default_factory=list)

    @property
    def where(self) -> str:
        return f"{self.label}: " if self.label else ""

    @property
    def addr(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True)
class _Resolved:
    """A host spec (`[user@]host[:port]`) after ssh_config: what OpenSSH would connect to."""

    host: str
    port: int
    user: str
    keys: list[str]
    options: dict[str, Any]  # the ssh_config options for it (lower-case keys)


def _resolve(
    spec: str, config: paramiko.SSHConfig, *, user: str | None = None, port: int | None = None
) -> _Resolved:
    """Precedence as OpenSSH's: explicit values, then the spec's user@ and :port, then the
    file's User/Port/HostName/IdentityFile, then the local user name and port 22."""
    spec_user, _, rest = spec.rpartition("@")
    name, spec_port = rest, None
    if rest.count(":") == 1:  # host:port (a bare IPv6 address has several colons)
        name, _, tail = rest.partition(":")
        spec_port = int(tail) if tail.isdigit() else None
    try:
        options = dict(config.lookup(name))
    except ImportError as exc:  # paramiko runs `Match exec` through invoke, when installed
        raise HostError(
            name,
            f"ssh_config has `Match exec`, which paramiko runs with invoke ({exc})",
            hint="pip install invoke, or set the host's address, user and jump in the inventory",
        ) from exc
    file_port = options.get("port")
    return _Resolved(
        host=options.get("hostname", name),
        port=port or spec_port or (int(file_port) if file_port else 22),
        user=user or spec_user or options.get("user") or getpass.getuser(),
        keys=[str(k) for k in options.get("identityfile", [])],
        options=options,
    )


def plan_hops(target: Endpoint) -> list[Hop]:
    """Resolve ssh_config and ProxyJump into the connections to open, first hop first (no I/O)."""
    config = _ssh_config(target.settings.ssh_config)
    main = _resolve(
        target.address,
        config,
        user=target.settings.user,
        port=target.settings.port if target.settings.port != 22 else None,
    )
    identity = [target.settings.identity] if target.settings.identity else []
    jump = target.settings.jump or main.options.get("proxyjump")
    if not jump and "proxycommand" in main.options:
        raise HostError(
            target.name,
            "ssh_config sets ProxyCommand, which tfdeploy does not support",
            hint="use ProxyJump (or the host's `jump` setting) instead",
        )
    hops: list[Hop] = []
    for spec in (jump or "").split(","):
        if not spec.strip() or spec.strip().lower() == "none":
            continue
        via = _resolve(spec.strip(), config)
        keys = via.keys + identity
        label = f"jump host {spec.strip()} ({via.host}:{via.port})"
        hops.append(Hop(via.host, via.port, via.user, keys, bool(keys), label))
    keys = identity + main.keys
    hops.append(Hop(main.host, main.port, main.user, keys, bool(keys), ""))
    for hop in hops:
        hostkeys.configure_client(
            target.name,
            hop.client,
            hostkeys.known_hosts_path(target.settings.known_hosts),
            target.settings.host_keys,
            # fingerprints learnt for the target say nothing about its jump hosts
            expected=target.settings.expected_keys if hop is hops[-1] else (),
            name=hostkeys.key_name(hop.host, hop.port),
        )
    return hops


def open_hops(target: Endpoint, hops: list[Hop]) -> None:
    """Connect every hop in order; on failure close what was opened and raise a HostError."""
    opened: list[Hop] = []
    try:
        for hop in hops:
            _load_keys(target, hop)
            sock = _open_socket(target, hop, opened[-1] if opened else None)
            _handshake(target, hop, sock)
            opened.append(hop)
    except BaseException:
        for hop in reversed(opened):
            hop.client.close()
        raise


def set_dead_link_detection(sock: socket.socket) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    # getattr: these constants are Linux names; macOS and BSD lack some of them.
    for name, value in (
        ("TCP_KEEPIDLE", TCP_KEEPIDLE_S),
        ("TCP_KEEPINTVL", TCP_KEEPINTVL_S),
        ("TCP_KEEPCNT", TCP_KEEPCNT),
        ("TCP_USER_TIMEOUT", TCP_USER_TIMEOUT_MS),
    ):
        option = getattr(socket, name, None)
        if option is not None:
            sock.setsockopt(socket.IPPROTO_TCP, option, value)


def _parse_key(path: str) -> paramiko.PKey | None:
    """The key at path, or None when it needs a passphrase (the ssh-agent may have it)."""
    try:
        return paramiko.PKey.from_path(path)
    except (paramiko.PasswordRequiredException, TypeError):
        # cryptography raises TypeError ("password was not given") for encrypted keys.
        return None


_KEYS = PerFile(_parse_key)


def _ssh_config(path: str | None) -> paramiko.SSHConfig:
    """The user's ssh_config (only that file: not /etc/ssh/ssh_config), parsed once."""
    return sshconfig.read(path)


def _load_keys(target: Endpoint, hop: Hop) -> None:
    """Read key files up front: never prompt, and know which ones need a passphrase."""
    paths = hop.keys
    if not hop.explicit_keys:  # like OpenSSH: the default key names in ~/.ssh
        paths = [f"~/.ssh/id_{kind}" for kind in ("ed25519", "ecdsa", "rsa")]
    hop.loaded, hop.encrypted = [], []
    for raw in paths:
        path = os.path.expanduser(raw)
        if not os.path.exists(path):
            if raw == target.settings.identity:
                raise HostError(target.name, f"identity file {path} does not exist")
            continue
        try:
            key = _KEYS.get(path)
        except (OSError, ValueError, paramiko.SSHException) as exc:
            raise HostError(target.name, f"cannot read key {path}: {exc}") from exc
        if key is None:
            hop.encrypted.append(path)
        else:
            hop.loaded.append((path, key))


class _KeysThenAgent(AuthStrategy):  # type: ignore[misc]  # paramiko is untyped
    """Try our loaded key files, then the ssh-agent's keys; never ask for a passphrase."""

    def __init__(self, user: str, keys: list[tuple[str, paramiko.PKey]]) -> None:
        super().__init__(ssh_config=paramiko.SSHConfig())
        self.user = user
        self.keys = keys
        self.agent_keys = 0

    def get_sources(self) -> Iterator[InMemoryPrivateKey | OnDiskPrivateKey]:
        for path, key in self.keys:
            yield OnDiskPrivateKey(self.user, "python-config", path, key)
        agent = paramiko.Agent()  # no SSH_AUTH_SOCK -> no keys, no error
        try:
            for key in agent.get_keys():
                self.agent_keys += 1
                yield InMemoryPrivateKey(self.user, key)
        finally:
            agent.close()


def _open_socket(target: Endpoint, hop: Hop, prev: Hop | None) -> socket.socket | paramiko.Channel:
    timeout = target.settings.connect_timeout
    if prev is None:
        try:
            sock = socket.create_connection((hop.host, hop.port), timeout=timeout)
        except OSError as exc:
            raise _socket_error(target, hop, exc) from exc
        # Only the first hop has a kernel socket; the others ride inside it, so this covers all.
        set_dead_link_detection(sock)
        return sock
    transport = prev.client.get_transport()
    assert transport is not None
    try:
        return transport.open_channel(
            "direct-tcpip", (hop.host, hop.port), ("", 0), timeout=timeout
        )
    except paramiko.ChannelException as exc:
        raise HostError(
            target.name,
            f"{hop.where}{prev.label} could not connect to {hop.addr}: {exc.text.lower()}",
            hint=f"is sshd running on {hop.addr}, and reachable from the jump host?",
        ) from exc
    except (paramiko.SSHException, OSError, EOFError) as exc:
        raise HostError(
            target.name,
            f"{hop.where}timed out connecting to {hop.addr} through {prev.label} "
            f"after {timeout:g} s",
        ) from exc


def _handshake(target: Endpoint, hop: Hop, sock: socket.socket | paramiko.Channel) -> None:
    timeout = target.settings.connect_timeout
    strategy = _KeysThenAgent(hop.user, hop.loaded)
    try:
        hop.client.connect(
            hop.host,
            port=hop.port,
            username=hop.user,
            sock=sock,
            # The key exchange wait starts with the banner wait: were they equal, a silent
            # port could end the kex wait first and be reported as "No existing session".
            timeout=2 * timeout,
            banner_timeout=timeout,  # a port that accepts TCP but never speaks SSH
            auth_timeout=timeout,  # each authentication attempt
            channel_timeout=timeout,  # opening sessions and jump tunnels
            auth_strategy=strategy,
            transport_factory=_new_transport,
        )
    except BaseException as exc:
        sock.close()
        raise _handshake_error(target, hop, strategy, exc) from exc
    transport = hop.client.get_transport()
    assert transport is not None
    transport.set_keepalive(SSH_KEEPALIVE_S)


def _new_transport(
    sock: socket.socket | paramiko.Channel,
    disabled_algorithms: dict[str, list[str]] | None = None,
) -> paramiko.Transport:
    """paramiko's Transport (tuned where paramiko_tuning allows) with the window, packet size and
    cipher order above."""
    transport = paramiko_tuning.new_transport(
        sock,
        default_window_size=CHANNEL_WINDOW,
        default_max_packet_size=CHANNEL_PACKET,
        disabled_algorithms=disabled_algorithms,
    )
    options = transport.get_security_options()
    offered = tuple(options.ciphers)
    options.ciphers = tuple(c for c in PREFERRED_CIPHERS if c in offered) + tuple(
        c for c in offered if c not in PREFERRED_CIPHERS
    )
    return transport


def _socket_error(target: Endpoint, hop: Hop, exc: OSError) -> HostError:
    if isinstance(exc, socket.gaierror):
        return HostError(
            target.name,
            f"{hop.where}could not resolve hostname {hop.host}",
            hint="check the address in the inventory and your DNS",
        )
    if isinstance(exc, ConnectionRefusedError):
        return HostError(
            target.name,
            f"{hop.where}connection refused by {hop.addr}",
            hint=f"is sshd running and listening on port {hop.port}?",
        )
    if isinstance(exc, TimeoutError) or exc.errno == errno.ETIMEDOUT:
        return HostError(
            target.name,
            f"{hop.where}timed out connecting to {hop.addr} "
            f"after {target.settings.connect_timeout:g} s",
            hint="is the host up, and does a firewall or security group allow SSH from here?",
        )
    if exc.errno == errno.EHOSTUNREACH:
        return HostError(target.name, f"{hop.where}no route to host {hop.addr}")
    if exc.errno == errno.ENETUNREACH:
        return HostError(target.name, f"{hop.where}network is unreachable for {hop.addr}")
    return HostError(target.name, f"{hop.where}cannot connect to {hop.addr}: {exc.strerror or exc}")


def _handshake_error(
    target: Endpoint, hop: Hop, strategy: _KeysThenAgent, exc: BaseException
) -> BaseException:
    known = hostkeys.known_hosts_path(target.settings.known_hosts)
    host, port = hop.host, hop.port
    if isinstance(exc, hostkeys.UnknownHostKey):
        return hostkeys.unknown_key_error(target.name, host, port, known, exc, hop.where)
    if isinstance(exc, paramiko.BadHostKeyException):
        return hostkeys.changed_key_error(target.name, host, port, known, exc, hop.where)
    if isinstance(exc, hostkeys.UnexpectedHostKey):
        return hostkeys.unexpected_key_error(target.name, host, port, exc, hop.where)
    if isinstance(exc, paramiko.AuthenticationException):
        return _auth_error(target, hop, strategy)
    if isinstance(exc, OSError):
        return _socket_error(target, hop, exc)
    if isinstance(exc, paramiko.SSHException | EOFError):
        text = str(exc) or type(exc).__name__
        wait = target.settings.connect_timeout
        if "banner" in text:
            text = f"no SSH banner within {wait:g} s (is it an SSH server?)"
        elif text == "No existing session":  # paramiko's words for a key exchange never done
            text = (
                f"it sent an SSH banner, then nothing for {2 * wait:g} s: the key exchange never "
                "finished (a hung sshd, or a firewall dropping packets after the first?)"
            )
        return HostError(target.name, f"{hop.where}SSH handshake with {hop.addr} failed: {text}")
    return exc  # KeyboardInterrupt and programming errors pass through unchanged


# Where a Slurm node's pam_slurm_adopt refused the session (its account stack, after the key was
# accepted), the words it sent as the userauth banner before sshd closed: "Access denied by
# pam_slurm_adopt: you have no active jobs on this node" (Slurm 22.05, OpenSSH 9.2, lab-seen).
PAM_SLURM_ADOPT = "pam_slurm_adopt"
_BANNER_SHOWN = 200  # characters of a host's banner quoted in a message, at most


def _refusal_banner(hop: Hop) -> str | None:
    """The banner the hop's server sent during authentication (cleaned, one line), if any.
    paramiko's `get_banner()` answers None once the transport is closed, which a refusal
    leaves it: the auth handler keeps what it read."""
    transport = hop.client.get_transport()
    handler = getattr(transport, "auth_handler", None)
    banner = getattr(handler, "banner", None)
    if isinstance(banner, bytes):
        banner = banner.decode("utf-8", "replace")
    if not isinstance(banner, str) or not banner.strip():
        return None
    return clean(" ".join(banner.split()))[:_BANNER_SHOWN]


def _auth_error(target: Endpoint, hop: Hop, strategy: _KeysThenAgent) -> HostError:
    who = f"{hop.user}@{hop.host}"
    banner = _refusal_banner(hop)
    if banner is not None and PAM_SLURM_ADOPT in banner:
        return HostError(
            target.name,
            f"{hop.where}{hop.host} refused {hop.user}'s SSH session: the node's "
            f"{PAM_SLURM_ADOPT} admits only users with a Slurm job running on it; the node "
            f"says: {banner}",
            hint=f"SSH reaches a Slurm node only while a job of {hop.user}'s runs there: "
            "`tfdeploy status INVENTORY` shows whether the run's allocation still runs, "
            "`tfdeploy up` allocates nodes again; an ended run's logs are kept here "
            "(`tfdeploy logs RUN`)",
        )
    if hop.encrypted and not strategy.agent_keys:
        key = ", ".join(hop.encrypted)
        return HostError(
            target.name,
            f"{hop.where}cannot log in as {who}: key {key} is passphrase-protected "
            "and no ssh-agent has it",
            hint=f"start an agent and add the key (eval $(ssh-agent); ssh-add {hop.encrypted[0]}), "
            "or use a key without a passphrase",
        )
    keys = ", ".join(path for path, _ in hop.loaded) or "none"
    if strategy.agent_keys:
        keys += f" + {strategy.agent_keys} agent key(s)"
    return HostError(
        target.name,
        f"{hop.where}authentication failed for {who} (user={hop.user}, key={keys})",
        hint=f"is the public key in ~{hop.user}/.ssh/authorized_keys on {hop.host}, "
        "and is the user name right?",
    )
