"""What both tiers share: a private state folder, the markers (`lab` by fixture or by folder,
`starts_tf` checked against a scan of the test (tests/support/tf_use.py), `needs_tf`, `isolated`,
`vagrant`, `slow`), the in-process tier's default workers, the lab-leftover
check after a session, moto's EC2 and the host agent's workdir. The lab's own fixtures are in
tests/integration/conftest.py.

tests/unit/ runs in-process (no sshd, no root); every test in tests/integration/ is marked `lab`.
"""

from __future__ import annotations

import compileall
import contextlib
import importlib.util
import itertools
import json
import os
import random
import secrets
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import tests.lab
from tests.lab import cleanup
from tests.support import budget, image_jobs, layout, tf_use
from tests.support.agent import call, ticks

CHECKOUT = Path(__file__).resolve().parent.parent


def _this_checkout_first() -> None:
    """Every process the tests start (`python -m deployer`, the agent, `tfdeploy`) imports this
    checkout's code, whatever is installed in the venv: pytest itself puts the checkout first on
    its own sys.path, and this does the same for children. Two clones on one machine, sharing one
    venv, each test their own code (docs/testing.md, "Side by side")."""
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if parts[:1] != [str(CHECKOUT)]:
        os.environ["PYTHONPATH"] = os.pathsep.join([str(CHECKOUT), *parts])


_this_checkout_first()


@pytest.fixture(autouse=True, scope="session")
def _private_state_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """No test writes the developer's own state folder (run records, the code's hash cache);
    a test that needs its own sets TFDEPLOY_STATE_DIR over this one."""
    patch = pytest.MonkeyPatch()
    patch.setenv("TFDEPLOY_STATE_DIR", str(tmp_path_factory.mktemp("state")))
    yield
    patch.undo()


