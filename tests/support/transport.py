"""For transport tests on both sides of the lab: endpoints, keys, hostile argv, HostErrors."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from deployer.config.model import SSHSettings
from deployer.core.errors import HostError
from deployer.hosts.ssh import Endpoint
from tests.support.helpers import HOSTILE_STRINGS

# Each would run `touch MARK` if it reached a shell unquoted or quoted twice; "" must survive too.
HOSTILE = [*HOSTILE_STRINGS, ""]


def endpoint(name: str, address: str, **settings: Any) -> Endpoint:
    return Endpoint(name, address, SSHSettings(**settings))


def expect_host_error(fn: Any, pattern: str) -> HostError:
    with pytest.raises(HostError) as info:
        fn()
    assert re.search(pattern, info.value.message), info.value.message
    return info.value


def make_key(tmp_path: Path, name: str, passphrase: str = "") -> Path:
    path = tmp_path / name
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", passphrase, "-f", str(path)], check=True
    )
    return path
