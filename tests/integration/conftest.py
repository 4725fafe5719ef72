"""The lab tier's fixtures: the SSH lab (real sshd hosts) and helpers to write inventories for it.

Every test in this folder is marked `lab` (tests/conftest.py), whatever fixtures it asks for.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType

import pytest

import tests.lab
from tests.lab import Lab, LabUnsupported, SlurmCluster, cleanup, pythons, start_lab
from tests.lab import containers as lab_containers
from tests.support.lab_inventories import inventory_writer


def _sigterm(signum: int, frame: FrameType | None) -> None:
    # A CI timeout or `kill` sends SIGTERM: turn it into an interrupt so fixtures tear down.
    raise KeyboardInterrupt(f"signal {signum}")


@pytest.fixture(scope="session")
def lab() -> Iterator[Lab]:
    """8 flat hosts for the whole session; always stopped, also on failures and Ctrl-C."""
    yield from _lab_session(8, "flat")


@pytest.fixture(scope="session")
def bastion_lab() -> Iterator[Lab]:
    """2 private hosts behind a dual-homed bastion; built only when a test asks for it."""
    yield from _lab_session(2, "bastion")


@pytest.fixture(scope="session")
def container_lab() -> Iterator[Lab]:
    """3 flat container hosts (tests/lab/containers.py): podman as root in each, each host with
    its own image store; skips where podman cannot run (not root, not installed)."""
    reason = lab_containers.available()
    if reason is not None:
        pytest.skip(reason)
    yield from _lab_session(3, "flat", containers=True)


@pytest.fixture
def clean_container_lab(container_lab: Lab) -> Iterator[Lab]:
    """The container lab, checked after the test: no process, port, tfdeploy container (of any
    run, found by label) or mount of a host's image store left on any host."""
    yield container_lab
    left = container_lab.leftovers_of(container_lab.hosts)
    assert not left, f"the test left containers, processes or mounts on lab hosts: {left}"


def _lab_session(
    n: int,
    topology: str,
    *,
    containers: bool = False,
    slurm: bool = False,
    slurm_proctrack: str = "cgroup",
    slurm_adopt: bool = False,
) -> Iterator[Lab]:
    if tests.lab.lab_mode() == "netns":
        cleanup.clean_stale()  # namespaces and links of an earlier run that was SIGKILLed
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _sigterm)
    try:
        the_lab = start_lab(
            n,
            topology,
            containers=containers,
            slurm=slurm,
            slurm_proctrack=slurm_proctrack,
            slurm_adopt=slurm_adopt,
        )
    except LabUnsupported as e:  # the bastion topology on loopback: its tests skip, saying why
        pytest.skip(str(e))
    try:
        yield the_lab
    finally:
        the_lab.stop()


PROCTRACKS = ("cgroup", "linuxproc")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A test on the Slurm lab runs on proctrack/cgroup, as production clusters run Slurm; one
    marked `both_trackings` runs on proctrack/linuxproc too, which follows the process tree
    instead: the tests whose subject is which processes Slurm counts as a job's (issue 60).
    Every other test would check the same tfdeploy code twice (issue 61)."""
    if "slurm_lab" in metafunc.fixturenames:
        both = metafunc.definition.get_closest_marker("both_trackings") is not None
        trackings = PROCTRACKS if both else PROCTRACKS[:1]
        metafunc.parametrize("slurm_lab", trackings, indirect=True, scope="session")


@pytest.fixture(scope="session")
def slurm_lab(request: pytest.FixtureRequest) -> Iterator[Lab]:
    """A real Slurm cluster (tests/lab/slurm.py): h1 the login node (slurmctld, munged), h2 and
    h3 compute nodes (slurmd, 2 CPUs and 2 fake GPUs each), partitions `debug` and `urgent`
    (urgent preempts). Its SlurmCluster is `slurm_lab.slurm`; skips where Slurm is not
    installed or there is no root. Process tracking is proctrack/cgroup + task/cgroup
    (`ConstrainCores`), as production clusters run Slurm; a test marked `both_trackings` also
    runs with proctrack/linuxproc (`pytest_generate_tests` above)."""
    proctrack = getattr(request, "param", PROCTRACKS[0])
    yield from _lab_session(3, "flat", slurm=True, slurm_proctrack=proctrack)


@pytest.fixture
def slurm(slurm_lab: Lab) -> Iterator[SlurmCluster]:
    """The Slurm lab's cluster, checked after the test: squeue empty and no process of a job on
    any host (it waits out KillWait). What a failing test left is then cancelled, killed and the
    nodes healed, so the next test starts on an idle cluster."""
    yield from _checked(slurm_lab)


@pytest.fixture
def slurm_cgroup_lab(slurm_lab: Lab) -> Lab:
    """`slurm_lab` as production clusters run Slurm: `ProctrackType=proctrack/cgroup`,
    `TaskPlugin=task/cgroup`, each compute host on its own cgroup v1 subtree of this machine's
    hierarchies (tests/lab/slurm.py); what a step starts dies when the step ends. The same lab
    as `slurm_lab`'s default, for the tests whose subject is cgroup tracking itself."""
    cluster = slurm_lab.slurm
    assert isinstance(cluster, SlurmCluster) and cluster.proctrack == "cgroup", cluster
    return slurm_lab


