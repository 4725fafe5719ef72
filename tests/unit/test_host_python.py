"""Host interpreters as fleets have them: old, missing, broken, or any of 3.8 to 3.13.

The agent runs through the local transport here (no sshd needed); the interpreters are the
machine's own CPython builds under pyenv, skipped where absent.
"""

from __future__ import annotations

import glob
import os
from pathlib import Path

import pytest

from deployer.core.errors import HostError
from deployer.hosts.agent import Agent
from deployer.hosts.local_transport import LocalTransport

PYENV = Path(os.environ.get("PYENV_ROOT", "/root/.pyenv")) / "versions"


def interpreter(version: str) -> str:
    """The machine's CPython `version` (e.g. "3.9"), or skip the test."""
    found = sorted(glob.glob(str(PYENV / f"{version}.*" / "bin" / f"python{version}")))
    if not found or not os.access(found[-1], os.X_OK):
        pytest.skip(f"no Python {version} on this machine (pyenv)")
    return found[-1]


def hello(python: str, workdir: Path) -> dict[str, object]:
    return Agent(LocalTransport("old"), python=python, workdir=str(workdir)).install()


@pytest.mark.parametrize("version", ["3.8", "3.9", "3.10", "3.12", "3.13"])
def test_the_agent_answers_on_every_supported_python(version: str, tmp_path: Path) -> None:
    python = interpreter(version)
    facts = hello(python, tmp_path / "wd")
    assert str(facts["python"]).startswith(version + "."), facts


@pytest.mark.parametrize("version", ["2.7", "3.6", "3.7"])
def test_a_python_older_than_3_8_is_named_with_its_version(version: str, tmp_path: Path) -> None:
    python = interpreter(version)
    with pytest.raises(HostError) as info:
        hello(python, tmp_path / "wd")
    message = info.value.message
    assert f"{python!r} is Python {version}." in message, message
    assert "needs Python 3.8 or newer" in message
    assert not (tmp_path / "wd").exists()  # refused before anything was written


def test_a_missing_interpreter_is_reported_as_missing(tmp_path: Path) -> None:
    with pytest.raises(HostError) as info:
        hello(str(tmp_path / "no" / "python3"), tmp_path / "wd")
    assert "was not found on the host" in info.value.message


def test_an_interpreter_that_cannot_start_shows_the_loaders_words(tmp_path: Path) -> None:
    """A python whose shared library is gone exits 127 like a missing one; its stderr says why."""
    broken = tmp_path / "python3.10"
    loader = (
        f"{broken}: error while loading shared libraries: libpython3.10.so.1.0: "
        "cannot open shared object file: No such file or directory"
    )
    broken.write_text(f"#!/bin/sh\necho '{loader}' >&2\nexit 127\n")
    broken.chmod(0o755)
    with pytest.raises(HostError) as info:
        hello(str(broken), tmp_path / "wd")
    message = info.value.message
    assert "cannot start" in message and "libpython3.10.so.1.0" in message, message
    assert "not found" not in message.split("cannot start")[0]


def test_hosts_sharing_a_home_install_the_agent_at_once(tmp_path: Path) -> None:
    """NFS homes: every host installs into the same directory at the same moment."""
    import sys
    from concurrent.futures import ThreadPoolExecutor

    workdir = tmp_path / "shared"

    def install(i: int) -> object:
        return Agent(LocalTransport(f"h{i}"), python=sys.executable, workdir=str(workdir)).install()

    for _ in range(3):  # a fresh directory each round: the race is in the first install
        with ThreadPoolExecutor(12) as pool:
            facts = list(pool.map(install, range(12)))
        assert all(f["workdir"] == str(workdir) for f in facts)  # type: ignore[index]
        assert not list(workdir.glob("agent/*/*.part*"))
        import shutil

        shutil.rmtree(workdir)
