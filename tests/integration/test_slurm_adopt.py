"""`[slurm] reach = "ssh"` on a cluster whose compute nodes admit SSH only through Debian's
`pam_slurm_adopt` (`slurm_adopt_lab`: proctrack/cgroup + task/cgroup, `PrologFlags=contain`,
tests/lab/slurm.py), run as the lab's non-root user, since the module never acts on root.

The module admits a user's session only while a job of theirs runs on the node, and puts it into
that job's `step_extern`, which lasts as long as the job: so what tfdeploy starts over SSH there
outlives every SSH session (an attached run ends with `up`, a detached one with `down`), and a
node without a job of the user refuses the session, which tfdeploy says with the fix. The tasks
are the TF-shaped stand-in (tests/support/standin.py): the subject is how the nodes are reached.
docs/slurm.md, "reach = "ssh" through pam_slurm_adopt", says what this shows.

Each test ends on the `slurm_adopt` fixture's check: squeue empty, no process of a job left.
"""

from __future__ import annotations

import pwd
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.lab import Lab, SlurmCluster
from tests.lab.base import wait_until
from tests.support import standin
from tests.support.faults import Up, tfdeploy
from tests.support.helpers import to_toml
from tests.support.lab_inventories import login_ssh

pytestmark = [pytest.mark.lab, pytest.mark.isolated, pytest.mark.slurm_e2e]

NODES = ("h2", "h3")
# What the module sends before sshd closes the refused connection (OpenSSH shows it at INFO).
NO_JOB = "Access denied by pam_slurm_adopt: you have no active jobs on this node"


@pytest.fixture
def adopt_inventory(
    slurm_adopt_lab: Lab, slurm_adopt: SlurmCluster, tmp_path: Path
) -> Callable[..., Path]:
    """`adopt_inventory(name, steps)`: the stand-in on 2 allocated nodes as one worker each,
    logging in as the lab's non-root user, `reach = "ssh"` (through the login node h1)."""
    lab = slurm_adopt_lab

    def write(name: str, steps: int, interval: float = 0.2) -> Path:
        code = tmp_path / "code"
        standin.write(code)
        document = {
            "job": {
                "name": name,
                "code": str(code),
                "command": f"python3 {standin.NAME} {steps} --interval {interval}",
                "python": lab.python,
                "stop_grace": 2,
            },
            "ssh": login_ssh(lab, lab.login_user),
            "slurm": {
                "login": slurm_adopt.login.address,
                "partition": "debug",
                "time": "00:10:00",
                "reach": "ssh",
                "hosts": [{"nodes": 2, "tasks": [{"role": "worker"}]}],
            },
        }
        path = tmp_path / f"{name}.toml"
        path.write_text(to_toml(document))
        return path

    return write


def _ours(slurm: SlurmCluster, name: str) -> list[str]:
    """The job ids of the job's allocations squeue still lists."""
    return slurm.check(f"squeue -h -n tfdeploy-{name} -o %i").split()


def _standins(lab: Lab, node: str) -> list[tuple[int, str]]:
    """(pid, user) of the stand-in tasks running on the node."""
    return [(p.pid, p.user) for p in lab.processes(node) if standin.NAME in p.cmdline]


def _freezer(lab: Lab, node: str, pid: int) -> str:
    """The process's freezer cgroup on the node: where proctrack/cgroup counts it."""
    text = lab.run(node, ["cat", f"/proc/{pid}/cgroup"]).stdout
    (line,) = [line for line in text.splitlines() if ":freezer:" in line]
    return line.split(":", 2)[2]


def _in_step_extern(lab: Lab, job_id: str) -> None:
    """On both nodes one stand-in runs, as the login user, in the job's `step_extern`: the
    cgroup pam_slurm_adopt put its SSH session into (an SSH session the module did not adopt
    is in no cgroup of Slurm's, docs/slurm.md (e))."""
    user = pwd.getpwnam(lab.login_user)
    for node in NODES:
        found = _standins(lab, node)
        assert [u for _, u in found] == [user.pw_name], (node, found)
        cgroup = _freezer(lab, node, found[0][0])
        assert cgroup.endswith(f"/slurm_{node}/uid_{user.pw_uid}/job_{job_id}/step_extern"), (
            node,
            cgroup,
        )


def _sessions(lab: Lab, user: str) -> dict[str, list[str]]:
    """The user's sshd session processes (`sshd: USER@notty`, `sshd: USER [priv]`) per host."""
    found = {}
    for h in lab.hosts:
        mine = [p.cmdline for p in lab.processes(h) if p.cmdline.startswith(f"sshd: {user}")]
        if mine:
            found[h.name] = mine
    return found