@pytest.fixture
def slurm_cgroup(slurm_cgroup_lab: Lab) -> Iterator[SlurmCluster]:
    """The cgroup lab's cluster, checked after the test as `slurm` is."""
    yield from _checked(slurm_cgroup_lab)


@pytest.fixture(scope="session")
def slurm_adopt_lab() -> Iterator[Lab]:
    """`slurm_cgroup_lab` with the compute nodes' sshd behind Debian's pam_slurm_adopt
    (tests/lab/slurm.py, `adopt`): `PrologFlags=contain`, `UsePAM yes` and the lab's PAM stack
    on h2 and h3 only. The lab's non-root user (`slurm_adopt_lab.login_user`, its own home on
    each host) may SSH to a node only while a job of theirs runs there, and the session joins
    that job's `step_extern`; root and the login node h1 are not behind it. Skips where Slurm,
    the cgroup v1 hierarchies or libpam-slurm-adopt are missing, or there is no root."""
    yield from _lab_session(3, "flat", slurm=True, slurm_proctrack="cgroup", slurm_adopt=True)


@pytest.fixture
def slurm_adopt(slurm_adopt_lab: Lab) -> Iterator[SlurmCluster]:
    """The adopt lab's cluster, checked after the test as `slurm` is (the login user's jobs
    included)."""
    yield from _checked(slurm_adopt_lab)


def _checked(slurm_lab: Lab) -> Iterator[SlurmCluster]:
    cluster = slurm_lab.slurm
    assert isinstance(cluster, SlurmCluster)
    cluster.heal()
    yield cluster
    left = cluster.leftovers()
    if left:
        cluster.cancel_all()
        for h in slurm_lab.hosts:
            slurm_lab.kill_leftovers(h)
    cluster.heal()
    assert not left, f"the test left Slurm jobs or processes behind: {left}"


@pytest.fixture
def lab_inventory(lab: Lab, tmp_path: Path) -> Callable[..., Path]:
    """`lab_inventory(tasks, code=, job=, ssh=, hosts=, user=, per_host=)`: one in tmp_path.

    Logs in as `lab.user` (root in the namespace lab) unless `user` says otherwise; `per_host`
    adds keys to hosts' entries by name, e.g. {"h1": {"python": lab_python("3.9")}}.
    """
    return inventory_writer(lab, tmp_path, lab.user)


@pytest.fixture
def lab_user_inventory(lab: Lab, tmp_path: Path) -> Callable[..., Path]:
    """Like `lab_inventory`, logging in as the lab's non-root user (`lab.login_user`).

    In the namespace lab each host gives that user a private home (a tmpfs) unless
    `lab_shared_home` is in use; on loopback it is the runner's own user and home.
    """
    return inventory_writer(lab, tmp_path, lab.login_user)


@pytest.fixture
def lab_shared_home(lab: Lab) -> Iterator[Path]:
    """For this test, one directory is `lab.login_user`'s home on every host (NFS/EFS-like).

    Yields the directory as this machine sees it; afterwards hosts get private homes again.
    """
    try:
        shared = lab.shared_home()
    except LabUnsupported as e:
        pytest.skip(str(e))
    with shared as path:
        yield path


@pytest.fixture(scope="session")
def lab_python() -> Callable[[str], str]:
    """`lab_python("3.9")`: path of a CPython 3.9 lab hosts can run; skips if there is none.

    The first use of a version copies the machine's pyenv build to /opt/tfdeploy/pythons
    (~2 s, kept for later runs); see tests/lab/pythons.py.
    """

    def get(minor: str) -> str:
        try:
            return pythons.host_python(minor).path
        except LabUnsupported as e:
            pytest.skip(str(e))

    return get


@pytest.fixture
def clean_lab(lab: Lab) -> Iterator[Lab]:
    """The lab, checked after the test: nothing of the test may still run or listen on any host."""
    yield lab
    left = lab.leftovers_of(lab.hosts)  # every host, in one pass over /proc (tests/lab/base.py)
    assert not left, f"the test left processes or ports behind on lab hosts: {left}"
