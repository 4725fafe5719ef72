"""`up` with `requirements` on lab hosts that reach nothing outside (issue 41): the environment
is resolved here from a local index, sent with the code, installed once per host, and the one
the tasks run in; preflight refuses a task's other Python, and a requirement with no wheel.

Never touches PyPI: the wheels are built here (tests/support/wheels.py) and this machine's pip
is pointed at a folder of them through PIP_* variables of the test's own.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.lab import VENV_PYTHON, Lab
from tests.support.agent import call, ok
from tests.support.lab_cli import tfdeploy
from tests.support.wheels import make_wheel

BASE = "/usr/bin/python3"  # the hosts' system Python: no tinypkg, no TensorFlow

TRAIN = """\
import os, sys
import tinypkg, tinydep
print("prefix", sys.prefix, "venv", os.environ.get("VIRTUAL_ENV"), "tinypkg", tinypkg.VALUE)
"""


@pytest.fixture
def index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder of wheels that this machine's pip (and only it) resolves from."""
    wheels = tmp_path / "index"
    make_wheel(wheels, "tinypkg", requires=["tinydep"])
    make_wheel(wheels, "tinydep", "2.0")
    make_wheel(wheels, "onlyarm", "1.0", tag="cp311-cp311-manylinux_2_17_aarch64")
    for name, value in {
        "PIP_CONFIG_FILE": "/dev/null",
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(wheels),
        "PIP_CACHE_DIR": str(tmp_path / "pip-cache"),
    }.items():
        monkeypatch.setenv(name, value)
    return wheels


def _code(tmp_path: Path, requirements: str) -> Path:
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text(TRAIN)
    (code / "requirements.txt").write_text(requirements)
    return code


def test_requirements_reach_isolated_hosts_once_and_tasks_run_in_the_venv(
    lab: Lab, lab_inventory: Callable[..., Path], tmp_path: Path, index: Path
) -> None:
    code = _code(tmp_path, "tinypkg==1.0\n")
    job: dict[str, Any] = {
        "python": BASE,
        "requirements": "requirements.txt",
        "require_tensorflow": False,
    }
    inventory = lab_inventory([[{"role": "worker"}], [{"role": "worker"}]], code=code, job=job)
    state = tmp_path / "state"
    before = tfdeploy("plan", str(inventory), state=state, check_rc=0).stdout
    assert before.count("(requirements.txt): resolved at up") == 2, before  # no host asked yet
    first = tfdeploy("up", str(inventory), state=state, check_rc=0)
    out = first.stdout
    # (a) each task imported tinypkg from the job's venv, which is activated
    found = re.findall(r"prefix (\S+) venv (\S+) tinypkg 1.0", out)
    assert len(found) == 2, out
    for prefix, venv in found:
        assert prefix == venv and "/envs/" in venv, out
    assert "environment built on" in out, out
    # (b) the same job again: no wheel byte sent, nothing reinstalled
    second = tfdeploy("up", str(inventory), state=state, check_rc=0).stdout
    assert "0 bytes sent, every file was already there" in second, second
    assert "environment reused on" in second and "environment built" not in second, second
    assert len(re.findall(r"prefix (\S+) venv \1 tinypkg 1.0", second)) == 2, second
    # plan, touching no host, now names each host's environment: hash, platform, wheels
    after = tfdeploy("plan", str(inventory), state=state, check_rc=0).stdout
    known = re.findall(
        r"\(requirements.txt\): ([0-9a-f]{12}), CPython 3\.\d+, (\S+), \d+ wheels?, ", after
    )
    assert len(known) == 2 and "resolved here" in after, after


def test_a_requirement_without_a_wheel_for_the_hosts_platform_starts_nothing(
    lab: Lab, lab_inventory: Callable[..., Path], tmp_path: Path, index: Path
) -> None:
    code = _code(tmp_path, "onlyarm==1.0\n")
    job = {"python": BASE, "requirements": "requirements.txt", "require_tensorflow": False}
    inventory = lab_inventory([[{"role": "worker"}]], code=code, job=job)
    result = tfdeploy("up", str(inventory), state=tmp_path / "state", check_rc=3)
    said = result.stdout + result.stderr
    assert "onlyarm==1.0: no wheel for CPython 3.11, manylinux" in said, said
    assert "x86_64" in said and "Traceback" not in said, said
    assert "pushed" not in said and "starting" not in said, said


