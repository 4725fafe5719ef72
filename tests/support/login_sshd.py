"""What a Slurm lab's login node sees of tfdeploy's SSH connections (issue 60: one login
connection per run), shared by tests/integration/test_slurm_logins.py and bench/slurm_logins.py.

Nothing but tfdeploy logs in over SSH to the lab's login node (the lab runs Slurm's commands
with nsenter), and its sshd logs at LogLevel VERBOSE: every connection made is an "Accepted
publickey" line, every session refused by MaxSessions a "no more sessions" line. `LoginSshd`
is a second sshd on the login node, the lab's configuration but another port and MaxSessions,
with a log of its own, for the fall-back past MaxSessions.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.lab import Lab, LabError, SlurmCluster

ALT_PORT = 2222


@dataclass(frozen=True)
class Seen:
    """What an sshd logged over some span."""

    text: str

    @property
    def connections(self) -> int:
        return self.text.count("Accepted publickey for")

    @property
    def refused(self) -> int:
        return self.text.count("no more sessions")


class LogSpan:
    """The lines an sshd appends to its log from now on (`seen()`)."""

    def __init__(self, log: Path) -> None:
        self.log = log
        self.start = log.stat().st_size if log.exists() else 0

    def seen(self) -> Seen:
        with self.log.open("rb") as f:
            f.seek(self.start)
            return Seen(f.read().decode(errors="replace"))


@dataclass(frozen=True)
class LoginSshd:
    """A second sshd on the login node: its port, its log, and a known_hosts that has the
    login node's key under that port."""

    port: int
    log: Path
    known_hosts: Path


def lab_log(lab: Lab, cluster: SlurmCluster) -> Path:
    """The log of the login node's own sshd (port 22)."""
    return lab.dir / cluster.login.name / "sshd.log"


@contextmanager
def login_sshd(lab: Lab, cluster: SlurmCluster, max_sessions: int) -> Iterator[LoginSshd]:
    """A second sshd on the login node with MaxSessions `max_sessions`, on ALT_PORT, stopped
    (by its pid inside the host) when the block ends. Its files are in the login node's folder
    of the lab: a lab host's /tmp is its own."""
    login = cluster.login
    here = lab.dir / login.name
    conf = (here / "sshd_config").read_text()
    for key, value in (
        ("ListenAddress", f"0.0.0.0:{ALT_PORT}"),
        ("MaxSessions", str(max_sessions)),
        ("PidFile", str(here / "sshd-alt.pid")),
    ):
        conf, n = re.subn(rf"(?m)^{key} .*$", f"{key} {value}", conf)
        if n != 1:
            raise LabError(f"the login node's sshd_config has {n} {key} lines")
    (here / "sshd-alt.config").write_text(conf)
    log = here / "sshd-alt.log"
    log.unlink(missing_ok=True)
    done = lab.run(login, ["/usr/sbin/sshd", "-f", str(here / "sshd-alt.config"), "-E", str(log)])
    if done.returncode != 0:
        raise LabError(f"the second sshd did not start: {done.stderr.strip()}")
    try:
        deadline = time.monotonic() + 10
        while ALT_PORT not in lab.listening_ports(login):
            if time.monotonic() > deadline:
                raise LabError(f"the second sshd does not listen on {ALT_PORT}")
            time.sleep(0.05)
        yield LoginSshd(ALT_PORT, log, _known_hosts(lab, cluster, here / "known_hosts-alt"))
    finally:
        pid = here / "sshd-alt.pid"
        if pid.exists():  # the listener started above; its sessions end with their connections
            lab.run(login, ["kill", "-TERM", pid.read_text().split()[0]])
            deadline = time.monotonic() + 10
            while ALT_PORT in lab.listening_ports(login) and time.monotonic() < deadline:
                time.sleep(0.05)


def _known_hosts(lab: Lab, cluster: SlurmCluster, path: Path) -> Path:
    """The lab's known_hosts plus the login node's key under [address]:ALT_PORT."""
    lines = lab.known_hosts.read_text().splitlines()
    address = cluster.login.address
    extra = [
        f"[{address}]:{ALT_PORT} {line.split(' ', 1)[1]}"
        for line in lines
        if line.split(" ", 1)[0].split(",")[0] == address
    ]
    path.write_text("\n".join(lines + extra) + "\n")
    return path


def established(lab: Lab, cluster: SlurmCluster, port: int) -> int:
    """The TCP connections to `port` of the login node now (inside its network namespace)."""
    done = lab.run(cluster.login, ["ss", "-Htn", "state", "established", f"( sport = :{port} )"])
    return len([line for line in done.stdout.splitlines() if line.strip()])
