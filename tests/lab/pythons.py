"""CPython builds of several versions where lab hosts can run them (real fleets vary: 3.8-3.13).

The machine has pyenv builds under /root/.pyenv/versions, which lab hosts cannot see (their /root
is private). Each build needed is copied once to /opt/tfdeploy/pythons/<version> and kept there:
the executable, libpython and the standard library (no tests, site-packages or GUI modules).
pyenv links the executable to libpython through an absolute RUNPATH under /root; the copy's
RUNPATH is rewritten in place to `$ORIGIN/../lib`, so the copy starts like a system Python, with
no wrapper and no LD_LIBRARY_PATH that would leak into the tasks it starts.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.lab.model import LabUnsupported

PYTHONS_DIR = Path("/opt/tfdeploy/pythons")
# Bumped when the copy's layout changes, so an older cache is rebuilt instead of trusted.
LAYOUT = "1"
_MARKER = ".tfdeploy-lab"
_ORIGIN_LIB = b"$ORIGIN/../lib"
_BROKEN_LIB = b"/nonexistent"
# Top-level stdlib entries no lab job needs: ~60% of a build's size.
_SKIP_STDLIB = {"test", "idlelib", "tkinter", "turtledemo", "site-packages", "__phello__"}
_VERSION_RE = re.compile(r"^3\.(\d+)\.(\d+)$")


@dataclass(frozen=True)
class HostPython:
    """One interpreter lab hosts can run: its full version and the executable's path."""

    version: str  # "3.9.18"
    path: str  # "/opt/tfdeploy/pythons/3.9.18/bin/python3.9"

    @property
    def minor(self) -> str:
        return self.version.rsplit(".", 1)[0]


def source_dirs() -> list[Path]:
    """Where pyenv builds may be: $PYENV_ROOT, root's pyenv, the user's own pyenv."""
    roots = [os.environ.get("PYENV_ROOT", ""), "/root/.pyenv", str(Path.home() / ".pyenv")]
    found: list[Path] = []
    for root in roots:
        if root and _is_dir(Path(root, "versions")) and Path(root) not in found:
            found.append(Path(root))
    return [r / "versions" for r in found]


def _is_dir(path: Path) -> bool:
    try:
        return path.is_dir()
    except PermissionError:  # another user's pyenv (e.g. root's, seen by a non-root runner)
        return False


def _by_minor(names: list[str]) -> dict[str, str]:
    """{"3.9": "3.9.18"}: the newest patch release of each minor version among `names`."""
    best: dict[str, tuple[int, str]] = {}
    for name in names:
        m = _VERSION_RE.match(name)
        if m and (int(m[2]) > best.get(f"3.{m[1]}", (-1, ""))[0]):
            best[f"3.{m[1]}"] = (int(m[2]), name)
    return {minor: name for minor, (_, name) in best.items()}


def _listdir(path: Path) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def available() -> dict[str, str]:
    """Minor version -> full version of every build found (copied already, or copyable)."""
    names = _listdir(PYTHONS_DIR)
    cached = [n for n in names if _is_complete(PYTHONS_DIR / n)]
    sources = [n for d in source_dirs() for n in _listdir(d)]
    return _by_minor(cached + sources)


def _executable(root: Path, version: str) -> Path:
    minor = version.rsplit(".", 1)[0]
    return root / "bin" / f"python{minor}"


def _is_complete(dest: Path) -> bool:
    try:
        return (dest / _MARKER).read_text().strip() == LAYOUT
    except OSError:
        return False


def host_python(minor: str) -> HostPython:
    """The lab copy of the newest build of `minor` ("3.9"), made now if it is not there yet.

    Raises LabUnsupported, with the reason, when the machine has no such build or the copy
    cannot be made (no pyenv, or no write access to /opt/tfdeploy without root).
    """
    version = available().get(minor)
    if version is None:
        have = ", ".join(sorted(available(), key=lambda v: int(v.split(".")[1]))) or "none"
        raise LabUnsupported(
            f"no CPython {minor} build on this machine (pyenv builds found: {have})"
        )
    dest = PYTHONS_DIR / version
    if not _is_complete(dest):
        _copy_build(version, dest)
    return HostPython(version, str(_executable(dest, version)))