def _ssh(lab: Lab, host: str, user: str, command: str = "true") -> subprocess.CompletedProcess[str]:
    """Plain OpenSSH with the lab's key as `user`; LogLevel INFO shows a refusal's banner."""
    argv = lab.ssh_argv(host, command, user=user)
    argv[1:1] = ["-o", "LogLevel=INFO"]
    return subprocess.run(argv, capture_output=True, text=True, timeout=30)


def test_pam_slurm_adopt_admits_a_user_only_on_a_node_with_a_job_of_theirs(
    slurm_adopt_lab: Lab, slurm_adopt: SlurmCluster
) -> None:
    """The lab as the module makes it: the login user's key is refused by a compute node where
    they have no job, in the module's words, while the same key logs in to the login node (no
    pam_slurm_adopt there) and root logs in to the node (the module never acts on root); with a
    job of theirs on h2 the session is admitted there, into that job's `step_extern`, and h3,
    outside the job, still refuses it."""
    lab = slurm_adopt_lab
    user = lab.login_user
    refused = _ssh(lab, "h2", user)
    assert refused.returncode == 255 and NO_JOB in refused.stderr, refused
    assert _ssh(lab, "h1", user).returncode == 0
    assert _ssh(lab, "h2", "root").returncode == 0
    job = slurm_adopt.sbatch(
        f"--uid={user} --gid={user} -N1 -w h2 -t 5 -o /dev/null "
        f"--chdir={slurm_adopt.shared} --wrap 'exec sleep 600'"
    )
    try:
        slurm_adopt.wait_job(job, "RUNNING", timeout=30)
        # The job's extern step on h2 (its stepd, which the module asks) is up once the step's
        # own process runs in its cgroup.
        wait_until(
            f"job {job}'s extern step on h2",
            lambda: any(
                _freezer(lab, "h2", p.pid).endswith(f"/job_{job}/step_extern")
                for p in lab.processes("h2")
                if p.cmdline.startswith("sleep")
            ),
            timeout=30,
            interval=0.1,
        )
        admitted = _ssh(lab, "h2", user, "cat /proc/self/cgroup")
        assert admitted.returncode == 0, admitted
        uid = pwd.getpwnam(user).pw_uid
        assert f"/slurm_h2/uid_{uid}/job_{job}/step_extern" in admitted.stdout, admitted.stdout
        elsewhere = _ssh(lab, "h3", user)
        assert elsewhere.returncode == 255 and NO_JOB in elsewhere.stderr, elsewhere
    finally:
        slurm_adopt.check(f"scancel {job}")
    wait_until(f"job {job} to leave squeue", lambda: not slurm_adopt.jobs(), timeout=30)
    again = _ssh(lab, "h2", user)  # the job ended: its node is no longer the user's
    assert again.returncode == 255 and NO_JOB in again.stderr, again


@pytest.mark.slow
def test_an_attached_run_reaches_its_nodes_through_pam_slurm_adopt_and_leaves_nothing(
    slurm_adopt_lab: Lab,
    slurm_adopt: SlurmCluster,
    adopt_inventory: Callable[..., Path],
    tmp_path: Path,
) -> None:
    """(a) An attached `up` as the non-root user runs a task on each of two nodes, their
    processes in the allocation's `step_extern` (adopted), exits 0 and releases the
    allocation: squeue empty, nothing left on any host."""
    name = "adopt-attached"
    up = Up(adopt_inventory(name, steps=40), state=tmp_path / "state")
    try:
        up.wait_for(r"worker:0@h2 \| step 3\b", timeout=180)
        up.wait_for(r"worker:1@h3 \| step 3\b", timeout=60)
        (job_id,) = _ours(slurm_adopt, name)
        _in_step_extern(slurm_adopt_lab, job_id)
    finally:
        code = up.finish(timeout=180)
    out = up.stdout + up.stderr
    assert code == 0, out
    assert "runs on h2, h3" in out, out
    assert "worker 0 done at step 40" in out and "worker 1 done at step 40" in out, out
    assert "job succeeded" in out and f"released allocation {job_id}" in out, out
    assert _ours(slurm_adopt, name) == []
    assert slurm_adopt.leftovers() == {}


