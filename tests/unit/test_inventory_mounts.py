"""`container_mounts` are normalised and refused at inventory time when the runtime would fail
on them at start (issue 47): `/`, a path with `..`, or one that shadows /proc, /sys or /dev.
Before, they passed `check` and the task died at start with runc's words."""

from __future__ import annotations

from pathlib import Path

import pytest

from deployer.config.inventory import load_inventory
from deployer.core.errors import ExitStatus, InventoryError
from tests.support.helpers import JOB, TWO_HOSTS, write_toml


def _load(tmp_path: Path, mounts: str) -> tuple[str, ...]:
    path = write_toml(tmp_path, JOB + f"container_mounts = {mounts}\n" + TWO_HOSTS)
    return load_inventory(path).job.container_mounts


@pytest.mark.parametrize(
    ("mount", "said"),
    [
        ("/", "whole file system"),
        ("//", "whole file system"),
        ("/:ro", "whole file system"),
        ("/data/..", "contains `..`"),
        ("/data/../etc", "contains `..`"),
        ("/proc", "shadow /proc"),
        ("/proc/sys:ro", "shadow /proc"),
        ("/sys", "shadow /sys"),
        ("/sys/fs/cgroup", "shadow /sys"),
        ("/dev", "shadow /dev"),
        ("/dev/", "shadow /dev"),
        ("/./dev", "shadow /dev"),
    ],
)
def test_a_mount_the_runtime_cannot_take_is_refused_naming_file_key_value_and_fix(
    tmp_path: Path, mount: str, said: str
) -> None:
    with pytest.raises(InventoryError) as caught:
        _load(tmp_path, f'["/data", "{mount}"]')
    text = str(caught.value)
    assert "job.container_mounts" in text and repr(mount) in text and said in text, text
    assert str(tmp_path) in text, text
    assert "/data" in (caught.value.hint or "") and caught.value.exit_status is ExitStatus.USAGE


def test_mounts_are_normalised_and_folders_under_dev_allowed(tmp_path: Path) -> None:
    mounts = _load(tmp_path, '["/data/", "/opt//tools/.:ro", "/dev/shm", "/data"]')
    assert mounts == ("/data", "/opt/tools:ro", "/dev/shm")