@pytest.fixture(autouse=True)
def _in_its_tier(request: pytest.FixtureRequest) -> None:
    """A test in the wrong tier (tests/support/layout.py) errors, saying where it belongs: the
    tier check of every session, on what it collected. So does a test whose `starts_tf` marking
    is wrong, in a pytest-xdist worker (elsewhere its collection already failed)."""
    for key in (layout.MISPLACED, tf_use.WRONG):
        problem = request.node.stash.get(key, None)
        if problem is not None:
            pytest.fail(problem, pytrace=False)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--run-slow",
        action="store_true",
        help="also run the in-process tier's tests marked slow (scripts/test.sh passes it)",
    )
    budget.add_options(parser)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """The in-process tier (`pytest -m "not lab"`, or `pytest tests/unit`) runs on one worker more
    than there are cores when pytest-xdist is installed and `-n` was not given: its tests share
    nothing, and much of its time is real agent processes, leases and watchdogs waiting, which a
    spare worker overlaps. Anything else (the lab tier: one lab per run) stays serial; `-n 0` or
    `-p no:xdist` turns it off.

    And SIGINT is heard: a shell that starts a command in the background (`cmd &` in a script)
    starts it with SIGINT ignored, which stays ignored across exec, so every tfdeploy the tests
    start would shrug off the SIGINT that stands for Ctrl-C (a pull left running filled a
    disk). A handler here is reset to the default in each child, as in a terminal."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if not hasattr(config, "workerinput"):
        _compile_the_code()
    budget.install(config)
    cores = os.cpu_count() or 1
    if (
        _in_process_only(config)
        and not hasattr(config, "workerinput")  # a worker itself
        and config.pluginmanager.hasplugin("xdist")
        and getattr(config.option, "numprocesses", None) is None
        and cores > 1
    ):
        config.option.numprocesses = cores + 1
        config.option.dist = "load"
        config.option.tx = ["popen"] * (cores + 1)  # what xdist derives from -n, before configure


def _compile_the_code() -> None:
    """Bytecode for deployer/ and remote/, as pip leaves an installed tfdeploy (bench/report.py
    does the same): the tests start hundreds of `tfdeploy` and agent processes, and under
    PYTHONDONTWRITEBYTECODE=1 (container images often set it) each would compile its modules
    again. Up-to-date files are skipped; a folder that cannot be written is left as it is."""
    root = Path(__file__).resolve().parent.parent
    for package in ("deployer", "remote"):
        compileall.compile_dir(root / package, quiet=2)


def _in_process_only(config: pytest.Config) -> bool:
    """The run selects the in-process tier only: by marker, or by naming tests/unit/ paths."""
    if (config.option.markexpr or "").strip() == "not lab":
        return True
    unit = Path(__file__).resolve().parent / "unit"
    paths = [Path(a.split("::")[0]).resolve() for a in config.args]
    return bool(paths) and all(p == unit or unit in p.parents for p in paths)


SLOW_SKIP = (
    "slow: the in-process tier skips it by default; scripts/test.sh, `--run-slow` or "
    "`-m slow` runs it (docs/testing.md)"
)


def _skips_slow(config: pytest.Config) -> bool:
    """A run of the in-process tier alone (`pytest tests/unit`, `pytest -m "not lab"`) is the
    inner loop: it leaves out what is marked `slow` (TensorFlow started, a gigabyte moved,
    100,000 files made) unless `--run-slow` was given or the marker expression names `slow`.
    Every other run (the whole suite, a lab file) runs them."""
    if config.getoption("--run-slow") or "slow" in (config.option.markexpr or ""):
        return False
    return _in_process_only(config)


LAB_FIXTURES = {
    "lab",
    "bastion_lab",
    "clean_lab",
    "lab_inventory",
    "lab_user_inventory",
    "lab_shared_home",
    "slurm_lab",
    "slurm",
    "slurm_cgroup_lab",
    "slurm_cgroup",
    "slurm_adopt_lab",
    "slurm_adopt",
}
# Every test of this folder needs real hosts: the lab's sshd hosts (or, marked `vagrant`, VMs).
INTEGRATION = Path(__file__).resolve().parent / "integration"


# Under xdist (`-n N`, scripts/test.sh) each worker is a pytest session with its own labs (labs
# coexist by id: their own namespaces, links, subnets and directories), built when a test of that
# worker first asks for one: the 8-host `lab`, and the container and bastion labs. Tests are dealt
# out one by one (`--dist worksteal`, scripts/test.sh): grouping the tests of a costly lab on
# one worker (xdist's loadgroup) does not work with pytest 9 (xdist renames items through
# `_nodeid`, which pytest 9 no longer reads), and those labs take seconds, less than the
# imbalance a group would cause.


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # A test that asks for a lab fixture needs the lab, marked or not, and so does every test in
    # tests/integration/: `-m "not lab"` must never start sshd hosts, and selects tests/unit/.
    # A `starts_tf` or `needs_tf` test skips with a reason where TensorFlow is missing; every
    # test's `starts_tf` marking is checked against what it shows (tests/support/tf_use.py).
    wrong = tf_use.problems(items)
    if wrong and not hasattr(config, "workerinput"):
        raise pytest.UsageError(
            "the starts_tf marker does not say what these tests do (tests/support/tf_use.py, "
            'docs/testing.md, "TensorFlow in the tests"):\n  ' + "\n  ".join(wrong)
        )
    has_tf = importlib.util.find_spec("tensorflow") is not None
    install = "pip install tensorflow-cpu, or the examples extra: pip install -e '.[examples]'"
    no_tf = pytest.mark.skip(reason=f"starts TensorFlow, not installed here ({install})")
    # Booting VMs takes ~9 minutes without KVM: only a run that asks for it (`-m vagrant`).
    vagrant_asked = "vagrant" in (config.option.markexpr or "")
    no_vagrant = pytest.mark.skip(
        reason="boots VMs: run with `pytest -m vagrant` (docs/testing.md)"
    )
    # Keras 3 on JAX across two lab hosts costs minutes of CPU: only a run that asks for it.
    frameworks_asked = "frameworks" in (config.option.markexpr or "")
    no_frameworks = pytest.mark.skip(
        reason="trains Keras 3 on JAX: run with `pytest -m frameworks` (docs/testing.md)"
    )
    # Measurements of plain Slurm that docs/slurm.md's design rests on, with wall-time waits
    # that a loaded machine can upset: only a run that asks for them.
    measure_asked = "slurm_measure" in (config.option.markexpr or "")
    no_measure = pytest.mark.skip(
        reason="measures plain Slurm with wall-time waits: run with `pytest -m slurm_measure`"
    )
    no_slow = pytest.mark.skip(reason=SLOW_SKIP) if _skips_slow(config) else None
    for item in items:
        if "vagrant" in item.keywords and not vagrant_asked:
            item.add_marker(no_vagrant)
        if "frameworks" in item.keywords and not frameworks_asked:
            item.add_marker(no_frameworks)
        if "slurm_measure" in item.keywords and not measure_asked:
            item.add_marker(no_measure)
        if no_slow is not None and "slow" in item.keywords:
            item.add_marker(no_slow)
        needs_lab = LAB_FIXTURES & set(getattr(item, "fixturenames", ()))
        if needs_lab or item.path.resolve().is_relative_to(INTEGRATION):
            item.add_marker(pytest.mark.lab)
        if not has_tf and item.get_closest_marker(tf_use.STARTS) is not None:
            item.add_marker(no_tf)
        elif not has_tf and (needs := item.get_closest_marker(tf_use.NEEDS)) is not None:
            why = needs.kwargs.get("reason") or "needs TensorFlow installed"
            item.add_marker(pytest.mark.skip(reason=f"{why}; not installed here ({install})"))
    layout.mark_misplaced(items)  # after the marking above: `_in_its_tier` fails them
    # Every `isolated` test skips with a reason on the loopback fallback, never silently passes.
    if tests.lab.lab_mode() == "netns":
        return
    reason = (
        "needs the namespace lab (root); TFDEPLOY_LAB=loopback or no root gives "
        "the loopback fallback without isolation or faults"
    )
    for item in items:
        marker = item.get_closest_marker("isolated")
        if marker is not None:
            why = marker.kwargs.get("reason")  # `@pytest.mark.isolated(reason=...)`: what for
            item.add_marker(pytest.mark.skip(reason=f"{reason}: {why}" if why else reason))


@pytest.hookimpl(wrapper=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> Iterator[None]:
    # After fixture teardown (the runner's own sessionfinish): fail the run if a lab left
    # anything behind, since later runs and other people's labs would trip over it.
    result = yield
    for the_lab in tests.lab.started:
        the_lab.stop()
    images_left = image_jobs.remove_run_image(session.config)  # the controller's: workers done
    problems = _residue()
    deadline = time.monotonic() + 5
    while problems and time.monotonic() < deadline:
        # A killed host's last zombie may wait a moment for the machine's init to reap it.
        time.sleep(0.1)
        problems = _residue()
    problems += images_left
    if problems:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(
                "LAB LEFTOVERS after the session:\n  " + "\n  ".join(problems), red=True
            )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    return result


def _residue() -> list[str]:
    problems = []
    for the_lab in tests.lab.started:
        inodes: set[int] = getattr(the_lab, "ns_inodes", set())
        found = cleanup.residue(the_lab.id, ns_inodes=inodes)
        problems += [f"lab {the_lab.id}: {item}" for item in found]
    return problems


# ---- moto's EC2 (test_aws*.py) -------------------------------------------------------------

AWS_REGION = "us-east-1"


@pytest.fixture(scope="module")
def _moto() -> Iterator[None]:
    """One moto (AWS stand-in) per test module: its EC2 backend is slow to load, per start."""
    from moto import mock_aws

    with mock_aws():
        yield


@pytest.fixture
def ec2(_moto: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Any]:
    """moto's EC2 with fake credentials; no profile or config of this machine is read. Every
    instance a test launched is terminated after it (discovery sees running ones only)."""
    for name in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_DEFAULT_REGION", "AWS_REGION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("TFDEPLOY_STATE_DIR", str(tmp_path / "state"))
    import boto3
    from moto.ec2.models import elastic_network_interfaces as moto_eni

    # moto draws public IPs at random from 65,025; EC2 never gives two running instances one,
    # and a repeat (about 1 run in 1,000 for 12 instances) makes discovery refuse a duplicate.
    unique = (f"54.214.{n // 250}.{n % 250 + 1}" for n in itertools.count(random.randrange(9999)))
    monkeypatch.setattr(moto_eni, "random_public_ip", lambda: next(unique))

    client = boto3.client("ec2", region_name=AWS_REGION)
    yield client
    alive = [
        i["InstanceId"]
        for r in client.describe_instances()["Reservations"]
        for i in r["Instances"]
        if i["State"]["Name"] != "terminated"
    ]
    if alive:
        client.terminate_instances(InstanceIds=alive)


# ---- the host agent on this machine (test_agent*.py, test_shared_workdir, test_spot_idle) -----


@pytest.fixture
def workdir(tmp_path: Path) -> Iterator[Path]:
    """A host workdir; every process any run started, on any simulated host, is gone after it."""
    wd = tmp_path / "wd"
    yield wd
    for run_dir in wd.glob("hosts/*/runs/*"):
        if (run_dir / "run.json").exists():
            host = run_dir.parent.parent.name
            call(wd, "stop", host=host, run_id=run_dir.name, tasks=None, grace=0)
        for pid_file in run_dir.glob("tasks/*/pid.json"):
            pids = json.loads(pid_file.read_text())
            if ticks(pids["supervisor"]) == pids["supervisor_ticks"]:
                os.kill(pids["supervisor"], signal.SIGKILL)
            if ticks(pids["pgid"]) in (None, pids["start_ticks"]):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pids["pgid"], signal.SIGKILL)


@pytest.fixture
def run_id() -> str:
    """Unique per test: the stray scan matches it on every process of this machine's user."""
    return f"bounds-{os.getpid()}-{secrets.token_hex(4)}"
