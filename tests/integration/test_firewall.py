"""`firewall = true` on the lab: real nftables/iptables rules in each host's own network namespace.

A member of the cluster reaches a TF port, a lab host outside it does not, and no rule of the run
is left on any host once `up` ends or `down` stopped the run.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from deployer.core.errors import HostError
from deployer.hosts.agent import Agent
from tests.lab import Lab, LabHost
from tests.support.lab_cli import tfdeploy
from tests.support.on_lab import lab_agent

pytestmark = [pytest.mark.lab, pytest.mark.isolated]  # rules need each host's own netns

# Listens on its own TF port (from TF_CONFIG) like a TF server would: on every interface.
SERVE = """\
import json, os, socket
config = json.loads(os.environ["TF_CONFIG"])
me = config["task"]
port = int(config["cluster"][me["type"]][me["index"]].rsplit(":", 1)[1])
server = socket.create_server(("0.0.0.0", port))
print("serving", port, flush=True)
while True:
    conn, peer = server.accept()
    conn.sendall(b"tf")
    conn.close()
"""

# A member of the cluster: connects to the ps, then waits until the test says it is done.
PROBE = """\
import json, os, socket, sys, time
config = json.loads(os.environ["TF_CONFIG"])
host, port = config["cluster"]["ps"][0].rsplit(":", 1)
with socket.create_connection((host, int(port)), timeout=5) as s:
    print("member reached ps:", s.recv(2).decode(), flush=True)
deadline = time.monotonic() + 90
while not os.path.exists(sys.argv[1]) and time.monotonic() < deadline:
    time.sleep(0.1)
"""

# Run inside a lab host: "open", "refused" or "timeout" for one TCP connect.
CONNECT = """\
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])).close()
    print("open")
except ConnectionRefusedError:
    print("refused")
except OSError:
    print("timeout")
"""


def connect_from(lab: Lab, host: LabHost, address: str, port: int, timeout: float = 2) -> str:
    argv = ["/usr/bin/python3", "-c", CONNECT, address, str(port), str(timeout)]
    return lab.run(host, argv).stdout.strip()


def tfdeploy_rules(lab: Lab, host: LabHost) -> str:
    """Everything of tfdeploy in the host's firewall, from the tools themselves."""
    nft = lab.run(host, ["nft", "list", "ruleset"]).stdout
    ipt = lab.run(host, ["iptables", "-S"]).stdout + lab.run(host, ["ip6tables", "-S"]).stdout
    found = [line for line in (nft + ipt).splitlines() if "tfdeploy" in line]
    return "\n".join(found)


@pytest.fixture
def code(tmp_path: Path) -> Path:
    code = tmp_path / "code"
    code.mkdir()
    (code / "serve.py").write_text(SERVE)
    (code / "probe.py").write_text(PROBE)
    return code


def firewall_inventory(lab: Lab, lab_inventory: Any, code: Path, flag: str, **job: Any) -> Path:
    python = lab.python
    return lab_inventory(
        [[{"role": "ps"}], [{"role": "worker"}]],
        code=code,
        job={
            "name": "fw",
            "command": f"{python} probe.py /tmp/{flag}",
            "role_commands": {"ps": f"exec {python} serve.py"},
            "firewall": True,
            "stop_grace": 2,
            **job,
        },
    )


