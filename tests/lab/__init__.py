"""The test lab: N isolated SSH hosts on this machine (namespaces as root, else loopback sshd)."""

from __future__ import annotations

import atexit
import os

from tests.lab import cleanup
from tests.lab.base import Lab
from tests.lab.loopback import LoopbackLab
from tests.lab.model import VENV_PYTHON, LabError, LabHost, LabUnsupported, Proc
from tests.lab.netns import MAX_HOSTS, NamespaceLab
from tests.lab.slurm import SlurmCluster
from tests.lab.slurm import missing as slurm_missing

__all__ = [
    "VENV_PYTHON",
    "Lab",
    "LabError",
    "LabHost",
    "LabUnsupported",
    "LoopbackLab",
    "NamespaceLab",
    "Proc",
    "SlurmCluster",
    "lab_mode",
    "start_lab",
]

# Every lab this process started, so an atexit hook and the session-end check can find them.
started: list[Lab] = []


def lab_mode() -> str:
    """ "netns" as root unless TFDEPLOY_LAB=loopback forces the fallback; else "loopback"."""
    forced = os.environ.get("TFDEPLOY_LAB", "").strip().lower()
    if forced not in ("", "auto", "netns", "loopback"):
        raise LabError(f"TFDEPLOY_LAB={forced!r}: use 'loopback', 'netns' or leave it unset")
    if forced == "loopback":
        return "loopback"
    if os.geteuid() != 0:
        if forced == "netns":
            raise LabError("TFDEPLOY_LAB=netns needs root (network namespaces)")
        return "loopback"
    return "netns"


def start_lab(
    n: int = 8,
    topology: str = "flat",
    *,
    persistent: bool = False,
    containers: bool = False,
    slurm: bool = False,
    slurm_proctrack: str = "cgroup",
    slurm_adopt: bool = False,
) -> Lab:
    """Bring up `n` hosts ("flat"), or `n` private hosts behind a bastion ("bastion").

    Returns once every host's sshd accepts connections. A `persistent` lab (the CLI's) is not
    tied to this process: it outlives it and only `stop()` or `python -m tests.lab down` ends it.
    `containers` makes container hosts (tests/lab/containers.py): namespace lab only.
    `slurm` runs a Slurm cluster on the hosts (tests/lab/slurm.py, `lab.slurm`): h1 the login
    node, the others compute nodes; namespace lab only, and the packages must be installed.
    `slurm_proctrack` is its process tracking: "cgroup" by default (proctrack/cgroup +
    task/cgroup on a cgroup v1 subtree per compute host, as production clusters run), or
    "linuxproc" (no cgroups: the second configuration every Slurm e2e test also runs on).
    `slurm_adopt` puts the compute nodes' sshd behind Debian's pam_slurm_adopt (with
    `slurm_proctrack="cgroup"` only): SSH to a node is admitted only for a user with a job there.
    """
    if topology not in ("flat", "bastion"):
        raise LabError(f"unknown topology {topology!r}: use 'flat' or 'bastion'")
    if not 1 <= n <= MAX_HOSTS:
        raise LabError(f"a lab has 1 to {MAX_HOSTS} hosts, not {n}")
    mode = lab_mode()
    if containers and mode != "netns":
        raise LabUnsupported("container hosts need the namespace lab (root)")
    if slurm_adopt and not slurm:
        raise LabError("slurm_adopt is the Slurm cluster's: give slurm=True too")
    if slurm:
        if topology != "flat" or n < 2:
            raise LabError("a Slurm lab is flat, with a login node and 1+ compute nodes (n >= 2)")
        why = (
            slurm_missing(slurm_proctrack, slurm_adopt)
            if mode == "netns"
            else "a Slurm lab needs the namespace lab (root)"
        )
        if why is not None:
            raise LabUnsupported(why)
    lab_id, directory = cleanup.new_lab_dir()
    lab: NamespaceLab | LoopbackLab
    if mode == "netns":
        lab = NamespaceLab(
            lab_id=lab_id,
            directory=directory,
            persistent=persistent,
            containers=containers,
            slurm=slurm,
            slurm_proctrack=slurm_proctrack,
            slurm_adopt=slurm_adopt,
        )
    else:
        lab = LoopbackLab(lab_id=lab_id, directory=directory, persistent=persistent)
    if not persistent:
        started.append(lab)
    try:
        lab.start(n, topology)
    except BaseException:
        lab.stop()
        raise
    return lab


@atexit.register
def _stop_all() -> None:
    # Last resort when a test run ends without its fixtures' teardown (e.g. an error in a hook).
    for lab in started:
        lab.stop()
