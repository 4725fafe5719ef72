"""The user's ssh_config, read on this machine: what a `Host` alias stands for.

The transport (deployer/hosts/ssh.py) connects through it; the inventory reads it too, so that a
host named by an alias gets the alias's HostName as its TF address: the alias is known only to
this machine, and the other hosts must reach the host by a name they can resolve.

paramiko is imported only for a file that has a HostName line: `plan` stays free of the SSH
stack (~150 ms to import) for everyone else, and only HostName changes a TF address.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from deployer.config.model import SSHSettings
from deployer.core.perfile import PerFile

if TYPE_CHECKING:
    import paramiko


def _parse(path: str) -> paramiko.SSHConfig:
    import paramiko

    return paramiko.SSHConfig.from_path(path)


def _names_a_hostname(path: str) -> bool:
    with open(path, "rb") as f:
        return b"hostname" in f.read().lower()


_SSH_CONFIGS = PerFile(_parse)
_HOSTNAMES = PerFile(_names_a_hostname)


def _path(path: str | None) -> str:
    return os.path.expanduser(path or "~/.ssh/config")


def read(path: str | None) -> paramiko.SSHConfig:
    """The user's ssh_config (only that file: not /etc/ssh/ssh_config), parsed once."""
    import paramiko

    try:
        return _SSH_CONFIGS.get(_path(path))
    except FileNotFoundError:  # no ssh_config (the usual case with an inventory's addresses)
        return paramiko.SSHConfig()


def _lookup(name: str, path: str | None) -> dict[str, Any] | None:
    """ssh_config's options for `name` (lower-case keys), or None when the file (missing,
    unreadable, needing invoke for `Match exec`, or without a HostName line) cannot change
    what the inventory wrote: connecting reports those problems with the host's name."""
    try:
        if not _HOSTNAMES.get(_path(path)):
            return None
    except OSError:
        return None
    import paramiko

    try:
        return dict(read(path).lookup(name))
    except (ImportError, OSError, paramiko.ConfigParseError):
        return None


def tf_address_of(address: str, path: str | None) -> str:
    """The address other hosts reach `address` by: its ssh_config HostName, when it is an alias."""
    hostname = (_lookup(address, path) or {}).get("hostname")
    return hostname if isinstance(hostname, str) and hostname else address


def ssh_port_of(address: str, ssh: SSHSettings) -> int:
    """The SSH port `address` is reached on: the inventory's when not 22, else ssh_config's."""
    if ssh.port != 22:
        return ssh.port
    port = (_lookup(address, ssh.ssh_config) or {}).get("port")
    return int(port) if isinstance(port, str) and port.isdigit() else ssh.port
