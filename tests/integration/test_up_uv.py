"""uv builds the job's venvs on lab hosts that reach nothing outside (issue 50): its wheel for the
host's platform travels with the environment; a new environment links the wheels it shares with
an earlier one from the host's uv cache; pip by choice (`installer = "pip"`), and pip, said,
where this machine finds no uv wheel for the hosts.

The uv wheel is this machine's uv binary packed as the wheel PyPI ships (tests/support/wheels.py),
served with the job's wheels from a folder: nothing comes from a network.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from deployer.envs.uv import UV_VERSION
from deployer.up import envprogress
from remote import protocol
from tests.lab import Lab, LabHost
from tests.support.faults import Up, pids_of
from tests.support.lab_cli import tfdeploy
from tests.support.sizes import sizes_sent
from tests.support.wheels import make_uv_wheel, make_wheel, uv_binary

BASE = "/usr/bin/python3"  # the hosts' system Python
UV = uv_binary()
pytestmark = pytest.mark.skipif(UV is None, reason="no uv binary here (dev extra: pip install uv)")

# What the task says of its venv: whether pip is in it (uv builds venvs without pip),
# tinydep's file as (inode, links): a file linked from the host's uv cache is shared; and the
# inode and links of tinydep's bytecode after the import (written by it, or found valid and
# used: a file the host's bytecode store links, remote/bytecode.py, has two or more).
TRAIN = """\
import importlib.util, os, sys
import tinypkg, tinydep
st = os.stat(tinydep.__file__)
pyc = os.stat(importlib.util.cache_from_source(tinydep.__file__))
pip = os.path.exists(os.path.join(sys.prefix, "bin", "pip"))
print("venv", sys.prefix, "pip", pip, "tinydep", st.st_ino, st.st_nlink, "pyc", pyc.st_ino,
      pyc.st_nlink)
"""
# A task that rewrites its venv's bytecode of tinydep, in place, with code that prints
# POISONED (stamped with the source's mtime and size, so Python takes it): in its own venv it
# runs; it must reach no other venv (docs/environments.md: "neither venv can change the other's").
POISON = (
    TRAIN
    + """\
import marshal
path = importlib.util.cache_from_source(tinydep.__file__)
head = importlib.util.MAGIC_NUMBER + (0).to_bytes(4, "little")
head += (int(st.st_mtime) & 0xFFFFFFFF).to_bytes(4, "little")
head += (st.st_size & 0xFFFFFFFF).to_bytes(4, "little")
code = compile("print('POISONED', flush=True)", tinydep.__file__, "exec")
with open(path, "r+b") as f:
    f.truncate(0)
    f.write(head + marshal.dumps(code))
"""
)


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
    (code / "poison.py").write_text(POISON)
    (code / "requirements.txt").write_text(requirements)
    job = {"python": BASE, "requirements": "requirements.txt", "require_tensorflow": False}
    return code, job | extra


def _said(out: str) -> list[tuple[str, str, int, int, int]]:
    """(venv, pip in it, tinydep's inode, its bytecode's inode and links) of each task."""
    found = re.findall(r"venv (\S+) pip (True|False) tinydep (\d+) (\d+) pyc (\d+) (\d+)", out)
    return [(venv, pip, int(ino), int(pyc), int(n)) for venv, pip, ino, _, pyc, n in found]


def test_uv_builds_by_default_and_a_new_env_links_shared_wheels_and_bytecode(
    lab: Lab, lab_inventory: Callable[..., Path], tmp_path: Path, index: Path
) -> None:
    code, job = _job(tmp_path, "tinypkg==1.0\n")
    inventory = lab_inventory([[{"role": "worker"}]], code=code, job=job)
    state = tmp_path / "state"
    first = tfdeploy("up", str(inventory), state=state, check_rc=0).stdout
    assert "2 wheels" in first and ", installed with uv" in first, first
    assert re.search(r"environment built on \S+ \(uv, ", first), first
    [(venv1, pip1, ino1, pyc1, _)] = _said(first)
    assert pip1 == "False", first  # built by uv: no pip of its own
    # One more requirement: a new environment, built by uv from the same host cache, so the
    # wheel both share is linked (one inode in both venvs), not unpacked again.
    (code / "requirements.txt").write_text("tinypkg==1.0\ntinyextra==1.0\n")
    second = tfdeploy("up", str(inventory), state=state, check_rc=0).stdout
    assert re.search(r"environment built on \S+ \(uv, ", second), second
    [(venv2, _, ino2, pyc2, links2)] = _said(second)
    assert venv2 != venv1 and ino2 == ino1, second
    # The second environment started with bytecode of tinydep, the module the first one's task
    # imported: the host's store's, compiled by the seeding (remote/bytecode.py), never the
    # file that task wrote; and Python found it valid: it did not compile tinydep again (a
    # file of its own would have one link).
    assert pyc2 != pyc1 and links2 >= 2, second
    # The uv wheel was sent with the first environment only: the second sends tinyextra alone.
    sent = sizes_sent(second)
    assert sent and sent[0] < 50_000, second


# A task that reports its first step, then waits (at most 60 s) for its host's bytecode store
# to hold tinydep's bytecode, and says that entry's inode: the fill the supervisor starts once
# a task reported a step (remote/bytecode.py) compiles it while the task still runs.
FILLED = (
    TRAIN
    + f"""\
