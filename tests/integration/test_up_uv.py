"""uv builds the job's venvs on lab hosts that reach nothing outside (issue 50): its wheel for the
host's platform travels with the environment; a new environment links the wheels it shares with
an earlier one from the host's uv cache; pip by choice (`installer = "pip"`), and pip, said,
where this machine finds no uv wheel for the hosts.

The uv wheel is this machine's uv binary packed as the wheel PyPI ships (tests/support/wheels.py),
served with the job's wheels from a folder: nothing comes from a network.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from deployer.envs.uv import UV_VERSION
from tests.lab import Lab, LabHost
from tests.support.lab_cli import tfdeploy
from tests.support.wheels import make_uv_wheel, make_wheel, uv_binary

BASE = "/usr/bin/python3"  # the hosts' system Python
UV = uv_binary()
pytestmark = pytest.mark.skipif(UV is None, reason="no uv binary here (dev extra: pip install uv)")

# What the task says of its venv: whether pip is in it (uv builds venvs without pip),
# tinydep's file as (inode, links): a file linked from the host's uv cache is shared; and the
# inode of tinydep's bytecode after the import (written by it, or found valid and used).
TRAIN = """\
import importlib.util, os, sys
import tinypkg, tinydep
st = os.stat(tinydep.__file__)
pyc = os.stat(importlib.util.cache_from_source(tinydep.__file__)).st_ino
pip = os.path.exists(os.path.join(sys.prefix, "bin", "pip"))
print("venv", sys.prefix, "pip", pip, "tinydep", st.st_ino, st.st_nlink, "pyc", pyc)
"""


@pytest.fixture
def index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder this machine's pip resolves from: the job's wheels and uv's (this machine's
    binary, tagged for x86_64 as PyPI's is)."""
    wheels = tmp_path / "index"
    make_wheel(wheels, "tinypkg", requires=["tinydep"])
    make_wheel(wheels, "tinydep", "2.0")
    make_wheel(wheels, "tinyextra", "1.0")
    assert UV is not None
    make_uv_wheel(wheels, UV, version=UV_VERSION)
    for name, value in {
        "PIP_CONFIG_FILE": "/dev/null",
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(wheels),
        "PIP_CACHE_DIR": str(tmp_path / "pip-cache"),
    }.items():
        monkeypatch.setenv(name, value)
    return wheels


def _job(tmp_path: Path, requirements: str, **extra: Any) -> tuple[Path, dict[str, Any]]:
    code = tmp_path / "code"
    code.mkdir(exist_ok=True)
    (code / "train.py").write_text(TRAIN)
    (code / "requirements.txt").write_text(requirements)
    job = {"python": BASE, "requirements": "requirements.txt", "require_tensorflow": False}
    return code, job | extra


def _said(out: str) -> list[tuple[str, str, int, int]]:
    """(venv, pip in it, tinydep's inode, its bytecode's inode) of each task."""
    found = re.findall(r"venv (\S+) pip (True|False) tinydep (\d+) (\d+) pyc (\d+)", out)
    return [(venv, pip, int(ino), int(pyc)) for venv, pip, ino, _, pyc in found]


def test_uv_builds_by_default_and_a_new_env_links_shared_wheels_and_bytecode(
    lab: Lab, lab_inventory: Callable[..., Path], tmp_path: Path, index: Path
) -> None:
    code, job = _job(tmp_path, "tinypkg==1.0\n")
    inventory = lab_inventory([[{"role": "worker"}]], code=code, job=job)
    state = tmp_path / "state"
    first = tfdeploy("up", str(inventory), state=state, check_rc=0).stdout
    assert "2 wheels" in first and ", installed with uv" in first, first
    assert re.search(r"environment built on \S+ \(uv, ", first), first
    [(venv1, pip1, ino1, pyc1)] = _said(first)
    assert pip1 == "False", first  # built by uv: no pip of its own
    # One more requirement: a new environment, built by uv from the same host cache, so the
    # wheel both share is linked (one inode in both venvs), not unpacked again.
    (code / "requirements.txt").write_text("tinypkg==1.0\ntinyextra==1.0\n")
    second = tfdeploy("up", str(inventory), state=state, check_rc=0).stdout
    assert re.search(r"environment built on \S+ \(uv, ", second), second
    [(venv2, _, ino2, pyc2)] = _said(second)
    assert venv2 != venv1 and ino2 == ino1, second
    # The bytecode the first environment's task compiled was linked into the second one
    # (remote/bytecode.py), and Python found it valid: it did not compile tinydep again.
    assert pyc2 == pyc1, second
    # The uv wheel was sent with the first environment only: the second sends tinyextra alone.
    sent = re.search(r"(\d+) bytes sent", second)
    assert sent is not None and int(sent.group(1)) < 50_000, second


