"""Plain data of the lab: hosts, processes and the errors the lab raises."""

from __future__ import annotations

from dataclasses import dataclass

# Debian's interpreter-made venv: it lives outside /root and /tmp, so it runs inside lab hosts.
VENV_PYTHON = "/opt/tfdeploy/venv/bin/python"


class LabError(RuntimeError):
    """The lab could not do what was asked (a host did not come up, a fault did not take)."""


class LabUnsupported(LabError):
    """The loopback fallback cannot do this (no namespaces): tests must skip, not fail."""


@dataclass(frozen=True)
class LabHost:
    """One lab host as a deployer sees it: a name, an SSH address and port, and its hostname."""

    name: str
    address: str
    port: int
    hostname: str


@dataclass(frozen=True)
class Proc:
    """One process as seen inside a host (pids from the host's own PID namespace)."""

    pid: int
    ppid: int
    pgid: int
    user: str
    cmdline: str
    state: str = "?"
    comm: str = ""  # the kernel's name for it (a tfdeploy supervisor's is tfd-supervisor)
