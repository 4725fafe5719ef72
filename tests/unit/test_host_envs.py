"""The host side of a job's environment, in parts that take well under a second: the task's PATH
and interpreter, the installer's error cut to its words, the shared lock's takeover rules, the
wheel directory and the refusal of a Python without ensurepip. Builds are in
tests/integration/test_host_envs.py (they take seconds)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from remote import installers, interpreters
from tests.lab import pythons
from tests.lab.model import LabUnsupported
from tests.support.wheels import make_wheel

REMOTE = Path(__file__).resolve().parents[2] / "remote"
BASE = "/usr/bin/python3"

# pip 23's words for a conflict, as `pip install --no-index` prints them.
PIP_CONFLICT = """\
Looking in links: /w
Processing /w/a-1.0-py3-none-any.whl
Processing /w/b-1.0-py3-none-any.whl
INFO: pip is looking at multiple versions of a to determine which version is compatible.
ERROR: Cannot install a==1.0 and b==1.0 because these package versions have conflicting dependencies.

The conflict is caused by:
    The user requested b==1.0
    a 1.0 depends on b==2.0

To fix this you could try to:
1. loosen the range of package versions you've specified
2. remove package versions to allow pip attempt to solve the dependency conflict

ERROR: ResolutionImpossible: for help visit https://pip.pypa.io/en/latest/topics/dependency-resolution/#dealing-with-dependency-conflicts
"""  # noqa: E501
UV_CONFLICT = """\
Using Python 3.11.2 environment at: /wd/envs/h
  \u00d7 No solution found when resolving dependencies:
  \u2570\u2500\u25b6 Because a==1.0 depends on b==2.0 and you require a==1.0, we can conclude that
      you require b==2.0.
      And because b==2.0 was not found in the provided package locations, we can conclude
      that your requirements are unsatisfiable.
