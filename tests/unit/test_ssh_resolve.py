"""How a host spec and the user's ssh_config become the address, port, user and keys to use.

The lab tests (tests/integration/test_transport.py) connect through these; here each rule of
OpenSSH's precedence is pinned on its own: explicit values, then `user@host:port`, then the
file, then the local user and port 22.
"""

from __future__ import annotations

import getpass
import io
import os
import subprocess
import sys
from pathlib import Path

import paramiko
import pytest

from deployer.config.model import SSHSettings
from deployer.core.errors import HostError
from deployer.hosts.ssh import Endpoint, _resolve, plan_hops

ROOT = Path(__file__).resolve().parents[2]

CONFIG = """
Host web
  HostName 10.0.0.5
  User ubuntu
  Port 2200
  IdentityFile ~/.ssh/web_key
  ProxyJump admin@bastion:2022

Host bastion
  HostName 192.0.2.1
  IdentityFile /keys/bastion

Host legacy
  ProxyCommand nc %h %p
"""


@pytest.fixture
def config() -> paramiko.SSHConfig:
    return paramiko.SSHConfig.from_file(io.StringIO(CONFIG))


def test_the_file_supplies_hostname_user_port_and_keys(config: paramiko.SSHConfig) -> None:
    r = _resolve("web", config)
    assert (r.host, r.port, r.user) == ("10.0.0.5", 2200, "ubuntu")
    assert r.keys == [os.path.expanduser("~/.ssh/web_key")]  # paramiko expands the ~


def test_explicit_values_win_over_the_spec_and_the_file(config: paramiko.SSHConfig) -> None:
    r = _resolve("deploy@web:2300", config, user="root", port=2400)
    assert (r.host, r.port, r.user) == ("10.0.0.5", 2400, "root")
    r = _resolve("deploy@web:2300", config)
    assert (r.host, r.port, r.user) == ("10.0.0.5", 2300, "deploy")


def test_an_unknown_name_gets_the_local_user_and_port_22(config: paramiko.SSHConfig) -> None:
    r = _resolve("10.9.9.9", config)
    assert (r.host, r.port, r.user, r.keys) == ("10.9.9.9", 22, getpass.getuser(), [])


def test_an_ipv6_address_is_not_split_at_its_colons(config: paramiko.SSHConfig) -> None:
    r = _resolve("fd00::5", config)
    assert (r.host, r.port) == ("fd00::5", 22)


def _endpoint(address: str, **settings: str) -> Endpoint:
    return Endpoint("h1", address, SSHSettings(**settings))


def test_plan_follows_proxyjump_through_the_file(tmp_path: Path) -> None:
    path = tmp_path / "ssh_config"
    path.write_text(CONFIG)
    hops = plan_hops(_endpoint("web", ssh_config=str(path), identity="/keys/mine"))
    jump, target = hops
    assert (jump.host, jump.port, jump.user) == ("192.0.2.1", 2022, "admin")
    assert jump.label == "jump host admin@bastion:2022 (192.0.2.1:2022)"
    assert jump.keys == ["/keys/bastion", "/keys/mine"]
    assert (target.host, target.port, target.user, target.label) == ("10.0.0.5", 2200, "ubuntu", "")
    assert target.keys[0] == "/keys/mine"  # the inventory's identity first
    # A host's own `jump = "none"` turns the file's ProxyJump off.
    (only,) = plan_hops(_endpoint("web", ssh_config=str(path), jump="none"))
    assert only.host == "10.0.0.5"


def test_proxycommand_is_refused_with_the_alternative(tmp_path: Path) -> None:
    path = tmp_path / "ssh_config"
    path.write_text(CONFIG)
    with pytest.raises(HostError, match="ProxyCommand") as caught:
        plan_hops(_endpoint("legacy", ssh_config=str(path)))
    assert "ProxyJump" in str(caught.value.hint)


def test_invoke_loads_only_at_a_match_exec_line(tmp_path: Path) -> None:
    """paramiko imports invoke (~40 ms) for `Match exec` only: tfdeploy's commands start without
    it (deployer/hosts/__init__.py), and such a line still runs through it. In a process of its
    own: this module imported paramiko, and invoke with it, before deployer.hosts."""
    path = tmp_path / "ssh_config"
    path.write_text("Match exec true\n  User matched\n")
    script = f"""
import sys
from deployer.hosts.ssh import _resolve
import paramiko
assert "invoke.tasks" not in sys.modules, "invoke was imported at start"
config = paramiko.SSHConfig.from_path({str(path)!r})
print(_resolve("web", config).user, "invoke.tasks" in sys.modules)
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["matched", "True"]


def test_match_exec_without_invoke_says_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """paramiko runs `Match exec` through invoke, which fabric used to bring along."""
    import paramiko.config

    monkeypatch.setattr(paramiko.config, "invoke", None)
    monkeypatch.setattr(paramiko.config, "invoke_import_error", ImportError("no invoke"))
    path = tmp_path / "ssh_config"
    path.write_text("Match exec true\n  User ubuntu\n")
    with pytest.raises(HostError, match="Match exec") as caught:
        plan_hops(_endpoint("web", ssh_config=str(path)))
    assert "pip install invoke" in str(caught.value.hint)
