"""A wheel damaged in the controller's environment cache (same size, other bytes) is named as
the cache's, with `--refresh-env` as the fix, and its entry removed, so the next `up` resolves
afresh and runs (issue 47). Before: "job.code: ... changed while tfdeploy was pushing it", on
every `up`, forever."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.lab import Lab
from tests.support.lab_cli import tfdeploy
from tests.support.wheels import make_wheel

BASE = "/usr/bin/python3"


@pytest.fixture
def index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    wheels = tmp_path / "index"
    # Bytes no host's store holds yet: the push must send this wheel.
    token = secrets.token_hex(16).encode()
    make_wheel(
        wheels, "tinypkg", files={"tinypkg.py": b"VALUE = '1.0'\nTOKEN = '" + token + b"'\n"}
    )
    for name, value in {
        "PIP_CONFIG_FILE": "/dev/null",
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(wheels),
        "PIP_CACHE_DIR": str(tmp_path / "pip-cache"),
    }.items():
        monkeypatch.setenv(name, value)
    return wheels


def test_a_damaged_cached_wheel_is_named_as_the_caches_and_removed(
    lab: Lab, lab_inventory: Callable[..., Path], tmp_path: Path, index: Path
) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "probe.py").write_text("import tinypkg; print('tinypkg', tinypkg.VALUE)\n")
    (code / "requirements.txt").write_text("tinypkg==1.0\n")
    job = {
        "python": BASE,
        "requirements": "requirements.txt",
        "command": "python probe.py",
        "require_tensorflow": False,
    }
    inventory = lab_inventory([[{"role": "worker"}]], code=code, job=job)
    state = tmp_path / "state"
    tfdeploy("check", str(inventory), state=state, check_rc=0)  # resolves into the cache
    (wheel,) = (state / "envs").glob("*/wheels/tinypkg-*.whl")
    data = bytearray(wheel.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, other bytes: the size check cannot see it
    wheel.write_bytes(bytes(data))

    failed = tfdeploy("up", str(inventory), state=state, check_rc=2)
    said = " ".join((failed.stdout + failed.stderr).split())
    assert f"{wheel} in tfdeploy's cache on this machine is damaged" in said, said
    assert "tfdeploy up --refresh-env" in said and "changed while tfdeploy" not in said, said
    assert "Traceback" not in said and not wheel.parent.parent.exists(), said

    again = tfdeploy("up", str(inventory), state=state, check_rc=0).stdout
    assert "tinypkg 1.0" in again, again
