"""A job's venv built on a host from local wheels (remote/venvs.py), with real interpreters, real
pip and uv, real processes killed mid-way, and lab hosts: offline, once, atomically, under a lock
shared homes honour, on a 3.9 host, and on a full disk.

The builder runs as the op will run it: `python venvs.py build ...` with the agent's directory as
its own. Wheels are written by hand (tests/support/wheels.py); nothing comes from a network.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.lab import Lab, LabHost
from tests.support.agent import call, ok
from tests.support.wheels import make_uv_wheel, make_wheel, uv_binary

pytestmark = pytest.mark.timeout(300)

REMOTE = Path(__file__).resolve().parents[2] / "remote"
BASE = "/usr/bin/python3"  # Debian's: it runs inside lab hosts, and has venv and ensurepip
UV = uv_binary()
needs_uv = pytest.mark.skipif(UV is None, reason="no uv binary here (dev extra: pip install uv)")


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory lab hosts see too (their /tmp is private): the agent's files and wheels."""
    path = Path(tempfile.mkdtemp(prefix="tfd-envs-", dir="/var/tmp"))
    path.chmod(0o755)
    shutil.copytree(REMOTE, path / "agent", ignore=shutil.ignore_patterns("__pycache__"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def wheelhouse(where: Path, *, uv: bool = False, big: int = 0) -> Path:
    """tinypkg (needing tinydep) and tinydep; with `uv`, the uv wheel; `big` bytes of noise."""
    wheels = where / "wheels"
    make_wheel(wheels, "tinypkg", requires=["tinydep"])
    files = {"tinydep.py": b"VALUE = 'dep'\n"}
    files.update({"tinydep_blob.bin": os.urandom(big)} if big else {})
    make_wheel(wheels, "tinydep", "2.0", files=files)
    if uv:
        assert UV is not None
        make_uv_wheel(wheels, UV)
    subprocess.run(["chmod", "-R", "a+rX", str(where)], check=True)
    return wheels


def build_argv(
    agent: Path, workdir: str, wheels: Path, *extra: str, python: str = BASE
) -> list[str]:
    reqs = wheels.parent / "reqs.txt"
    if not reqs.exists():
        reqs.write_text("tinypkg==1.0\n")
        reqs.chmod(0o644)
    argv = [python, str(agent / "venvs.py"), "build", "--workdir", workdir, "--hash", "h1"]
    return [*argv, "--python", python, "--wheels", str(wheels), "--requirements", str(reqs), *extra]


def reply_of(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else "{}"
    reply: dict[str, Any] = json.loads(last)
    return reply


def build(tmp_path: Path, wheels: Path, *extra: str, host: str = "me") -> dict[str, Any]:
    argv = build_argv(REMOTE, str(tmp_path / "wd"), wheels, "--host-id", host, *extra)
    return reply_of(subprocess.run(argv, capture_output=True, text=True, timeout=240))


def imports(venv: str) -> str:
    code = "import tinypkg, tinydep, sys; print(sys.prefix, tinypkg.VALUE, tinydep.VALUE)"
    return subprocess.run(
        [f"{venv}/bin/python", "-c", code], capture_output=True, text=True, timeout=60
    ).stdout.strip()


def snapshot(venv: Path) -> dict[str, tuple[int, int]]:
    """Every file of the venv but its use records: (inode, mtime_ns)."""
    found = {}
    for path in venv.rglob("*"):
        if ".uses" not in path.relative_to(venv).parts:
            st = path.lstat()
            found[str(path.relative_to(venv))] = (st.st_ino, st.st_mtime_ns)
    return found


@pytest.mark.parametrize("installer", ["pip", pytest.param("uv", marks=needs_uv)])
def test_an_offline_build_then_a_reuse_that_changes_nothing(tmp_path: Path, installer: str) -> None:
    wheels = wheelhouse(tmp_path, uv=installer == "uv")
    first = build(tmp_path, wheels, "--run-id", "r1")
    assert (first["built"], first["installer"]) == (True, installer), first
    venv = Path(first["venv"])
    assert imports(str(venv)) == f"{venv} 1.0 dep"
    assert json.loads((venv / ".complete").read_text())["installer"] == installer
    before = snapshot(venv)
    again = build(tmp_path, wheels, "--run-id", "r2")
    assert (again["built"], again["installer"], again["waited"]) == (False, None, False), again
    assert snapshot(venv) == before  # nothing reinstalled, not one file touched
    assert sorted(p.name for p in (venv / ".uses").iterdir()) == ["r1", "r2"]
    assert sorted(p.name for p in venv.parent.iterdir()) == ["h1"]  # no lock, no work dir left


@needs_uv
def test_a_uv_builds_progress_counts_the_projects_its_hosts_cache_holds_unpacked(
    tmp_path: Path,
) -> None:
    """uv unpacks every wheel into the host's cache first and links them all into the venv at
    the end: counting only the venv's .dist-info, a TensorFlow build said `0 of 38 wheels` for
    its whole half minute. The progress op counts the cache's unpacked projects too."""
    wheels = wheelhouse(tmp_path, uv=True)
    workdir = tmp_path / "wd"
    names = ["tinypkg", "tinydep", "absent"]
    before = ok(call(workdir, "envprogress", host="me", hash="h1", names=names))
    assert (before["installed"], before["complete"]) == (0, False), before
    venv = Path(build(tmp_path, wheels, "--run-id", "r1", host="me")["venv"])
    built = ok(call(workdir, "envprogress", host="me", hash="h1", names=names))
    assert (built["installed"], built["complete"]) == (2, True), built
    shutil.rmtree(venv)  # no .dist-info left anywhere: what counts now is the cache alone
    cached = ok(call(workdir, "envprogress", host="me", hash="h1", names=names))
    assert (cached["installed"], cached["complete"]) == (2, False), cached
    other = ok(call(workdir, "envprogress", host="other", hash="h1", names=names))
    assert other["installed"] == 0, other  # another host's cache is its own


@needs_uv
@pytest.mark.parametrize("installer", ["pip", "uv"])
def test_a_conflict_is_told_in_the_installers_words(tmp_path: Path, installer: str) -> None:
    wheels = wheelhouse(tmp_path, uv=True)
    (tmp_path / "reqs.txt").write_text("tinypkg==1.0\ntinydep==9.9\n")
    reply = build(tmp_path, wheels, "--installer", installer)
    error = reply["error"]
    assert error.startswith(f"{installer} could not build the environment h1:"), error
    said = {"pip": "No matching distribution found for tinydep==9.9", "uv": "No solution found"}
    assert said[installer] in error, error
    assert len(error.splitlines()) <= 13 and "Processing" not in error, error
    assert list((tmp_path / "wd" / "envs").iterdir()) == []  # the half-built venv is gone


def test_a_build_killed_mid_way_is_never_used_and_the_next_one_replaces_it(tmp_path: Path) -> None:
    wheels = wheelhouse(tmp_path)
    venv = tmp_path / "wd" / "envs" / "h1"
    argv = build_argv(REMOTE, str(tmp_path / "wd"), wheels, "--host-id", "me")
    builder = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not (venv / "pyvenv.cfg").exists():  # the venv exists: ensurepip is at work in it
        assert time.monotonic() < deadline and builder.poll() is None
        time.sleep(0.02)
    builder.send_signal(signal.SIGKILL)
    builder.wait()
    assert list(venv.parent.glob(".work-h1-*")), "the killed build left no work directory"
    assert not (venv / ".complete").exists()
    # A run asking now is not given it: it takes over the dead builder's lock and builds anew.
    second = build(tmp_path, wheels)
    assert (second["built"], second["installer"]) == (True, "pip"), second
    assert imports(str(venv)) == f"{venv} 1.0 dep"
    assert sorted(p.name for p in venv.parent.iterdir()) == ["h1"]


@needs_uv
def test_two_builders_at_once_make_one_build(tmp_path: Path) -> None:
    """Two jobs on one host, or two hosts of one shared workdir: one builds, one waits."""
    wheels = wheelhouse(tmp_path, uv=True, big=20 << 20)  # ~1 s of install to wait through
    procs = [
        subprocess.Popen(
            build_argv(REMOTE, str(tmp_path / "wd"), wheels, "--host-id", host),
            stdout=subprocess.PIPE,
            text=True,
        )
        for host in ("host-a", "host-b")
    ]
    replies = [json.loads(p.communicate(timeout=240)[0].splitlines()[-1]) for p in procs]
    assert sorted(r["built"] for r in replies) == [False, True], replies
    waiter = next(r for r in replies if not r["built"])
    assert waiter["waited"] is True, replies
    assert imports(replies[0]["venv"]).endswith("1.0 dep")


def on_host(lab: Lab, host: LabHost, argv: list[str], user: str | None = None) -> dict[str, Any]:
    command = " ".join(f"'{a}'" for a in argv)
    done = subprocess.run(
        lab.ssh_argv(host, command, user=user), capture_output=True, text=True, timeout=240
    )
    return reply_of(done)


@needs_uv
def test_hosts_sharing_a_home_build_once(lab: Lab, lab_shared_home: Path, shared_dir: Path) -> None:
    wheels = wheelhouse(shared_dir, uv=True, big=20 << 20)
    argv = build_argv(shared_dir / "agent", "~/.tfdeploy", wheels)
    hosts = lab.hosts[:2]
    procs = [
        subprocess.Popen(
            lab.ssh_argv(h, " ".join(argv), user=lab.login_user), stdout=subprocess.PIPE, text=True
        )
        for h in hosts
    ]
    replies = [json.loads(p.communicate(timeout=240)[0].splitlines()[-1]) for p in procs]
    assert sorted(r["built"] for r in replies) == [False, True], replies
    envs = lab_shared_home / ".tfdeploy" / "envs"
    assert sorted(p.name for p in envs.iterdir()) == ["h1"]
    for host in hosts:  # each host runs the one venv
        check = (
            "/home/tfdlab/.tfdeploy/envs/h1/bin/python -c 'import tinypkg; print(tinypkg.VALUE)'"
        )
        done = subprocess.run(
            lab.ssh_argv(host, check, user=lab.login_user), capture_output=True, text=True
        )
        assert done.stdout.strip() == "1.0", done.stderr


def test_a_python_39_host_builds_with_its_own_interpreter(
    lab: Lab, lab_python: Any, shared_dir: Path
) -> None:
    py39 = lab_python("3.9")
    wheels = wheelhouse(shared_dir)
    host = lab.hosts[0]
    reply = on_host(lab, host, build_argv(shared_dir / "agent", "/root/wd39", wheels, python=py39))
    assert (reply.get("built"), reply.get("installer")) == (True, "pip"), reply
    code = "import sys, tinypkg; print(sys.version_info[:2], tinypkg.VALUE)"
    done = lab.run(host, f"/root/wd39/envs/h1/bin/python -c '{code}'")
    assert done.stdout.strip() == "(3, 9) 1.0", done
    lab.run(host, "rm -rf /root/wd39")


def test_a_full_disk_is_named_and_the_half_built_env_removed(
    clean_lab: Lab, shared_dir: Path
) -> None:
    lab, host = clean_lab, clean_lab.hosts[0]
    # Room for the venv and its pip (~25 MB), not for a wheel of 40 MB of noise.
    mount = "mkdir -p /root/wdfull && mount -t tmpfs -o size=36m,mode=0700 tfd-env /root/wdfull"
    lab.run(host, mount).check_returncode()
    try:
        wheels = wheelhouse(shared_dir, big=40 << 20)
        reply = on_host(lab, host, build_argv(shared_dir / "agent", "/root/wdfull", wheels))
        error = reply.get("error", "")
        assert error.startswith("No space left on device in /root/wdfull/envs"), reply
        assert "the half-built environment was removed" in error, error
        left = lab.run(host, "ls -A /root/wdfull/envs").stdout.split()
        assert left == [], left
    finally:
        lab.run(host, "umount -l /root/wdfull; rmdir /root/wdfull")
