"""A venv is reused only by a job of the same settings (issue 47): `system_site_packages` and
the base interpreter are part of its identity, so each setting gets its own venv and the
TensorFlow each task sees is the one its settings give. Small wheels built here; the tasks ask
whether TensorFlow is importable without importing it."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.lab import VENV_PYTHON, Lab
from tests.support.lab_cli import tfdeploy
from tests.support.wheels import make_wheel

BASE = "/usr/bin/python3"  # the hosts' system Python: no TensorFlow

PROBE = """\
import os, importlib.util, tinypkg
tf = "yes" if importlib.util.find_spec("tensorflow") else "no"
print("venv", os.environ.get("VIRTUAL_ENV"), "tf", tf, "tinypkg", tinypkg.VALUE)
"""


@pytest.fixture
def index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    wheels = tmp_path / "index"
    make_wheel(wheels, "tinypkg")
    for name, value in {
        "PIP_CONFIG_FILE": "/dev/null",
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(wheels),
        "PIP_CACHE_DIR": str(tmp_path / "pip-cache"),
    }.items():
        monkeypatch.setenv(name, value)
    return wheels


def test_each_setting_gets_its_own_venv_and_sees_what_it_asks_for(
    lab: Lab, lab_inventory: Callable[..., Path], tmp_path: Path, index: Path
) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "probe.py").write_text(PROBE)
    (code / "requirements.txt").write_text("tinypkg==1.0\n")
    state = tmp_path / "state"

    def up(**settings: object) -> tuple[str, str]:
        job = {
            "requirements": "requirements.txt",
            "command": "python probe.py",
            "require_tensorflow": False,
            **settings,
        }
        inventory = lab_inventory([[{"role": "worker"}]], code=code, job=job)
        out = tfdeploy("up", str(inventory), state=state, check_rc=0).stdout
        found = re.findall(r"venv (\S+) tf (yes|no) tinypkg 1.0", out)
        assert len(found) == 1, out
        return found[0]

    isolated, tf = up(python=VENV_PYTHON, system_site_packages=False)
    assert tf == "no"
    # Before: the same hash, the isolated venv reused, and TensorFlow "not installed".
    seeing, tf = up(python=VENV_PYTHON, system_site_packages=True)
    assert tf == "yes" and seeing != isolated
    # Before: the venv over the TF venv's python reused for the bare system Python (the same
    # version), and the task saw a TensorFlow its interpreter does not have.
    bare, tf = up(python=BASE, system_site_packages=True)
    assert tf == "no" and bare not in (isolated, seeing)
    # The same settings again: the same venv, reused.
    again, tf = up(python=VENV_PYTHON, system_site_packages=True)
    assert (again, tf) == (seeing, "yes")