@pytest.mark.slow
def test_a_detached_run_outlives_every_ssh_session_of_up_and_down_ends_it(
    slurm_adopt_lab: Lab,
    slurm_adopt: SlurmCluster,
    adopt_inventory: Callable[..., Path],
    tmp_path: Path,
) -> None:
    """(b) `up --detach` as the non-root user: once every SSH session of the `up` has ended on
    every host, both tasks still run in the allocation's `step_extern` and go on saving steps;
    `status` from a fresh shell shows them running; `down` exits 0, releases the allocation,
    and nothing is left on any host."""
    lab = slurm_adopt_lab
    name = "adopt-detached"
    inventory = adopt_inventory(name, steps=3000)  # 10 minutes: `down` ends it
    up = tfdeploy("up", "--detach", str(inventory), state=tmp_path / "a", timeout=300, check_rc=0)
    found = re.search(r"run (\S+) is running detached", up.stdout)
    assert found, up.stdout
    run_id = found[1]
    (job_id,) = _ours(slurm_adopt, name)
    wait_until(
        "every SSH session of the up to end",
        lambda: not _sessions(lab, lab.login_user),
        timeout=60,
        interval=0.1,
    )
    _in_step_extern(lab, job_id)
    home = pwd.getpwnam(lab.login_user).pw_dir
    ckpt = f"{home}/.tfdeploy/hosts/*/runs/{run_id}/code/ckpt"
    for node, task in zip(NODES, ("worker:0", "worker:1"), strict=True):
        then = standin.step_on(lab, node, run_id, task, folder=ckpt)
        wait_until(
            f"{task} on {node} to save a later step than {then}",
            lambda node=node, task=task, then=then: (
                standin.step_on(lab, node, run_id, task, folder=ckpt) > then
            ),
            timeout=30,
            interval=0.2,
        )
    status = tfdeploy("status", str(inventory), state=tmp_path / "b", timeout=120, check_rc=0)
    assert f"Slurm allocation {job_id} (running" in status.stdout, status.stdout
    for node, task in zip(NODES, ("worker:0", "worker:1"), strict=True):
        assert re.search(rf"{task}\W+{node}\W+\d+\W+running\b", status.stdout), status.stdout
    down = tfdeploy("down", str(inventory), state=tmp_path / "c", timeout=180, check_rc=0)
    assert f"released allocation {job_id}" in down.stdout + down.stderr, down.stdout
    wait_until("the allocation to leave squeue", lambda: not _ours(slurm_adopt, name), timeout=60)
    assert slurm_adopt.leftovers() == {}


@pytest.mark.slow
def test_a_node_that_refuses_tfdeploys_session_is_named_with_the_cause_and_the_fix(
    slurm_adopt_lab: Lab,
    slurm_adopt: SlurmCluster,
    adopt_inventory: Callable[..., Path],
    tmp_path: Path,
) -> None:
    """(c) Once a run's allocation has ended its nodes refuse the user's SSH: `pull` of that
    run fails (exit 3) naming each node, the cause (its pam_slurm_adopt admits only users with a
    job there, in the module's words) and what to do, never as a bad key or a traceback."""
    lab = slurm_adopt_lab
    name = "adopt-refused"
    up = tfdeploy(
        "up",
        str(adopt_inventory(name, steps=3, interval=0.1)),
        state=tmp_path / "a",
        timeout=300,
        check_rc=0,
    )
    found = re.search(r"tfdeploy logs (\S+)", up.stdout + up.stderr)
    assert found, up.stdout
    assert _ours(slurm_adopt, name) == []  # released: the nodes are no longer the user's
    pulled = tfdeploy(
        "pull",
        found[1],
        "ckpt/**",
        "--to",
        str(tmp_path / "pulled"),
        state=tmp_path / "a",
        timeout=120,
    )
    said = " ".join(pulled.stderr.split())
    assert pulled.returncode == 3, pulled.stdout + pulled.stderr
    user = lab.login_user
    for node in NODES:
        address = lab.host(node).address
        assert (
            f"{node}: {address} refused {user}'s SSH session: the node's pam_slurm_adopt admits "
            "only users with a Slurm job running on it" in said
        ), said
    assert f"the node says: {NO_JOB}" in said, said
    # One hint for both nodes (the CLI joins equal hints): the fix.
    assert f"hint: h2 and h3: SSH reaches a Slurm node only while a job of {user}'s runs" in said
    assert "tfdeploy status INVENTORY" in said and "tfdeploy up" in said, said
    assert "authentication failed" not in said and "authorized_keys" not in said, said
    assert "Traceback" not in pulled.stderr, pulled.stderr