def test_only_members_reach_tf_ports_and_no_rule_outlives_up(
    clean_lab: Lab, lab_inventory: Any, code: Path, tmp_path: Path
) -> None:
    lab = clean_lab
    ps, member, outsider = lab.hosts[0], lab.hosts[1], lab.hosts[2]
    flag = f"fw-done-{os.getpid()}"
    inventory = firewall_inventory(lab, lab_inventory, code, flag)
    proc = subprocess.Popen(
        [sys.executable, "-m", "deployer", "up", str(inventory)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=os.environ | {"TFDEPLOY_STATE_DIR": str(tmp_path / "state"), "COLUMNS": "200"},
    )
    try:
        assert proc.stdout is not None
        seen = []
        for line in proc.stdout:
            seen.append(line)
            if "member reached ps: tf" in line:
                break
        out = "".join(seen)
        assert "member reached ps: tf" in out, out + (proc.stderr.read() if proc.stderr else "")
        assert re.search(r"firewall: TF ports accept only 10\.77\.\S+", out)
        # While the run is up: the outsider's SYN is dropped, a member (and the host) connect.
        assert connect_from(lab, outsider, ps.address, 2222) == "timeout"
        assert connect_from(lab, member, ps.address, 2222) == "open"
        assert connect_from(lab, ps, ps.address, 2222) == "open"
        assert connect_from(lab, outsider, ps.address, 22) != "timeout", "SSH must stay open"
        rules = tfdeploy_rules(lab, ps)
        assert "tfdeploy run fw-" in rules, rules
        assert tfdeploy_rules(lab, outsider) == ""
    finally:
        lab.run(member, ["touch", f"/tmp/{flag}"])
        rest, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, f"{rest}\n{err}"
    for host in (ps, member):
        assert tfdeploy_rules(lab, host) == "", f"rules left on {host.name}"


def test_detached_run_keeps_rules_until_down_removes_them(
    clean_lab: Lab, lab_inventory: Any, code: Path, tmp_path: Path
) -> None:
    lab = clean_lab
    ps, member, outsider = lab.hosts[0], lab.hosts[1], lab.hosts[2]
    flag = f"fw-never-{os.getpid()}"
    inventory = firewall_inventory(lab, lab_inventory, code, flag)
    state = tmp_path / "state"
    tfdeploy("up", "--detach", str(inventory), state=state, check_rc=0)
    try:
        assert "tfdeploy run fw-" in tfdeploy_rules(lab, ps)
        assert connect_from(lab, outsider, ps.address, 2222) == "timeout"
        assert connect_from(lab, member, ps.address, 2222) == "open"
    finally:
        tfdeploy("down", str(inventory), state=state, check_rc=0)
    for host in (ps, member):
        assert tfdeploy_rules(lab, host) == "", f"rules left on {host.name}"
    assert connect_from(lab, outsider, ps.address, 2222) == "refused"  # no rule, no listener


def test_failed_job_removes_its_rules(
    clean_lab: Lab, lab_inventory: Any, code: Path, tmp_path: Path
) -> None:
    lab = clean_lab
    inventory = firewall_inventory(
        lab, lab_inventory, code, "unused", command=f"{lab.python} -c 'raise SystemExit(3)'"
    )
    result = tfdeploy("up", str(inventory), state=tmp_path / "state", check_rc=1)
    assert "firewall: TF ports accept only" in result.stdout
    for host in lab.hosts[:2]:
        assert tfdeploy_rules(lab, host) == "", f"rules left on {host.name}"


@pytest.fixture
def agent(lab: Lab) -> Iterator[Agent]:
    agent = lab_agent(lab, lab.hosts[3])
    yield agent
    agent.transport.close()


@pytest.mark.parametrize("backend", ["nft", "iptables"])
def test_each_backend_filters_and_cleans_up(lab: Lab, agent: Agent, backend: str) -> None:
    host, member, outsider = lab.hosts[3], lab.hosts[4], lab.hosts[5]
    run_id = f"fwtest-{backend}-{os.getpid()}"
    listener = lab.run(
        host,
        'nohup /usr/bin/python3 -c \'import socket,time; s=socket.create_server(("",2299));'
        "[s.accept()[0].close() for _ in iter(int, 1)]' >/dev/null 2>&1 & echo $!",
    ).stdout.strip()
    try:
        reply = agent.call(
            "firewall",
            action="add",
            run_id=run_id,
            ports=[2299, 2300],
            allowed=[member.address, "::1"],
            backend=backend,
        )
        assert reply["backend"] == backend and reply["rules"], reply
        again = agent.call(  # a repeated add replaces the rules, never doubles them
            "firewall",
            action="add",
            run_id=run_id,
            ports=[2299, 2300],
            allowed=[member.address, "::1"],
            backend=backend,
        )
        assert len(again["rules"]) == len(reply["rules"])
        assert connect_from(lab, outsider, host.address, 2299) == "timeout"
        assert connect_from(lab, member, host.address, 2299) == "open"
        assert connect_from(lab, outsider, host.address, 22) == "open"
        assert run_id in tfdeploy_rules(lab, host)
    finally:
        removed = agent.firewall_remove(run_id)
        lab.run(host, ["kill", listener])
    assert removed >= 1
    assert tfdeploy_rules(lab, host) == ""
    assert agent.firewall_remove(run_id) == 0


def test_rules_accept_only_validated_input(agent: Agent) -> None:
    for run_id, ports, allowed in (
        ("../x", [1], ["10.0.0.1"]),
        ("ok", [0], ["10.0.0.1"]),
        ("ok", ["1; drop"], ["10.0.0.1"]),
        ("ok", [2299], ['10.0.0.1 } accept; {"']),
    ):
        with pytest.raises(HostError):
            agent.firewall_add(run_id, ports, allowed)  # type: ignore[arg-type]


def test_preflight_names_the_host_without_a_firewall_tool(
    clean_lab: Lab, lab_inventory: Any, code: Path, tmp_path: Path
) -> None:
    lab = clean_lab
    bare = lab.hosts[1]
    tools = ["nft", "iptables", "ip6tables"]
    # The host has its own mount namespace: hide the tools there only (not executable).
    for tool in tools:
        lab.run(bare, ["mount", "--bind", "/dev/null", f"/usr/sbin/{tool}"]).check_returncode()
    try:
        inventory = firewall_inventory(lab, lab_inventory, code, "unused")
        started = time.monotonic()
        result = tfdeploy("up", str(inventory), state=tmp_path / "state", check_rc=3)
        assert time.monotonic() - started < 60
    finally:
        for tool in tools:
            lab.run(bare, ["umount", f"/usr/sbin/{tool}"])
    err = " ".join(result.stderr.split())
    assert f"{bare.name}: firewall = true, but no firewall tool: nft or iptables not found" in err
    assert lab.hosts[0].name + ": firewall" not in err
    assert "security groups" in err
    assert "nothing was started" in err
