"""A host named by an ssh_config `Host` alias: the alias is known only to this machine, so the
TF address other hosts dial is the alias's HostName, read from the same ssh_config the transport
connects through; where a port forward hides it, `plan` says tf_address must be set.

The lab's alias tests (tests/integration/test_security.py) connect through such a file.
"""

from __future__ import annotations

from pathlib import Path

from deployer.up.netplan import links
from tests.support.helpers import JOB, plan, plan_error, tf_config, toml_value

CONFIG = """
Host gpu1
  HostName 10.0.0.11
Host gpu2
  HostName gpu2.internal.example.org
  Port 2200
Host vm1
  HostName 127.0.0.1
  Port 2222
Host vm2
  HostName 127.0.0.1
  Port 2200
"""


def inventory(tmp_path: Path, *hosts: str, extra: str = "") -> str:
    config = tmp_path / "ssh_config"
    config.write_text(CONFIG)
    text = JOB + f"\n[ssh]\nssh_config = {toml_value(str(config))}\n"
    for address in hosts:
        text += f'\n[[hosts]]\naddress = "{address}"\n{extra}tasks = [{{ role = "worker" }}]\n'
    return text


def test_every_tf_config_names_the_aliases_hostname(tmp_path: Path) -> None:
    p = plan(tmp_path, inventory(tmp_path, "gpu1", "gpu2", "10.0.0.13"))
    cluster = ["10.0.0.11:2222", "gpu2.internal.example.org:2222", "10.0.0.13:2222"]
    for task in p.tasks:
        assert tf_config(p, task.name)["cluster"] == {"worker": cluster}
    assert [h.address for h in p.hosts] == ["gpu1", "gpu2", "10.0.0.13"]  # SSH keeps the alias
    assert [h.name for h in p.hosts] == ["gpu1", "gpu2", "10.0.0.13"]
    # The network check probes what TF will dial, not the alias.
    assert {x.address for x in links(p)} == {
        "10.0.0.11",
        "gpu2.internal.example.org",
        "10.0.0.13",
    }


def test_a_written_tf_address_wins_over_the_hostname(tmp_path: Path) -> None:
    p = plan(tmp_path, inventory(tmp_path, "gpu1", extra='tf_address = "192.168.7.1"\n'))
    assert tf_config(p, "worker:0")["cluster"] == {"worker": ["192.168.7.1:2222"]}


def test_aliases_behind_one_port_forward_must_set_tf_address(tmp_path: Path) -> None:
    error = plan_error(tmp_path, inventory(tmp_path, "vm1", "vm2"))
    assert error.key == "hosts[1].tf_address"
    assert "must be set: ssh_config gives 'vm2' and 'vm1' the same HostName '127.0.0.1'" in (
        error.message
    )
    assert "(a port forward)" in error.message
    assert "set tf_address on each of these hosts" in (error.hint or "")
    # Written, the plan holds.
    p = plan(tmp_path, inventory(tmp_path, "vm1", extra='tf_address = "10.1.0.1"\n'))
    assert tf_config(p, "worker:0")["cluster"] == {"worker": ["10.1.0.1:2222"]}
