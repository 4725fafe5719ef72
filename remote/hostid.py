"""Which machine this agent runs on, and which other machines said hello in the same workdir.

A workdir on an NFS or EFS home is one directory for every host of the fleet. Everything tied to
this machine's processes (runs, leases, pids, port reservations, setup markers) therefore lives
under WORKDIR/hosts/<identity>/, and each hello leaves a token there, so the control side can see
which hosts share a workdir (and their content store) from the hello replies alone.

The identity is the hostname plus a hash of the machine id (/etc/machine-id, else the D-Bus copy,
else the boot id). The machine id alone is not enough: cloned images (AMIs, containers) often
carry the same /etc/machine-id, and the lab's hosts are namespaces of one machine, which share
its /etc but each have a hostname of their own. The hostname alone is not enough either: fleets
of "localhost" or of reused names exist. The boot id is only a last resort, since it changes at
each reboot and a rebooted host would then no longer see the records of its runs from before.
A host that is renamed gets a new identity (its earlier runs stay under the old one).
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import socket
import time
from pathlib import Path

import params
import protocol

MACHINE_ID_FILES = (
    "/etc/machine-id",
    "/var/lib/dbus/machine-id",
    "/proc/sys/kernel/random/boot_id",  # last resort: it changes at each reboot
)
TOKEN = "hello"  # WORKDIR/hosts/<identity>/hello; its mtime is the host's last hello
TOKEN_FRESH_S = 24 * 3600.0  # older tokens are not reported, and are removed when seen
HOSTNAME_CHARS = 64


@functools.lru_cache(maxsize=None)
def identity() -> str:
    """`<hostname>-<12 hex>`: stable for this machine, distinct for hosts that share a workdir."""
    override = os.environ.get(protocol.HOST_ID_ENV)
    if override:  # tests: several "hosts" on one machine
        return params.check_name(override, f"host identity ({protocol.HOST_ID_ENV})")
    hostname = socket.gethostname()
    # The machine id is meant to stay private (machine-id(5)): only a hash of it is shown.
    digest = hashlib.sha256(b"tfdeploy host\0" + _machine_id() + b"\0" + hostname.encode())
    readable = re.sub(r"[^A-Za-z0-9._-]", "_", hostname)[:HOSTNAME_CHARS].strip(".") or "host"
    return f"{readable}-{digest.hexdigest()[:12]}"


def _machine_id() -> bytes:
    for path in MACHINE_ID_FILES:
        try:
            with open(path, "rb") as f:
                found = f.read().strip()
        except OSError:
            continue
        if found:
            return found
    return b""


def announce(hosts: Path, me: str, now: float | None = None) -> list[str]:
    """Leaves this host's token under `hosts`; returns the other hosts with a fresh token.

    The token is written before the others are read, so of two hosts saying hello at the same
    moment the later one always sees the earlier one. Stale tokens (hosts gone for a day) are
    removed, and with them their directory if nothing else is in it.
    """
    now = time.time() if now is None else now
    _leave_token(hosts / me, now)
    others = []
    for entry in os.scandir(hosts):
        if entry.name == me or not entry.is_dir(follow_symlinks=False):
            continue
        path = Path(entry.path, TOKEN)
        try:
            seen = path.stat().st_mtime
        except OSError:
            continue  # no token: records of a host that has not said hello for long
        if now - seen <= TOKEN_FRESH_S:
            others.append(entry.name)
            continue
        try:
            path.unlink()
            os.rmdir(entry.path)  # only a host that left nothing else here
        except OSError:
            pass
    return sorted(others)


def _leave_token(home: Path, now: float) -> None:
    for attempt in range(3):
        try:
            home.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.close(os.open(home / TOKEN, os.O_WRONLY | os.O_CREAT, 0o600))
            break
        except FileNotFoundError:  # another host removed our directory as stale just now
            if attempt == 2:
                raise
    # This host's clock, not the file server's (which sets the time of an utime(None) on NFS).
    os.utime(home / TOKEN, (now, now))
