"""A run's reach on a lab host over SSH: the two-controller port reservation race, and a stop
that ends a process which left its task's group (in-process: tests/unit/test_agent_bounds.py).
"""

from __future__ import annotations

import os
import secrets
import threading
from typing import Any

import pytest

from deployer.hosts.agent import Agent
from tests.support.agent import ESCAPE, wait_for

pytestmark = pytest.mark.timeout(60)


def test_two_controllers_racing_on_one_lab_host_get_the_ports_once(lab: Any) -> None:
    from tests.support.on_lab import lab_agent  # an Agent over SSH to a lab host

    port = 23000 + secrets.randbelow(2000)
    agents = [lab_agent(lab, lab.hosts[2]) for _ in range(2)]
    barrier = threading.Barrier(2)
    replies: dict[str, dict[str, Any]] = {}

    def hello(agent: Agent, run_id: str) -> None:
        barrier.wait()
        replies[run_id] = agent.install([port], run_id=run_id, lease_seconds=30)

    try:
        threads = [
            threading.Thread(target=hello, args=(a, f"race-{n}-{os.getpid()}"))
            for n, a in enumerate(agents)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        busy = {r: reply["busy_ports"] for r, reply in replies.items()}
        winners = [r for r, b in busy.items() if not b]
        assert len(replies) == 2 and len(winners) == 1, busy
        [loser] = set(replies) - set(winners)
        assert replies[loser]["reserved_by"] == {str(port): winners[0]}
        agents[0].stop(winners[0], grace=0)  # any controller's stop releases the run's ports
        assert agents[1].install([port], run_id=loser, lease_seconds=30)["busy_ports"] == []
    finally:
        for r in replies:
            agents[0].release(r)
        for a in agents:
            a.close_session()
            a.transport.close()


def test_a_stop_over_ssh_ends_a_setsid_sidecar_on_a_lab_host(lab: Any, run_id: str) -> None:
    from tests.support.on_lab import lab_agent

    host = lab.hosts[2]
    agent = lab_agent(lab, host)
    try:
        agent.call("materialize", run_id=run_id, job="j", files=[], lease_seconds=None)
        env = {"TFDEPLOY_RUN_ID": run_id}
        agent.start(run_id, [{"name": "worker:0", "command": ESCAPE, "env": env}], grace=1)
        pid_file = f"{agent.home}/hosts/*/runs/{run_id}/code/escaped.pid"
        read = ["sh", "-c", f"cat {pid_file}"]
        stray = int(wait_for(lambda: lab.run(host, read).stdout.strip(), timeout=10))
        # `$!` is known once the shell forked, before setsid left the group and exec'd sleep: a
        # stop in between would end it with the group, as no escape at all.
        cmdline = ["sh", "-c", f"tr '\\0' ' ' < /proc/{stray}/cmdline"]
        wait_for(lambda: lab.run(host, cmdline).stdout.strip() == "sleep 600", timeout=10)
        report = agent.stop(run_id, grace=1)
        assert [(e.pid, e.cmd) for e in report.escaped] == [(stray, "sleep 600")]
        # Gone, or a zombie its reaper has not collected yet: on loopback that is this machine's
        # PID 1, which may take seconds; `kill -0` succeeds on a zombie, so read its state.
        stat = lab.run(host, ["cat", f"/proc/{stray}/stat"])
        assert stat.returncode != 0 or stat.stdout.rsplit(")", 1)[1].split()[0] == "Z", stat.stdout
    finally:
        agent.stop(run_id, grace=0)
        agent.close_session()
        agent.transport.close()