def broken_python(minor: str) -> str:
    """An interpreter of `minor` that exists but cannot start: libpython is not found.

    The loader's message ("error while loading shared libraries: libpython3.X.so.1.0 ...") and
    exit status 127 are what a half-installed Python on a real host gives.
    """
    good = host_python(minor)
    return f"{good.path}-broken"


def _source(version: str) -> Path:
    for d in source_dirs():
        if _is_dir(d / version):
            return d / version
    raise LabUnsupported(f"CPython {version} is cached incompletely and its pyenv build is gone")


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    try:
        PYTHONS_DIR.mkdir(parents=True, exist_ok=True)
        PYTHONS_DIR.chmod(0o755)
        lock = open(PYTHONS_DIR / ".lock", "a")  # noqa: SIM115 (held for the whole block)
    except OSError as e:
        raise LabUnsupported(f"cannot write {PYTHONS_DIR} to copy interpreters: {e}") from e
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two test runs never build the same copy at once
        yield


def _copy_build(version: str, dest: Path) -> None:
    src = _source(version)
    with _locked():
        if _is_complete(dest):
            return  # another run made it while we waited for the lock
        for stale in PYTHONS_DIR.glob(".build-*"):
            shutil.rmtree(stale, ignore_errors=True)  # of a run killed mid-copy
        work = PYTHONS_DIR / f".build-{version}-{os.getpid()}"
        try:
            _fill(src, work, version)
            _check(work, version)
            shutil.rmtree(dest, ignore_errors=True)  # an older layout
            work.rename(dest)
        finally:
            shutil.rmtree(work, ignore_errors=True)


def _fill(src: Path, work: Path, version: str) -> None:
    """Copy what an interpreter needs to start and run the stdlib; rewrite its RUNPATH."""
    minor = version.rsplit(".", 1)[0]
    (work / "bin").mkdir(parents=True)
    exe = _executable(work, version)
    broken = Path(f"{exe}-broken")
    for copy, runpath in ((exe, _ORIGIN_LIB), (broken, _BROKEN_LIB)):
        shutil.copy2(_executable(src, version), copy)
        _patch_runpath(copy, f"{src}/lib".encode(), runpath)
    for alias in ("python3", "python"):
        (work / "bin" / alias).symlink_to(exe.name)
    (work / "lib").mkdir()
    for lib in (src / "lib").glob("libpython*.so*"):
        if not lib.is_symlink():
            shutil.copy2(lib, work / "lib" / lib.name)
    for lib in (src / "lib").glob("libpython*.so*"):
        if lib.is_symlink():
            (work / "lib" / lib.name).symlink_to(os.readlink(lib))
    stdlib = f"python{minor}"

    def skip(directory: str, names: list[str]) -> set[str]:
        if Path(directory) != src / "lib" / stdlib:
            return set()
        return {n for n in names if n in _SKIP_STDLIB or n.startswith("config-")}

    shutil.copytree(src / "lib" / stdlib, work / "lib" / stdlib, symlinks=True, ignore=skip)
    (work / "lib" / stdlib / "site-packages").mkdir()
    subprocess.run(["chmod", "-R", "a+rX", str(work)], check=True)
    (work / _MARKER).write_text(LAYOUT + "\n")  # last: only a whole copy is ever trusted


def _patch_runpath(exe: Path, old: bytes, new: bytes) -> None:
    """Replace the executable's RUNPATH string in place (NUL-padded to the same length)."""
    data = exe.read_bytes()
    needle = old + b"\0"
    if data.count(needle) != 1:
        raise LabUnsupported(f"{exe}: expected its RUNPATH {old.decode()!r} once in the file")
    if len(new) > len(old):
        raise LabUnsupported(f"{exe}: RUNPATH {old.decode()!r} is too short to rewrite")
    exe.write_bytes(data.replace(needle, new.ljust(len(old), b"\0") + b"\0"))


def _check(dest: Path, version: str) -> None:
    """The copy must start with an empty environment and know it lives where it was put."""
    exe = _executable(dest, version)
    probe = "import sys, json, subprocess, ssl, hashlib; print(sys.prefix, sys.version.split()[0])"
    done = subprocess.run([str(exe), "-c", probe], capture_output=True, text=True, env={})
    if done.returncode != 0 or done.stdout.split() != [str(dest), version]:
        raise LabUnsupported(
            f"the copy of CPython {version} in {dest} does not run on its own: "
            f"{(done.stderr or done.stdout).strip()[:300]}"
        )