def test_pip_by_choice_sends_no_uv_wheel(
    lab: Lab, lab_inventory: Callable[..., Path], tmp_path: Path, index: Path
) -> None:
    code, job = _job(tmp_path, "tinypkg==1.0\n", installer="pip")
    inventory = lab_inventory([[{"role": "worker"}]], code=code, job=job)
    out = tfdeploy("up", str(inventory), state=tmp_path / "state", check_rc=0).stdout
    assert ", installed with pip" in out and "installed with uv" not in out, out
    assert re.search(r"environment built on \S+ \(pip, ", out), out
    [(_, pip, _, _)] = _said(out)
    assert pip == "True", out
    sent = re.search(r"(\d+) bytes sent", out)  # uv's wheel is ~40 MB here; the job's, bytes
    assert sent is not None and int(sent.group(1)) < 1_000_000, out


def test_without_a_uv_wheel_for_the_hosts_pip_installs_and_up_says_why(
    lab: Lab, lab_inventory: Callable[..., Path], tmp_path: Path, index: Path
) -> None:
    for wheel in index.glob("uv-*.whl"):
        wheel.unlink()
    code, job = _job(tmp_path, "tinypkg==1.0\n")
    inventory = lab_inventory([[{"role": "worker"}]], code=code, job=job)
    out = tfdeploy("up", str(inventory), state=tmp_path / "state", check_rc=0).stdout
    assert f"installed with pip (uv=={UV_VERSION}: no wheel for CPython 3." in out, out
    assert re.search(r"environment built on \S+ \(pip, ", out), out


WORKDIR = "/root/.tfdeploy"


@pytest.fixture
def small_host(lab: Lab) -> Iterator[LabHost]:
    """A host whose workdir is a 110 MiB tmpfs (preflight's own margin is 100 MiB)."""
    host = lab.hosts[0]
    lab.run(host, f"rm -rf {WORKDIR}").check_returncode()
    mount = f"mkdir -p {WORKDIR} && mount -t tmpfs -o size=110m,mode=0700 tfd-small {WORKDIR}"
    lab.run(host, mount).check_returncode()
    try:
        yield host
    finally:
        lab.run(host, f"umount -l {WORKDIR}")


def test_a_host_without_room_for_the_wheels_is_refused_before_any_byte_is_sent(
    lab: Lab,
    small_host: LabHost,
    lab_inventory: Callable[..., Path],
    tmp_path: Path,
    index: Path,
) -> None:
    # 40 MiB that do not compress: they would fit in the store, not once installed as well.
    make_wheel(index, "bigpkg", "1.0", files={"bigpkg.bin": os.urandom(40 << 20)})
    code, job = _job(tmp_path, "bigpkg==1.0\n", installer="pip")
    inventory = lab_inventory([[{"role": "worker"}]], code=code, job=job, hosts=[small_host])
    result = tfdeploy("up", str(inventory), state=tmp_path / "state", check_rc=3)
    said = result.stdout + result.stderr
    assert re.search(
        rf"{small_host.name}: only \d+ MiB free in {WORKDIR}, need \d+ MiB for the job's wheels",
        said,
    ), said
    assert "pushed" not in said and "Traceback" not in said, said
    stored = lab.run(small_host, f"ls -A {WORKDIR}/store 2>/dev/null | wc -l").stdout.strip()
    assert stored == "0", stored  # nothing was sent


def test_a_building_host_reports_its_progress_in_wheels_every_few_seconds(
    lab: Lab, lab_inventory: Callable[..., Path], tmp_path: Path, index: Path
) -> None:
    # pip (ensurepip first, then one project after the other) takes seconds here: the
    # progress lines come while it runs, counted in the environment's own wheels.
    names = [f"tinymany{i}" for i in range(20)]
    for name in names:
        make_wheel(index, name, "1.0", files={f"{name}.bin": os.urandom(256 << 10)})
    code, job = _job(tmp_path, "tinypkg==1.0\n" + "".join(f"{n}==1.0\n" for n in names))
    job["installer"] = "pip"
    inventory = lab_inventory([[{"role": "worker"}]], code=code, job=job)
    out = tfdeploy("up", str(inventory), state=tmp_path / "state", check_rc=0).stdout
    said = re.findall(r"^tfdeploy: installing on (\S+): (\d+) of (\d+) wheels, (\d+) s$", out, re.M)
    assert said, out
    assert all(total == "22" and 0 <= int(done) <= 22 for _, done, total, _ in said), said
    seconds = [int(s) for _, _, _, s in said]
    assert seconds == sorted(seconds), said
    # A warm up reuses the venv at once: no progress to report.
    again = tfdeploy("up", str(inventory), state=tmp_path / "state", check_rc=0).stdout
    assert "installing on" not in again and "environment reused on" in again, again
