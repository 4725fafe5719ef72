"""The user's ssh_config, read on this machine: what a `Host` alias stands for.

The transport (deployer/hosts/ssh.py) connects through it; the inventory reads it too, so that a
host named by an alias gets the alias's HostName as its TF address: the alias is known only to
this machine, and the other hosts must reach the host by a name they can resolve.
"""

from __future__ import annotations

import os

import paramiko

from deployer.config.model import SSHSettings
from deployer.core.perfile import PerFile

_SSH_CONFIGS = PerFile(paramiko.SSHConfig.from_path)
_NONE = paramiko.SSHConfig()


def read(path: str | None) -> paramiko.SSHConfig:
    """The user's ssh_config (only that file: not /etc/ssh/ssh_config), parsed once."""
    path = os.path.expanduser(path or "~/.ssh/config")
    try:
        return _SSH_CONFIGS.get(path)
    except FileNotFoundError:  # no ssh_config (the usual case with an inventory's addresses)
        return _NONE


def lookup(name: str, path: str | None) -> dict[str, object]:
    """ssh_config's options for `name` (lower-case keys); raises ImportError for `Match exec`
    without invoke, which the transport reports (paramiko runs those lines through invoke)."""
    return dict(read(path).lookup(name))


def tf_address_of(address: str, path: str | None) -> str:
    """The address other hosts reach `address` by: its ssh_config HostName, when it is an alias.

    A file that cannot be read, or needs invoke for `Match exec`, leaves the address as
    written: connecting reports those with the host's name.
    """
    try:
        hostname = lookup(address, path).get("hostname")
    except (ImportError, OSError, paramiko.ConfigParseError):
        return address
    return hostname if isinstance(hostname, str) and hostname else address


def ssh_port_of(address: str, ssh: SSHSettings) -> int:
    """The SSH port `address` is reached on: the inventory's when not 22, else ssh_config's."""
    if ssh.port != 22:
        return ssh.port
    try:
        port = lookup(address, ssh.ssh_config).get("port")
    except (ImportError, OSError, paramiko.ConfigParseError):
        return ssh.port
    return int(port) if isinstance(port, str) and port.isdigit() else ssh.port