import glob, time
from tfdeploy_metrics import report
report(1, 1, loss=0.5)
workdir = os.path.dirname(os.path.dirname(sys.prefix))
tag = "cpython-%d%d" % sys.version_info[:2]
shelf = os.path.join(workdir, "hosts", os.environ["{protocol.HOST_ID_ENV}"], "bytecode", tag)
key = "%d-%d-%d-%d-o0." % (os.stat(tinydep.__file__).st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    found = [n for n in os.listdir(shelf) if n.startswith(key)] if os.path.isdir(shelf) else []
    if found:
        print("store entry", os.stat(os.path.join(shelf, found[0])).st_ino, flush=True)
        break
    time.sleep(0.05)
else:
    print("store entry none", flush=True)
"""
)


def test_the_store_is_filled_while_a_task_trains_so_the_next_env_only_links_its_bytecode(
    lab: Lab, lab_inventory: Callable[..., Path], tmp_path: Path, index: Path
) -> None:
    """Issue 58: the first environment that added a requirement compiled the earlier one's
    imports into the store while its `up` waited (8 s for TensorFlow's). Now the first run's
    supervisor compiles them once the task reported a step, and the next environment links
    that very entry (its inode) instead of compiling."""
    code, job = _job(tmp_path, "tinypkg==1.0\n")
    (code / "filled.py").write_text(FILLED)
    inventory = lab_inventory(
        [[{"role": "worker"}]], code=code, job=job | {"command": "python filled.py"}
    )
    state = tmp_path / "state"
    first = tfdeploy("up", str(inventory), state=state, check_rc=0).stdout
    [entry] = re.findall(r"store entry (\w+)", first)
    assert entry != "none", first  # before: nothing compiled the store until the next env
    (code / "requirements.txt").write_text("tinypkg==1.0\ntinyextra==1.0\n")
    inventory = lab_inventory([[{"role": "worker"}]], code=code, job=job)
    second = tfdeploy("up", str(inventory), state=state, check_rc=0).stdout
    [(_, _, _, pyc2, _)] = _said(second)
    assert pyc2 == int(entry), second  # the fill's entry, linked: the seeding compiled none
    assert lab.leftovers_of(lab.hosts) == {}


def test_pip_by_choice_sends_no_uv_wheel(
    lab: Lab, lab_inventory: Callable[..., Path], tmp_path: Path, index: Path
) -> None:
    code, job = _job(tmp_path, "tinypkg==1.0\n", installer="pip")
    inventory = lab_inventory([[{"role": "worker"}]], code=code, job=job)
    out = tfdeploy("up", str(inventory), state=tmp_path / "state", check_rc=0).stdout
    assert ", installed with pip" in out and "installed with uv" not in out, out
    assert re.search(r"environment built on \S+ \(pip, ", out), out
    [(_, pip, _, _, _)] = _said(out)
    assert pip == "True", out
    sent = sizes_sent(out)  # uv's wheel is ~40 MB here; the job's, bytes
    assert sent and sent[0] < 1_000_000, out


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


def _hold_the_build(lab: Lab, host: LabHost, seconds: float) -> None:
    """Freezes the host's venv build (its `python -m venv`, or its pip: both name the env's
    folder) for `seconds`, as soon as it runs."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        held = []
        for pid in pids_of(lab, host, "/.tfdeploy/envs/"):
            with contextlib.suppress(Exception):  # it may have ended meanwhile
                lab.freeze(host, pid)
                held.append(pid)
        if held:
            time.sleep(seconds)
            for pid in held:
                lab.thaw(host, pid)
            return
    raise AssertionError("the environment's build never ran on the host")


def test_a_building_host_reports_its_progress_in_wheels_every_few_seconds(
    lab: Lab, lab_inventory: Callable[..., Path], tmp_path: Path, index: Path
) -> None:
    # pip (ensurepip first, then one project after the other) takes about 2 s here, less than
    # the EVERY_S between two progress lines on a quiet machine: the build is held frozen for
    # longer than that (the venv's python -m venv, or its pip), so a line must come, whatever
    # the machine's speed, counted in the environment's own wheels.
    names = [f"tinymany{i}" for i in range(20)]
    for name in names:
        make_wheel(index, name, "1.0", files={f"{name}.bin": os.urandom(256 << 10)})
    code, job = _job(tmp_path, "tinypkg==1.0\n" + "".join(f"{n}==1.0\n" for n in names))
    job["installer"] = "pip"
    inventory = lab_inventory([[{"role": "worker"}]], code=code, job=job)
    host = lab.hosts[0]
    up = Up(inventory, state=tmp_path / "state")
    up.wait_for(r"^tfdeploy: installing the job's environment", timeout=120)
    _hold_the_build(lab, host, envprogress.EVERY_S + 1)
    assert up.finish(timeout=120) == 0, up.report()
    out = up.stdout
    said = re.findall(r"^tfdeploy: installing on (\S+): (\d+) of (\d+) wheels, (\d+) s$", out, re.M)
    assert said, out
    assert all(total == "22" and 0 <= int(done) <= 22 for _, done, total, _ in said), said
    seconds = [int(s) for _, _, _, s in said]
    assert seconds == sorted(seconds), said
    # A warm up reuses the venv at once: no progress to report.
    again = tfdeploy("up", str(inventory), state=tmp_path / "state", check_rc=0).stdout
    assert "installing on" not in again and "environment reused on" in again, again


def test_a_pyc_a_task_wrote_into_its_venv_reaches_no_other_venv(
    lab: Lab, lab_inventory: Callable[..., Path], tmp_path: Path, index: Path
) -> None:
    """Job A's task rewrites tinydep's bytecode in its venv with code that prints POISONED; job
    B's new venv, seeded from A's (issue 58: it linked A's file and printed POISONED), runs
    tinydep's own code, from bytecode the seeding compiled; and when B's task rewrites that
    file in place (a link of the host's store), job C's venv finds the store's entry changed
    and compiles it again."""
    for extra in ("tinyone", "tinytwo"):
        make_wheel(index, extra, "1.0")
    code, job = _job(tmp_path, "")

    def up(name: str, requirements: str, script: str) -> str:
        (code / "requirements.txt").write_text(requirements)
        runs = job | {"name": name, "command": f"python3 {script}"}
        inventory = lab_inventory([[{"role": "worker"}]], code=code, job=runs)
        return tfdeploy("up", str(inventory), state=tmp_path / "state", check_rc=0).stdout

    first = up("joba", "tinypkg==1.0\ntinyone==1.0\n", "poison.py")
    assert "POISONED" not in first, first  # tinydep was imported before the rewrite
    again = up("joba", "tinypkg==1.0\ntinyone==1.0\n", "train.py")
    assert "| POISONED" in again, again  # the rewrite is real: A's own venv runs it
    second = up("jobb", "tinypkg==1.0\ntinyone==1.0\ntinytwo==1.0\n", "poison.py")
    assert "POISONED" not in second, second
    [(venv2, _, _, _, links2)] = _said(second)
    assert links2 >= 2, second  # seeded: the store's file, which Python took as valid
    third = up("jobc", "tinypkg==1.0\ntinytwo==1.0\n", "train.py")
    assert "POISONED" not in third, third
    [(venv3, _, _, _, links3)] = _said(third)
    assert venv3 != venv2 and links3 >= 2, third
