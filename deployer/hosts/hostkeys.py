"""Known-hosts checking for SSH connections: strict by default, accept-new only when opted in."""

from __future__ import annotations

import base64
import binascii
import contextlib
import fcntl
import hashlib
import hmac
import logging
import os
import threading

import paramiko

from deployer.core.errors import HostError, HostKeyRefused

log = logging.getLogger(__name__)

# Several transports may record new keys at once (parallel preflight); one lock per process plus
# flock for other processes keeps every appended line whole.
_APPEND_LOCK = threading.Lock()


class UnknownHostKey(paramiko.SSHException):  # type: ignore[misc]  # paramiko is untyped
    """The server's key is not in known_hosts and the user did not opt in to accept-new."""

    def __init__(self, hostname: str, key: paramiko.PKey) -> None:
        super().__init__(f"{hostname} not found in known_hosts")
        self.hostname = hostname
        self.key = key


class StrictPolicy(paramiko.RejectPolicy):  # type: ignore[misc]  # paramiko is untyped
    """RejectPolicy that raises a typed error, so the caller can name the host and the fix."""

    def missing_host_key(
        self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey
    ) -> None:
        raise UnknownHostKey(hostname, key)


class AcceptNewPolicy(paramiko.MissingHostKeyPolicy):  # type: ignore[misc]  # paramiko is untyped
    """OpenSSH's accept-new: record an unknown key in known_hosts; a changed key still fails.

    Only used when the inventory says host_keys = "accept-new".
    """

    def __init__(self, known_hosts: str) -> None:
        self.known_hosts = known_hosts

    def missing_host_key(
        self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey
    ) -> None:
        append_known_host(self.known_hosts, hostname, key)
        client.get_host_keys().add(hostname, key.get_name(), key)
        log.warning(
            "permanently added %s (%s %s) to %s",
            hostname,
            key.get_name(),
            key.fingerprint,
            self.known_hosts,
        )


class UnexpectedHostKey(paramiko.SSHException):  # type: ignore[misc]  # paramiko is untyped
    """The server's key is not one of the fingerprints learnt out of band (EC2 console)."""

    def __init__(self, hostname: str, key: paramiko.PKey, expected: tuple[str, ...]) -> None:
        super().__init__(f"{hostname} offered a key not among {', '.join(expected)}")
        self.hostname = hostname
        self.key = key
        self.expected = expected


class ExpectedKeyPolicy(paramiko.MissingHostKeyPolicy):  # type: ignore[misc]  # paramiko is untyped
    """A new machine whose key fingerprints we were told (its console output): the key that
    matches is recorded in known_hosts, replacing what an earlier machine at that address left;
    any other key is refused, whatever host_keys says."""

    def __init__(self, known_hosts: str, expected: tuple[str, ...]) -> None:
        self.known_hosts = known_hosts
        self.expected = expected

    def missing_host_key(
        self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey
    ) -> None:
        if key.fingerprint not in self.expected:
            raise UnexpectedHostKey(hostname, key, self.expected)
        forget_known_host(self.known_hosts, hostname)
        append_known_host(self.known_hosts, hostname, key)
        client.get_host_keys().add(hostname, key.get_name(), key)
        log.info("verified %s (%s) against its console output", hostname, key.fingerprint)


def key_name(address: str, port: int) -> str:
    """The name OpenSSH files a host under in known_hosts: `addr` on port 22, else `[addr]:port`."""
    return address if port == 22 else f"[{address}]:{port}"


def known_hosts_path(path: str | None) -> str:
    return os.path.expanduser(path or "~/.ssh/known_hosts")


