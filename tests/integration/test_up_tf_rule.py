"""One TensorFlow rule over every task (issue 47): a task on the host's python and a task in a
venv of the host's own `requirements` are compared, and a mix is refused by `check` unless the
inventory allows it. Before, preflight compared only hosts without a venv, the venv hosts were
compared among themselves after the install, and this job ran TensorFlow 2.21 and 2.15 without
a word. The venv holds a small local wheel; its TensorFlow comes from system_site_packages."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.lab import VENV_PYTHON, Lab
from tests.support.lab_cli import tfdeploy
from tests.support.wheels import make_wheel

PYTHON_TF215 = "/opt/tfdeploy/venv-tf215/bin/python"


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


def test_a_host_python_task_and_a_venv_task_on_other_tensorflow_are_refused_unless_allowed(
    lab: Lab, lab_inventory: Callable[..., Path], tmp_path: Path, index: Path
) -> None:
    if not Path(PYTHON_TF215).is_file():
        pytest.skip(f"{PYTHON_TF215} is missing: scripts/install.sh installs it")
    h1, h2 = lab.hosts[:2]
    code = tmp_path / "code"
    code.mkdir()
    (code / "requirements.txt").write_text("tinypkg==1.0\n")
    (code / "train.py").write_text("print('ran')\n")

    def inventory(**job: object) -> Path:
        return lab_inventory(
            [[{"role": "worker"}], [{"role": "worker"}]],
            code=code,
            job={"python": VENV_PYTHON, "system_site_packages": True, **job},
            # h2's tasks run in a venv of its own requirements over the TF 2.15 python
            per_host={h2.name: {"python": PYTHON_TF215, "requirements": "requirements.txt"}},
        )

    refused = tfdeploy("check", str(inventory()), state=tmp_path / "state", check_rc=3)
    said = " ".join((refused.stdout + refused.stderr).split())
    assert "hosts disagree on the TensorFlow version: the tasks would run 2.15.1, 2.21.0" in said
    assert f"{h1.name}: TensorFlow 2.21.0 for worker:0 ({VENV_PYTHON})" in said, said
    assert f"{h2.name}: TensorFlow 2.15.1 for worker:1 (venv " in said, said
    assert "allow_mixed_tensorflow = true" in said and "check ok" not in said, said

    allowed = tfdeploy(
        "check", str(inventory(allow_mixed_tensorflow=True)), state=tmp_path / "state", check_rc=0
    )
    out = " ".join(allowed.stdout.split())
    assert "warning: mixed TensorFlow (allow_mixed_tensorflow = true): 2.15.1 on " in out, out
    assert f"worker:1@{h2.name}" in out and "check ok" in out, out