def test_a_dependency_conflict_is_said_in_pips_words_and_starts_nothing(
    lab: Lab, lab_inventory: Callable[..., Path], tmp_path: Path, index: Path
) -> None:
    for name, need in (("left", "shared<2"), ("right", "shared>=2")):
        make_wheel(index, name, "1.0", requires=[need])
    for version in ("1.0", "2.0"):
        make_wheel(index, "shared", version)
    code = _code(tmp_path, "left==1.0\nright==1.0\n")
    job = {"python": BASE, "requirements": "requirements.txt", "require_tensorflow": False}
    inventory = lab_inventory([[{"role": "worker"}]], code=code, job=job)
    result = tfdeploy("up", str(inventory), state=tmp_path / "state", check_rc=3)
    said = result.stdout + result.stderr
    assert "conflict" in said and "left" in said and "right" in said, said
    assert "Traceback" not in said and "pushed" not in said and "starting" not in said, said


def test_a_venv_without_its_frameworks_distribution_is_refused_before_anything_is_sent(
    lab: Lab, lab_inventory: Callable[..., Path], tmp_path: Path, index: Path
) -> None:
    """`framework = "torch"` whose requirements resolve no torch: the framework rule reads the
    venv's resolved wheels, as the TensorFlow rule does, and refuses before the push."""
    code = _code(tmp_path, "tinypkg==1.0\n")
    job = {
        "python": BASE,
        "requirements": "requirements.txt",
        "require_tensorflow": False,
        "framework": "torch",
    }
    inventory = lab_inventory([[{"role": "worker"}], [{"role": "worker"}]], code=code, job=job)
    result = tfdeploy("up", str(inventory), state=tmp_path / "state", check_rc=3)
    said = result.stdout + result.stderr
    assert re.search(r"torch is not installed for venv [0-9a-f]{12} \(worker:0", said), said
    assert "Traceback" not in said and "pushed" not in said and "starting" not in said, said


def test_the_env_op_reads_the_frameworks_of_a_venv_from_the_hosts_own_index(
    workdir: Path, run_id: str, index: Path
) -> None:
    """`wheels_from = "hosts"`: the host's pip installs from its own configuration (here the
    PIP_* variables of `index`, which the agent inherits), so the controller never sees the
    wheels and only the venv can say which torch it holds; the env op reads it from the venv's
    package metadata for the framework rule (deployer/up/frameworkrule.py). Nothing is
    imported: this torch's module would end any python that imports it."""
    make_wheel(index, "torch", "2.13.0", files={"torch.py": b"raise SystemExit('imported')\n"})
    reply = ok(
        call(
            workdir,
            "env",
            run_id=run_id,
            hash="frameworks1",
            python=BASE,
            requirements="torch==2.13.0\ntinypkg==1.0\n",
            wheels=[],
            online=True,
        )
    )
    assert (reply["built"], reply["tensorflow"]) == (True, None), reply
    assert reply["frameworks"] == {"torch": "2.13.0"}, reply