class _KnownHosts:
    """known_hosts files parsed once per process (and again when one changes), indexed by name.

    paramiko's `HostKeys.load` checks every line against every entry before it, and each client
    loaded the whole file: with N hosts in known_hosts, connecting to N hosts parsed N² lines and
    compared N³ names (at 64 hosts, a third of `up`'s controller CPU). A client needs only its
    own host's lines, so each now gets just those, found in a dict: the checking is the same.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._files: dict[str, tuple[tuple[int, int, int], _Index]] = {}

    def keys_for(self, path: str, name: str) -> list[paramiko.PKey]:
        """The keys recorded for `name` (a known_hosts name), the first of each type, in file
        order: exactly the key paramiko's own lookup would pick for each type. [] when the
        file does not exist; raises OSError when it cannot be read."""
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return []
        stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
        with self._lock:
            cached = self._files.get(path)
            if cached is None or cached[0] != stamp:
                cached = (stamp, _Index.read(path))
                self._files[path] = cached
        return cached[1].first_of_each_type(name)


class _Index:
    """One known_hosts file: plain names in a dict, hashed names (`|1|salt|hash`) in a list."""

    def __init__(self) -> None:
        self.plain: dict[str, list[int]] = {}
        self.hashed: list[tuple[int, bytes, bytes]] = []  # (key, salt, HMAC-SHA1 of the name)
        self.keys: list[paramiko.PKey] = []

    @classmethod
    def read(cls, path: str) -> _Index:
        index = cls()
        with open(path, encoding="utf-8", errors="replace") as f:
            for lineno, raw in enumerate(f, 1):
                line = raw.strip()
                if not line or line.startswith("#"):
                    continue
                try:  # paramiko's own line parser: the same lines count, the same are skipped
                    entry = paramiko.hostkeys.HostKeyEntry.from_line(line, lineno)
                except paramiko.SSHException:
                    continue
                if entry is None or entry.key is None:
                    continue
                at = len(index.keys)
                index.keys.append(entry.key)
                for host in entry.hostnames:
                    if host.startswith("|1|"):
                        salt, _, digest = host[3:].partition("|")
                        with contextlib.suppress(binascii.Error):
                            index.hashed.append(
                                (at, base64.b64decode(salt), base64.b64decode(digest))
                            )
                    else:
                        index.plain.setdefault(host, []).append(at)
        return index

    def first_of_each_type(self, name: str) -> list[paramiko.PKey]:
        found = set(self.plain.get(name, ()))
        if self.hashed:  # OpenSSH's HashKnownHosts: |1|base64(salt)|base64(HMAC-SHA1(salt, name))
            raw = name.encode()
            for at, salt, digest in self.hashed:
                if hmac.compare_digest(hmac.new(salt, raw, hashlib.sha1).digest(), digest):
                    found.add(at)
        chosen: dict[str, paramiko.PKey] = {}
        for at in sorted(found):
            chosen.setdefault(self.keys[at].get_name(), self.keys[at])
        return list(chosen.values())


_KNOWN = _KnownHosts()


def configure_client(
    host: str,
    client: paramiko.SSHClient,
    known_hosts: str,
    mode: str,
    *,
    name: str,
    expected: tuple[str, ...] = (),
) -> None:
    """Give `client` the keys known_hosts records for `name` (the known_hosts name of the server
    it will connect to: `key_name(address, port)`) and install the policy for `mode`, replacing
    any other.

    With `expected` fingerprints, the server `name` must offer one of them:
    a different key recorded for `name` earlier (an address reused by a new instance) is
    ignored.
    """
    if mode not in ("strict", "accept-new"):
        raise ValueError(f"host_keys must be 'strict' or 'accept-new', not {mode!r}")
    keys = client.get_host_keys()
    keys.clear()
    try:
        recorded_keys = _KNOWN.keys_for(known_hosts, name)
    except OSError as exc:
        raise HostError(host, f"cannot read {known_hosts}: {exc.strerror or exc}") from exc
    for key in recorded_keys:
        keys.add(name, key.get_name(), key)
    policy: paramiko.MissingHostKeyPolicy
    policy = AcceptNewPolicy(known_hosts) if mode == "accept-new" else StrictPolicy()
    if expected:
        recorded = keys.lookup(name) or {}
        if any(k.fingerprint not in expected for k in recorded.values()):
            del keys[name]  # stale: the policy below decides, against the console's word
        policy = ExpectedKeyPolicy(known_hosts, expected)
    client.set_missing_host_key_policy(policy)


def forget_known_host(path: str, hostname: str) -> None:
    """Drops every known_hosts line for `hostname` (plain or hashed), keeping all others."""
    if not os.path.exists(path):
        return
    with _APPEND_LOCK, open(path, "r+", encoding="utf-8") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        lines = f.readlines()
        kept = [line for line in lines if not _names(line, hostname)]
        if len(kept) != len(lines):
            f.seek(0)
            f.writelines(kept)
            f.truncate()


def _names(line: str, hostname: str) -> bool:
    """Whether a known_hosts line is about `hostname`."""
    field = line.split(None, 1)[0] if line.strip() and not line.startswith("#") else ""
    for name in field.split(","):
        if name.startswith("|1|"):
            salt = name.split("|")[2]
            if paramiko.HostKeys.hash_host(hostname, salt) == name:
                return True
        elif name == hostname:
            return True
    return False


def append_known_host(path: str, hostname: str, key: paramiko.PKey) -> None:
    """Append one plain OpenSSH known_hosts line, unless another writer already recorded it."""
    line = f"{hostname} {key.get_name()} {key.get_base64()}\n"
    parent = os.path.dirname(path) or "."
    os.makedirs(parent, mode=0o700, exist_ok=True)
    with _APPEND_LOCK, open(path, "a+", encoding="utf-8") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        existing = f.read()
        # The index, not paramiko's HostKeys.load: that one is quadratic in the file's lines.
        known = {k.get_name(): k for k in _Index.read(path).first_of_each_type(hostname)}
        if key.get_name() in known:
            if known[key.get_name()] != key:
                # Someone recorded a different key for this host since we loaded the file.
                raise paramiko.BadHostKeyException(hostname, key, known[key.get_name()])
            return
        if existing and not existing.endswith("\n"):
            f.write("\n")
        f.write(line)


def unknown_key_error(
    host: str, address: str, port: int, known_hosts: str, exc: UnknownHostKey, via: str = ""
) -> HostKeyRefused:
    return HostKeyRefused(
        host,
        f"{via}host key of {key_name(address, port)} is not in {known_hosts} "
        f"(server offered {exc.key.get_name()} {exc.key.fingerprint}); refusing to connect",
        hint=(
            f"verify the fingerprint, then run: ssh-keyscan -p {port} {address} >> {known_hosts}\n"
            f'or set host_keys = "accept-new" for this host to record keys on first connect'
        ),
    )


def unexpected_key_error(
    host: str, address: str, port: int, exc: UnexpectedHostKey, via: str = ""
) -> HostKeyRefused:
    return HostKeyRefused(
        host,
        f"{via}host key of {key_name(address, port)} ({exc.key.get_name()} "
        f"{exc.key.fingerprint}) is not one its EC2 console output lists "
        f"({', '.join(exc.expected)}); refusing to connect (possible man-in-the-middle)",
        hint="compare with `aws ec2 get-console-output --instance-id ID --latest`",
    )


def changed_key_error(
    host: str,
    address: str,
    port: int,
    known_hosts: str,
    exc: paramiko.BadHostKeyException,
    via: str = "",
) -> HostKeyRefused:
    return HostKeyRefused(
        host,
        f"{via}HOST KEY CHANGED for {key_name(address, port)}: known_hosts has "
        f"{exc.expected_key.fingerprint}, server offered {exc.key.fingerprint}; "
        "refusing to connect (possible man-in-the-middle, or the host was rebuilt)",
        hint=(
            "if the host was rebuilt, remove the old key and reconnect: "
            f'ssh-keygen -f {known_hosts} -R "{key_name(address, port)}"'
        ),
    )
