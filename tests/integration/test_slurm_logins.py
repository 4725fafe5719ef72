"""One login connection per run (issue 60) on the lab's Slurm cluster (h1 the login node, h2 and
h3 the compute nodes): the nodes' job steps, the lease keeper and the cluster's commands are
channels on the run's one SSH connection to the login node, another connection opened only past
the login sshd's MaxSessions, and a channel it refuses opened on another connection instead of
failing the run. Counted from the login node's sshd log (tests/support/login_sshd.py): nothing
but tfdeploy logs in there over SSH. bench/slurm_logins.py counts the same at 16 nodes.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.lab import Lab, SlurmCluster
from tests.support.faults import tfdeploy
from tests.support.helpers import to_toml
from tests.support.login_sshd import LogSpan, lab_log, login_sshd

pytestmark = [pytest.mark.lab, pytest.mark.isolated, pytest.mark.slurm_e2e]


def _inventory(
    lab: Lab, slurm: SlurmCluster, tmp_path: Path, *, port: int = 22, known: Path | None = None
) -> Path:
    """Every compute node one worker that runs a few seconds (so every node's agent session is
    open at once), the login node over SSH at `port`."""
    code = tmp_path / "code"
    code.mkdir(exist_ok=True)
    nodes = len(slurm.nodes)
    document = {
        "job": {
            "name": "logins",
            "code": str(code),
            "command": "sleep 3",
            "python": lab.python,
            "require_tensorflow": False,
        },
        "ssh": {
            "user": lab.user,
            "identity": str(lab.key_path),
            "known_hosts": str(known or lab.known_hosts),
            "host_keys": "strict",
            "connect_timeout": 5,
            "port": port,
        },
        "slurm": {
            "login": slurm.login.address,
            "partition": "debug",
            "time": "00:10:00",
            "hosts": [{"nodes": nodes, "tasks": [{"role": "worker"}]}],
        },
    }
    path = tmp_path / "logins.toml"
    path.write_text(to_toml(document))
    return path


def _up(inventory: Path, tmp_path: Path) -> str:
    done = tfdeploy("up", str(inventory), state=tmp_path / "state", timeout=300, check_rc=0)
    said = done.stdout + done.stderr
    assert "job succeeded" in said and "released allocation" in said, said
    return said


def test_a_run_reaches_every_node_over_one_connection_to_the_login_node(
    slurm_lab: Lab, slurm: SlurmCluster, tmp_path: Path
) -> None:
    """Before, each node's steps, the keeper and the cluster's commands had a connection of
    their own: N + 2 = 4 here, 18 at 16 nodes (docs/slurm.md)."""
    span = LogSpan(lab_log(slurm_lab, slurm))
    _up(_inventory(slurm_lab, slurm, tmp_path), tmp_path)
    seen = span.seen()
    assert seen.connections == 1, seen.text
    assert seen.refused == 0


def test_a_session_the_login_node_refuses_goes_over_another_connection(
    slurm_lab: Lab, slurm: SlurmCluster, tmp_path: Path
) -> None:
    """MaxSessions 2 on the login node: the run needs three sessions at once (two agents and
    the keeper), so the pool's tenth-session guess is refused on the first connection and the
    session opened on a second one; the run goes on as on any login node."""
    with login_sshd(slurm_lab, slurm, max_sessions=2) as sshd:
        span = LogSpan(sshd.log)
        _up(
            _inventory(slurm_lab, slurm, tmp_path, port=sshd.port, known=sshd.known_hosts), tmp_path
        )
        seen = span.seen()
    assert seen.refused >= 1, seen.text  # the fall-back was taken, not merely allowed
    # Three sessions at MaxSessions 2 take two connections (the fourth, a command, fits on
    # the second), never one per node and caller as before.
    assert seen.connections == 2, seen.text