"""


def in_remote(code: str) -> subprocess.CompletedProcess[str]:
    """Runs `code` as a host runs the agent's modules: the agent's directory alone on sys.path."""
    script = f"import sys; sys.path.insert(0, {str(REMOTE)!r})\n{code}"
    return subprocess.run(
        [sys.executable, "-I", "-c", script], capture_output=True, text=True, timeout=30
    )


def test_a_venv_task_env_is_activated_and_loses_pythonhome() -> None:
    base = {"PATH": "/usr/bin:/bin", "PYTHONHOME": "/elsewhere", "HOME": "/h"}
    env = interpreters.venv_env("/wd/envs/abc", base)
    assert env["PATH"] == "/wd/envs/abc/bin:/usr/bin:/bin"
    assert env["VIRTUAL_ENV"] == "/wd/envs/abc"
    assert "PYTHONHOME" not in env and env["HOME"] == "/h"
    assert base["PYTHONHOME"] == "/elsewhere"  # the caller's mapping is left as it was


def test_without_requirements_the_host_pythons_directory_comes_first() -> None:
    base = {"PATH": "/usr/bin:/opt/py/bin:/bin"}
    env = interpreters.host_python_env("/opt/py/bin/python3", base)
    assert env["PATH"] == "/opt/py/bin:/usr/bin:/bin"  # moved to the front, not doubled
    assert interpreters.host_python_env("python3", base)["PATH"] == base["PATH"]


@pytest.mark.parametrize(
    ("command", "word", "python"),
    [
        ("python3 train.py", "python3", True),
        ("OMP_NUM_THREADS=1 python3.11 -u t.py", "python3.11", True),
        ("/opt/venv/bin/python t.py", "/opt/venv/bin/python", True),
        ("bash run.sh", "bash", False),
        ("python3-config --libs", "python3-config", False),
    ],
)
def test_the_first_word_and_whether_it_is_python(command: str, word: str, python: bool) -> None:
    assert interpreters.first_word(command) == word
    assert interpreters.is_python_word(word) is python


def test_resolution_follows_the_given_path_to_the_real_file(tmp_path: Path) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    for directory in (one, two):
        directory.mkdir()
    (two / "python3").symlink_to(BASE)
    (one / "python3").write_text("#!/bin/sh\n")
    (one / "python3").chmod(0o755)
    real = os.path.realpath(BASE)
    assert interpreters.resolve_command("python3", f"{two}:{one}") == real
    assert interpreters.resolve_command("python3", f"{one}:{two}") == str(one / "python3")
    assert interpreters.resolve_command("two/python3", "", cwd=str(tmp_path)) == real
    assert interpreters.resolve_command("python3", str(tmp_path / "none")) is None


def test_a_venvs_python_is_told_from_its_base(tmp_path: Path) -> None:
    """Its real path is the base interpreter's; the venv it sits in is what tells them apart."""
    venv = tmp_path / "venv"
    subprocess.run([BASE, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    path = f"{venv}/bin:{os.path.dirname(BASE)}"
    in_venv = interpreters.identity("python3", path)
    base = interpreters.identity(BASE, path)
    assert in_venv == (os.path.realpath(BASE), str(venv))
    assert base == (os.path.realpath(BASE), "")
    assert interpreters.identity("python3", str(tmp_path / "none")) is None


def test_pips_conflict_is_cut_to_its_words() -> None:
    lines = installers.cut(PIP_CONFLICT)
    assert lines[0].startswith("ERROR: Cannot install a==1.0 and b==1.0")
    assert "    a 1.0 depends on b==2.0" in lines
    assert not any("To fix" in ln or "ResolutionImpossible" in ln or not ln for ln in lines)
    assert not any(ln.startswith(("Processing", "Looking")) for ln in lines)


def test_uvs_conflict_is_cut_to_its_words() -> None:
    lines = installers.cut(UV_CONFLICT)
    assert lines[0] == "  \u00d7 No solution found when resolving dependencies:"
    assert lines[-1].endswith("that your requirements are unsatisfiable.")
    assert not any("Using Python" in ln for ln in lines)


def test_output_without_an_error_line_keeps_its_last_lines() -> None:
    text = "\n".join(f"line {i}" for i in range(40))
    assert installers.cut(text) == [f"line {i}" for i in range(40 - installers.TAIL, 40)]


def test_a_dead_holder_on_this_host_is_taken_over_at_once(tmp_path: Path) -> None:
    lock = tmp_path / "h.lock"
    holder = in_remote(
        "import sharedlock, pathlib, os\n"
        f"l = sharedlock.SharedLock(pathlib.Path({str(lock)!r}), 'me')\n"
        "l._acquire(None); l._write_owner(); os._exit(0)"  # dies holding it
    )
    assert holder.returncode == 0, holder.stderr
    assert json.loads((lock / "owner").read_text())["host"] == "me"
    taker = in_remote(
        "import sharedlock, pathlib, time\n"
        f"l = sharedlock.SharedLock(pathlib.Path({str(lock)!r}), 'me', stale_s=60)\n"
        "t = time.monotonic()\n"
        "with l.held(): print(round(time.monotonic() - t, 2), l.still_mine())"
    )
    assert taker.returncode == 0, taker.stderr
    waited, mine = taker.stdout.split()
    assert float(waited) < 5 and mine == "True"
    assert not lock.exists()  # released
    assert list(tmp_path.iterdir()) == []  # no grave left behind


def test_another_hosts_holder_is_taken_over_only_when_its_heartbeat_stops(tmp_path: Path) -> None:
    """Its pid means nothing here: only a heartbeat that stops moving (by our own clock)."""
    lock = tmp_path / "h.lock"
    lock.mkdir()
    owner = {"host": "other-host", "pid": 1, "ticks": 0, "token": "t"}
    (lock / "owner").write_text(json.dumps(owner))
    (lock / "heartbeat").touch()
    code = (
        "import sharedlock, pathlib, time, sys\n"
        f"l = sharedlock.SharedLock(pathlib.Path({str(lock)!r}), 'me', stale_s=0.5)\n"
        "t = time.monotonic()\n"
        "with l.held(lambda o: print(o['host'], flush=True)): print(time.monotonic() - t)"
    )
    script = f"import sys; sys.path.insert(0, {str(REMOTE)!r})\n{code}"
    proc = subprocess.Popen([sys.executable, "-I", "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "other-host"
        for _ in range(10):  # a live holder on another host: it keeps beating for 1 s
            (lock / "heartbeat").touch()
            time.sleep(0.1)
            assert proc.poll() is None, "took a lock whose heartbeat still moves"
        out, _ = proc.communicate(timeout=20)
    finally:
        proc.kill()
    assert proc.returncode == 0
    assert 1.0 <= float(out.strip()) < 10


def test_wheels_from_the_store_get_their_names(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    wheel = make_wheel(tmp_path, "tinypkg")
    digest = "a" * 64
    shutil.copyfile(wheel, store / digest)
    script = (
        "import venvs, pathlib\n"
        f"s, d = pathlib.Path({str(store)!r}), pathlib.Path({str(tmp_path / 'w')!r})\n"
        f"venvs.link_wheels(s, [({wheel.name!r}, {digest!r})], d)\n"
        "for bad in ('../x.whl', 'x.tar.gz'):\n"
        "    try: venvs.link_wheels(s, [(bad, 'a' * 64)], d)\n"
        "    except venvs.EnvError as e: print(e)\n"
        "try: venvs.link_wheels(s, [('y-1-py3-none-any.whl', 'b' * 64)], d)\n"
        "except venvs.EnvError as e: print(e)"
    )
    done = in_remote(script)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "w" / wheel.name).stat().st_ino == (store / digest).stat().st_ino
    assert done.stdout.splitlines() == [
        "'../x.whl' is not a wheel file name",
        "'x.tar.gz' is not a wheel file name",
        "the store lacks the wheel y-1-py3-none-any.whl (bbbbbbbbbbbb)",
    ]


@pytest.fixture(scope="module")
def python_without_ensurepip(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A CPython whose stdlib lacks ensurepip, as Debian's without python3-venv: a linked copy of
    the lab's interpreter (whose RUNPATH is relative) with that package left out."""
    try:
        good = pythons.host_python("3.11")
    except LabUnsupported as e:
        pytest.skip(str(e))
    root = Path(good.path).parents[1]
    copy = tmp_path_factory.mktemp("noensurepip") / "py"
    # Hard links where this user may make them (root); a copy where it may not (protected_hardlinks
    # forbids linking other users' files).
    if subprocess.run(["cp", "-al", str(root), str(copy)], capture_output=True).returncode != 0:
        shutil.rmtree(copy, ignore_errors=True)
        subprocess.run(["cp", "-a", str(root), str(copy)], check=True)
    shutil.rmtree(copy / "lib" / "python3.11" / "ensurepip")
    return str(copy / "bin" / "python3.11")


def build(tmp_path: Path, python: str, *extra: str) -> tuple[int, dict[str, object]]:
    wheels = tmp_path / "wheels"
    make_wheel(wheels, "tinypkg")
    (tmp_path / "reqs.txt").write_text("tinypkg==1.0\n")
    argv = [sys.executable, str(REMOTE / "venvs.py"), "build", "--workdir", str(tmp_path / "wd")]
    argv += ["--hash", "h1", "--python", python, "--wheels", str(wheels)]
    argv += ["--requirements", str(tmp_path / "reqs.txt"), "--host-id", "me", *extra]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    return done.returncode, json.loads(done.stdout.splitlines()[-1])


def test_a_python_without_ensurepip_is_refused_naming_the_package(
    tmp_path: Path, python_without_ensurepip: str
) -> None:
    code, reply = build(tmp_path, python_without_ensurepip, "--installer", "pip")
    assert code == 1
    assert "lacks ensurepip" in str(reply["error"]), reply
    assert "python3.11-venv (or python3-venv)" in str(reply["error"]), reply
    assert list((tmp_path / "wd" / "envs").iterdir()) == []  # nothing half-built, no lock


def test_an_interpreter_that_does_not_start_is_named(tmp_path: Path) -> None:
    code, reply = build(tmp_path, str(tmp_path / "nowhere" / "python3"))
    assert code == 1
    assert str(reply["error"]).startswith(f"cannot run the host's python {tmp_path}/nowhere")
