"""Each host stores only what its own tasks need (issue 50): its environments' wheels, uv's wheel
for its own platform; the fan-out relays the rest through it without writing it there.

- a job whose evaluator has its own environment: the workers never store the evaluator's wheels,
  though the stream that carries them passes through the workers;
- a mixed-platform job: an x86_64 host and a host whose Python reports i686 (`setarch i686`, as
  the lab can fake a platform: uname's machine is what the agent reports): each stores only its
  platform's uv wheel (the i686 host, with no uv wheel for it, installs with pip).

Wheels are made here and served from a folder; uv's is this machine's binary in a wheel.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from deployer.envs.uv import UV_VERSION
from tests.lab import Lab, LabHost
from tests.support.lab_cli import tfdeploy
from tests.support.wheels import make_uv_wheel, make_wheel, sha256, uv_binary

UV = uv_binary()
pytestmark = pytest.mark.skipif(UV is None, reason="no uv binary here (dev extra: pip install uv)")
BASE = "/usr/bin/python3"
WORKDIR = "/root/.tfdeploy"
TRAIN = "import tinypkg, sys; print('ran in', sys.prefix)\n"


@pytest.fixture
def index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    wheels = tmp_path / "index"
    make_wheel(wheels, "tinypkg", requires=["tinydep"])
    make_wheel(wheels, "tinydep", "2.0")
    # 2 MiB that do not compress: enough for the fan-out to stream (it starts at 1 MiB).
    make_wheel(wheels, "evalpkg", "1.0", files={"evalpkg.bin": os.urandom(2 << 20)})
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


@pytest.fixture
def clean_stores(lab: Lab) -> Iterator[None]:
    """Every lab host starts with an empty workdir, so what its store holds is this test's."""
    for host in lab.hosts:
        lab.run(host, f"rm -rf {WORKDIR}").check_returncode()
    yield


def _code(tmp_path: Path) -> Path:
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text(TRAIN)
    return code


def _stores(lab: Lab, host: LabHost, digests: dict[str, str]) -> set[str]:
    """The names of `digests` ({name: sha256}) that the host's store holds."""
    held = lab.run(host, f"ls -A {WORKDIR}/store 2>/dev/null").stdout.split()
    return {name for name, digest in digests.items() if digest in held}


def test_workers_do_not_store_the_wheels_of_an_evaluator_with_its_own_environment(
    lab: Lab,
    clean_stores: None,
    lab_inventory: Callable[..., Path],
    tmp_path: Path,
    index: Path,
) -> None:
    job: dict[str, Any] = {
        "python": BASE,
        "requirements": ["tinypkg==1.0"],
        "role_requirements": {"evaluator": ["tinypkg==1.0", "evalpkg==1.0"]},
        "require_tensorflow": False,
        "command": "python3 train.py",
    }
    h1, h2, h3 = lab.hosts[:3]
    tasks = [[{"role": "worker"}], [{"role": "worker"}], [{"role": "evaluator"}]]
    inventory = lab_inventory(tasks, code=_code(tmp_path), job=job, hosts=[h1, h2, h3])
    out = tfdeploy("up", str(inventory), state=tmp_path / "state", check_rc=0).stdout
    assert "fan-out:" in out, out  # the evaluator's wheel travelled along the chain
    assert out.count("ran in ") == 3, out
    digests = {p.name.split("-")[0]: sha256(p) for p in index.glob("*.whl")}
    for worker in (h1, h2):
        assert _stores(lab, worker, digests) == {"tinypkg", "tinydep", "uv"}, worker.name
    assert _stores(lab, h3, digests) == {"tinypkg", "tinydep", "uv", "evalpkg"}


@pytest.fixture
def i686_python() -> Iterator[str]:
    """A `python` whose platform facts say i686: this machine's Python under `setarch i686`.
    In /var/tmp, which lab hosts see (their /tmp is their own)."""
    if shutil.which("setarch") is None:
        pytest.skip("no setarch here (util-linux)")
    folder = Path(tempfile.mkdtemp(prefix="tfd-i686-", dir="/var/tmp"))
    folder.chmod(0o755)
    wrapper = folder / "python3"
    wrapper.write_text(f'#!/bin/sh\nexec setarch i686 {BASE} "$@"\n')
    wrapper.chmod(0o755)
    try:
        yield str(wrapper)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_a_mixed_platform_job_stores_on_each_host_only_its_platforms_wheels(
    lab: Lab,
    clean_stores: None,
    lab_inventory: Callable[..., Path],
    i686_python: str,
    tmp_path: Path,
    index: Path,
) -> None:
    job: dict[str, Any] = {
        "python": BASE,
        "requirements": ["tinypkg==1.0"],
        "require_tensorflow": False,
        "command": "python3 train.py",
    }
    h1, h2 = lab.hosts[:2]
    inventory = lab_inventory(
        [[{"role": "worker"}], [{"role": "worker"}]],
        code=_code(tmp_path),
        job=job,
        hosts=[h1, h2],
        per_host={h2.name: {"python": i686_python}},
    )
    out = tfdeploy("up", str(inventory), state=tmp_path / "state", check_rc=0).stdout
    said = dict(re.findall(r"environment [0-9a-f]{12} for (\S+): CPython 3\.\d+, (\S+),", out))
    assert said == {h1.name: "manylinux_2_36_x86_64", h2.name: "manylinux_2_36_i686"}, out
    assert "fan-out:" in out, out  # uv's wheel (MBs) went along the chain, through both hosts
    assert re.search(rf"environment built on .*{h1.name} \(uv, ", out), out
    assert re.search(rf"environment built on .*{h2.name} \(pip, ", out), out
    digests = {p.name.split("-")[0]: sha256(p) for p in index.glob("*.whl")}
    assert _stores(lab, h1, digests) == {"tinypkg", "tinydep", "uv"}
    assert _stores(lab, h2, digests) == {"tinypkg", "tinydep"}  # no x86_64 uv wheel stored
