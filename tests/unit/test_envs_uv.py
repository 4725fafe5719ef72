"""Which installer each host platform gets (deployer/envs/uv.py), with real pip resolving from a
folder made here: uv where its wheel exists for the platform, pip where it does not (said, and
remembered so the next `up` does not ask pip again), pip when the job says so.

pip runs a few times (~1 s each), so the module is marked slow.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from deployer.envs import uv
from deployer.envs.platform import HostPlatform
from tests.support.wheels import make_uv_wheel, make_wheel

pytestmark = pytest.mark.slow

X86 = HostPlatform.of("3.11.2", "x86_64", "2.36")
ARM = HostPlatform.of("3.11.2", "aarch64", "2.36")  # a faked aarch64 host's facts
MUSL = HostPlatform.of("3.11.2", "x86_64", None)


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """pip here reads only this folder: an x86_64 uv wheel, and no aarch64 one."""
    wheels = tmp_path / "index"
    fake_binary = tmp_path / "uv-binary"
    fake_binary.write_bytes(b"#!/bin/sh\n")
    make_uv_wheel(wheels, fake_binary, version=uv.UV_VERSION, machine="x86_64")
    make_wheel(wheels, "tinypkg", "1.0")
    for name, value in {
        "PIP_CONFIG_FILE": "/dev/null",
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(wheels),
        "PIP_CACHE_DIR": str(tmp_path / "pip-cache"),
        "TFDEPLOY_STATE_DIR": str(tmp_path / "state"),
    }.items():
        monkeypatch.setenv(name, value)
    return wheels


def test_uv_for_a_platform_with_its_wheel_pip_said_for_one_without(folder: Path) -> None:
    x86 = uv.choose("uv", X86)
    assert x86.installer == "uv" and x86.wheelhouse is not None, x86
    assert [w.file for w in x86.wheelhouse.wheels] == [
        f"uv-{uv.UV_VERSION}-py3-none-manylinux_2_17_x86_64.whl"
    ]
    arm = uv.choose("uv", ARM)
    assert (arm.installer, arm.wheelhouse) == ("pip", None), arm
    assert arm.said() == (
        f"installed with pip (uv=={uv.UV_VERSION}: no wheel for CPython 3.11, "
        "manylinux_2_36_aarch64)"
    ), arm.said()
    # Remembered: the next up does not run pip for it, even once the wheel exists ...
    make_uv_wheel(folder, folder.parent / "uv-binary", version=uv.UV_VERSION, machine="aarch64")
    assert uv.choose("uv", ARM) == arm
    # ... until asked afresh (`--refresh-env`), which runs pip again.
    again = uv.choose("uv", ARM, refresh=True)
    assert again.installer == "uv" and again.wheelhouse is not None, again
    assert "aarch64" in again.wheelhouse.wheels[0].file, again


def test_pip_by_choice_and_for_a_host_without_glibc(folder: Path) -> None:
    assert uv.choose("pip", X86) == uv.Choice("pip", None)
    musl = uv.choose("uv", MUSL)
    assert musl.installer == "pip" and "(no glibc)" in musl.why, musl