@pytest.mark.needs_tf(reason="preflight checks TensorFlow in the venv; the task only finds it")
def test_a_venv_python_with_another_python3_on_path_is_refused_or_runs_in_the_venv(
    lab: Lab, lab_inventory: Callable[..., Path], tmp_path: Path
) -> None:
    """The venv user's case: python = a venv holding TensorFlow, command = "python3 train.py".
    The venv's directory comes first on the task's PATH, so python3 is the venv's: it runs, and
    finds the TensorFlow preflight checked there, never a green preflight and dead tasks. The
    task finds TensorFlow without importing it (find_spec): the subject is which interpreter
    runs; the import itself is the system-site-packages test's below, with real TensorFlow."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text(
        "import importlib.util, sys\n"
        "found = importlib.util.find_spec('tensorflow') is not None\n"
        "print('python', sys.prefix, 'executable', sys.executable, 'tf', found)\n"
    )
    job = {"python": VENV_PYTHON, "command": "python3 train.py"}
    inventory = lab_inventory([[{"role": "worker"}]], code=code, job=job)
    result = tfdeploy("up", str(inventory), state=tmp_path / "state", check_rc=0)
    found = re.search(r"python /opt/tfdeploy/venv executable (\S+) tf True$", result.stdout, re.M)
    assert found and found.group(1).startswith("/opt/tfdeploy/venv/bin/python3"), result.stdout


def test_a_task_python_other_than_the_checked_one_is_refused_by_preflight(
    lab: Lab, lab_inventory: Callable[..., Path], tmp_path: Path
) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("print('ran')\n")
    job = {"python": VENV_PYTHON, "command": f"{BASE} train.py"}
    inventory = lab_inventory([[{"role": "worker"}]], code=code, job=job)
    result = tfdeploy("up", str(inventory), state=tmp_path / "state", check_rc=3)
    said = result.stdout + result.stderr
    assert f"the tasks' `{BASE}` is" in said and VENV_PYTHON in said, said
    assert "ran" not in result.stdout.split("error")[0] and "starting" not in said, said


@pytest.mark.starts_tf
def test_tensorflow_from_system_site_packages_is_checked_in_the_venv_and_trains(
    lab: Lab, lab_inventory: Callable[..., Path], tmp_path: Path, index: Path
) -> None:
    """MWMS on 2 hosts; the job's venv is built on the lab's TF venv python with
    system_site_packages: preflight finds TF through the venv, the tasks import both."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "requirements.txt").write_text("tinypkg==1.0\n")
    (code / "train.py").write_text(
        "import os, sys, tinypkg\n"
        "import tensorflow as tf\n"
        "s = tf.distribute.MultiWorkerMirroredStrategy()\n"
        "with s.scope():\n"
        "    v = tf.Variable(1.0)\n"
        "venv = os.environ['VIRTUAL_ENV']\n"
        "print('trained', s.num_replicas_in_sync, 'venv', venv, tinypkg.VALUE)\n"
    )
    job = {
        "python": VENV_PYTHON,
        "requirements": "requirements.txt",
        "system_site_packages": True,
        "env": {"TF_CPP_MIN_LOG_LEVEL": "3"},
    }
    inventory = lab_inventory([[{"role": "worker"}], [{"role": "worker"}]], code=code, job=job)
    result = tfdeploy("up", str(inventory), state=tmp_path / "state", timeout=600, check_rc=0)
    out = result.stdout
    assert re.search(r"environment ok: python 3\.\d+\.\d+, tensorflow \d", out), out
    assert len(re.findall(r"trained 2 venv \S+/envs/\S+ 1.0", out)) == 2, out


NATIVE = """\
import sys
import tinynative, tinypkg
version = "%d.%d" % sys.version_info[:2]
print("python", version, "native", tinynative.VALUE, "tinypkg", tinypkg.VALUE)
"""


def test_a_python_3_9_host_among_3_11_hosts_gets_wheels_of_its_own(
    lab: Lab,
    lab_inventory: Callable[..., Path],
    lab_python: Callable[[str], str],
    tmp_path: Path,
    index: Path,
) -> None:
    """One requirements file, two platforms: each host's environment is resolved for its own
    Python, so a wheel built per CPython version reaches each host in its own build."""
    py39 = lab_python("3.9")
    for tag in ("cp39-cp39", "cp311-cp311"):
        files = {"tinynative.py": f"VALUE = {tag.split('-')[0]!r}\n".encode()}
        make_wheel(index, "tinynative", "1.0", files=files, tag=f"{tag}-manylinux_2_17_x86_64")
    code = _code(tmp_path, "tinypkg==1.0\ntinynative==1.0\n")
    (code / "native.py").write_text(NATIVE)
    h1, h2 = lab.hosts[:2]
    job = {
        "python": BASE,
        "requirements": "requirements.txt",
        "require_tensorflow": False,
        "command": "python3 native.py",
    }
    inventory = lab_inventory(
        [[{"role": "worker"}], [{"role": "worker"}]],
        code=code,
        job=job,
        per_host={h2.name: {"python": py39}},
    )
    out = tfdeploy("up", str(inventory), state=tmp_path / "state", check_rc=0).stdout
    said = re.findall(r"environment ([0-9a-f]{12}) for (\S+): CPython (3\.\d+),", out)
    assert sorted((host, version) for _, host, version in said) == [
        (h1.name, "3.11"),
        (h2.name, "3.9"),
    ], out
    assert len({digest for digest, _, _ in said}) == 2, out  # two environments, two hashes
    assert re.search(rf"^worker:0@{h1.name}\s+\| python 3.11 native cp311 tinypkg 1.0", out, re.M)
    assert re.search(rf"^worker:1@{h2.name}\s+\| python 3.9 native cp39 tinypkg 1.0", out, re.M)
