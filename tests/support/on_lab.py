"""On lab hosts: an installed agent over an SSH connection of its own (`lab_agent`), and a TCP
port of one host blocked for another with nftables (`blocked`), or any nft rule (`filtered`)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from deployer.config.model import SSHSettings
from deployer.hosts.agent import Agent
from deployer.hosts.ssh import Endpoint
from deployer.hosts.ssh_transport import SSHTransport
from tests.lab import Lab, LabHost


def lab_agent(lab: Lab, host: LabHost) -> Agent:
    """The agent on a lab host, installed, over an SSH connection of its own."""
    transport = SSHTransport(
        Endpoint(
            host.name,
            host.address,
            SSHSettings(
                port=host.port,
                user=lab.user,
                identity=str(lab.key_path),
                known_hosts=str(lab.known_hosts),
                ssh_config=os.devnull,
                connect_timeout=5,
            ),
        )
    )
    agent = Agent(transport, python=lab.python, workdir="~/.tfdeploy")
    agent.install()
    return agent


TABLE = "tfdeploy_test_netcheck"


@contextmanager
def filtered(lab: Lab, host: LabHost, hook: str, rule: str) -> Iterator[None]:
    """On `host`, packets matching the nft `rule` (e.g. "tcp dport 2222 drop") at the `input` or
    `output` hook, until the block ends."""
    script = (
        f"nft add table inet {TABLE} && "
        f"nft add chain inet {TABLE} {hook} '{{ type filter hook {hook} priority -10 ; }}' && "
        f"nft add rule inet {TABLE} {hook} {rule}"
    )
    done = lab.run(host, script)
    assert done.returncode == 0, done.stderr
    try:
        yield
    finally:
        lab.run(host, f"nft delete table inet {TABLE}")


@contextmanager
def blocked(lab: Lab, host: LabHost, source: LabHost, port: int, verdict: str) -> Iterator[None]:
    """On `host`, TCP from `source` to `port` is dropped ("drop") or refused ("reject")."""
    action = "drop" if verdict == "drop" else "reject with tcp reset"
    with filtered(lab, host, "input", f"ip saddr {source.address} tcp dport {port} {action}"):
        yield
