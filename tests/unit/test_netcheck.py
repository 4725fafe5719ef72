"""Preflight's network check: which connections TF makes, how a blocked one is told, and the
host side's stand-in listeners and probes on this machine (no sshd, no TensorFlow).

The lab's own tests (tests/integration/test_netcheck.py) drop and reject real packets between hosts.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from deployer.config.model import NetcheckMode
from deployer.core.errors import HostsFailed, NetworkBlocked
from deployer.hosts.agent import Agent
from deployer.hosts.local_transport import LocalTransport
from deployer.up.netcheck import blocked
from deployer.up.netplan import Link, links
from remote import protocol
from tests.support.harness import Harness
from tests.support.helpers import JOB, free_port, plan


def hosts(*specs: tuple[str, str]) -> str:
    """Hosts a, b, c... with the given task lists, e.g. ('a', '{ role = "chief" }')."""
    text = JOB
    for i, (name, tasks) in enumerate(specs):
        text += f'\n[[hosts]]\nname = "{name}"\naddress = "10.0.0.{i + 1}"\ntasks = [{tasks}]\n'
    return text


W = '{ role = "worker" }'


def test_mwms_connects_every_worker_with_every_other(tmp_path: Path) -> None:
    p = plan(tmp_path, hosts(("a", '{ role = "chief" }'), ("b", W), ("c", f"{W}, {W}")))
    pairs = {(x.source, x.dest, x.port) for x in links(p)}
    assert ("a", "b", 2222) in pairs and ("b", "a", 2222) in pairs
    assert ("c", "c", 2223) in pairs and ("c", "c", 2222) in pairs  # two workers on one host
    assert ("a", "c", 2222) in pairs and ("a", "c", 2223) in pairs
    assert len(pairs) == 10  # a and b reach 3 servers each; c's two workers reach all 4


def test_pss_connects_to_the_ps_and_the_chief_to_workers_only(tmp_path: Path) -> None:
    p = plan(
        tmp_path,
        hosts(
            ("a", '{ role = "chief" }'),
            ("b", W),
            ("c", W),
            ("d", '{ role = "ps" }'),
            ("e", '{ role = "evaluator" }'),
        ),
    )
    pairs = {(x.source, x.dest) for x in links(p)}
    assert pairs == {("a", "d"), ("b", "d"), ("c", "d"), ("a", "b"), ("a", "c")}


def test_one_task_makes_no_connection(tmp_path: Path) -> None:
    assert links(plan(tmp_path, hosts(("a", W)))) == []


def test_a_blocked_report_groups_sources_and_names_the_ports() -> None:
    dropped = [(Link(s, "gpu2", "10.0.0.12", 2222), "timed out") for s in ("gpu1", "gpu3", "gpu4")]
    refused = [(Link("gpu2", "gpu1", "10.0.0.11", 2223), "refused")]
    error = blocked(dropped + refused, 12)
    assert error.exit_status == 3
    lines = error.message.splitlines()
    assert lines[0].startswith("the network check failed: 4 TF connections of 12 cannot")
    assert (
        "  gpu1, gpu3 and gpu4 -> gpu2 (10.0.0.12:2222): timed out "
        "(a firewall or security group dropping the TF port?)" in lines
    )
    assert any(x.startswith("  gpu2 -> gpu1 (10.0.0.11:2223): refused (") for x in lines)
    assert "allow TCP ports 2222, 2223 between the cluster's hosts" in (error.hint or "")
    many = blocked([(Link(f"h{i}", "x", "fd00::1", 2222), "no route") for i in range(9)], 9)
    assert "  h0 and 8 more -> x ([fd00::1]:2222): no route (" in many.message
    sampled = blocked(dropped, 2304, sampled=True)
    assert "3 TF connections of 2,304 tried (a sample: others may fail too) cannot" in (
        sampled.message
    )
    assert (sampled.hint or "").endswith("`--netcheck full` tries every connection")


def test_an_unresolved_name_gets_a_dns_hint_not_a_firewall_one() -> None:
    said = f"{protocol.PROBE_UNRESOLVED}: Name or service not known"
    error = blocked([(Link(s, "gpu2", "gpu2", 2222), said) for s in ("gpu1", "gpu3")], 6)
    assert (
        "  gpu1 and gpu3 -> gpu2 (gpu2:2222): unresolved: Name or service not known (the source "
        "host cannot resolve this name: is it in DNS, or only this machine's ssh_config or "
        "/etc/hosts?)" in error.message.splitlines()
    )
    hint = error.hint or ""
    assert hint.startswith("set tf_address to an IP address or a name every host resolves")
    assert "firewall" not in hint and "allow TCP" not in hint
    # Mixed with a dropped port, both causes are named.
    both = blocked([(Link("gpu1", "gpu2", "gpu2", 2222), said), *_dropped()], 6)
    assert "set tf_address to an IP address" in (both.hint or "")
    assert "allow TCP port 2223 between the cluster's hosts" in (both.hint or "")


def _dropped() -> list[tuple[Link, str]]:
    return [(Link("gpu2", "gpu1", "10.0.0.11", 2223), protocol.PROBE_TIMED_OUT)]


def test_a_sample_finds_a_dropped_pair_it_holds_and_says_it_sampled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = hosts(*[(f"h{i}", W) for i in range(1, 11)]).replace(
        "[job]\n", '[job]\nnetcheck = "sampled"\n', 1
    )
    h = Harness(tmp_path, text, monkeypatch)
    h.hosts["h3"].verdicts[("10.0.0.4", 2222)] = "timed out"  # h3 -> h4, the next host: sampled
    with pytest.raises(NetworkBlocked) as info:
        h.run(finish_all(h))
    assert "  h3 -> h4 (10.0.0.4:2222): timed out" in info.value.message
    assert "of 80 tried (a sample: others may fail too)" in info.value.message
    probes = [r for r in h.hosts["h3"].ops("netcheck") if r["action"] == "probe"]
    assert len(probes[0]["targets"]) == 8 and probes[0]["targets"][0] == ["10.0.0.4", 2222]


def finish_all(h: Harness) -> Callable[[float], None]:
    """A script ending every running task at the first sleep: the job succeeds."""

    def script(now: float) -> None:
        for host in h.hosts.hosts.values():
            for name, task in host.tasks.items():
                if task.state == "running":
                    host.exit(name)

    return script


def test_a_dropped_pair_fails_preflight_and_nothing_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = Harness(tmp_path, hosts(("a", W), ("b", W), ("c", W)), monkeypatch)
    h.hosts["a"].verdicts[("10.0.0.2", 2222)] = "timed out"
    with pytest.raises(NetworkBlocked) as info:
        h.run(finish_all(h))
    assert "  a -> b (10.0.0.2:2222): timed out (a firewall" in info.value.message
    assert "1 TF connection of 6" in info.value.message
    for host in h.hosts.hosts.values():
        assert host.ops("netcheck") and not host.ops("start") and not host.ops("have")
        assert host.stand_ins == set() and host.reserved == {}  # listeners closed, ports let go
    probes = [r for r in h.hosts["a"].ops("netcheck") if r["action"] == "probe"]
    assert sorted(map(tuple, probes[0]["targets"])) == [("10.0.0.2", 2222), ("10.0.0.3", 2222)]


def test_a_healthy_cluster_says_how_many_connections_were_tried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = Harness(tmp_path, hosts(("a", W), ("b", W)), monkeypatch)
    assert h.run(finish_all(h)) == 0
    assert any(
        "; network check: 2 TF connections between 2 hosts tried (all)" in s for s in h.view.steps
    )
    # The stand-ins start with the hello and go with the push's first request: one round.
    b = h.hosts["b"]
    assert b.ops("hello")[0]["listen"]["ports"] == [2222]
    assert [r["action"] for r in b.ops("netcheck")] == ["probe"]
    assert b.ops("materialize") and not b.stand_ins


def test_check_probes_then_releases_which_stops_the_stand_ins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`check`: hello (listening), probe, release: no close round of its own."""
    h = Harness(tmp_path, hosts(("a", W), ("b", W)), monkeypatch)
    assert h.check() == 0
    b = h.hosts["b"]
    assert [r["action"] for r in b.ops("netcheck")] == ["probe"]
    assert b.ops("release") and not b.stand_ins and b.reserved == {}


def test_a_hello_that_found_a_port_busy_starts_no_stand_in_and_release_stops_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = Harness(tmp_path, hosts(("a", W), ("b", W)), monkeypatch)
    h.hosts["b"].facts["busy_ports"] = [2222]
    with pytest.raises(HostsFailed, match=r"b: TF port\(s\) 2222 already in use"):
        h.run(finish_all(h))
    a, b = h.hosts["a"], h.hosts["b"]
    assert not b.stand_ins and not b.ops("netcheck") and b.ops("hello")[0]["listen"]
    assert a.ops("release") and not a.stand_ins  # a's stand-ins went with its release


@pytest.mark.parametrize("how", ["flag", "inventory"])
def test_the_check_can_be_skipped(
    how: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = hosts(("a", W), ("b", W))
    if how == "inventory":
        text = text.replace("[job]\n", "[job]\nnetcheck = false\n", 1)
    h = Harness(tmp_path, text, monkeypatch)
    h.hosts["a"].verdicts[("10.0.0.2", 2222)] = "timed out"
    assert h.run(finish_all(h), **({"netcheck": NetcheckMode.OFF} if how == "flag" else {})) == 0
    assert not h.hosts["a"].ops("netcheck")


# ---- the host side, on this machine -------------------------------------------------------------


def bindable(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def test_stand_ins_answer_probes_and_leave_nothing(tmp_path: Path) -> None:
    agent = Agent(LocalTransport("here"), python=sys.executable, workdir=str(tmp_path / "wd"))
    agent.install()
    port, closed = free_port(), free_port()
    agent.listen("r1", [port], 30)
    record = next((tmp_path / "wd" / "hosts").glob("*/netcheck/r1.json"))
    pid = int(record.read_text().split('"pid": ')[1].split(",")[0])
    assert os.path.exists(f"/proc/{pid}") and not bindable(port)
    verdicts = agent.probe("r1", [("127.0.0.1", port), ("127.0.0.1", closed)], 2.0)
    assert verdicts == ["ok", "refused"]
    agent.unlisten("r1")
    assert bindable(port) and not record.exists()  # the TF server can bind it right away
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.02)
    assert not _alive(pid)


def test_a_stand_in_stops_at_once_on_sigterm_whatever_its_deadline(tmp_path: Path) -> None:
    """The request that ends the check (the push's first, a release) waits until the ports are
    free: SIGTERM must end the stand-in's wait, not its deadline nor daemon.stop's SIGKILL."""
    agent = Agent(LocalTransport("here"), python=sys.executable, workdir=str(tmp_path / "wd"))
    agent.install()
    port = free_port()
    agent.listen("r5", [port], 60)
    began = time.monotonic()
    agent.unlisten("r5")
    assert time.monotonic() - began < 1.0  # daemon.stop sends SIGKILL only after 2 s
    assert bindable(port)


def test_a_queue_longer_than_the_pool_is_slower_never_falsely_blocked(tmp_path: Path) -> None:
    """Dropped SYNs (a listener whose accept queue is full) fill the pool for two rounds; the
    open port queued behind them is still `ok`, and the op takes its budget, not one timeout."""
    agent = Agent(LocalTransport("here"), python=sys.executable, workdir=str(tmp_path / "wd"))
    agent.install()
    with socket.socket() as full, socket.socket() as filler, socket.socket() as open_:
        full.bind(("127.0.0.1", 0))
        full.listen(0)
        filler.connect(full.getsockname())  # the queue's one place: every later SYN is dropped
        open_.bind(("127.0.0.1", 0))
        open_.listen(8)
        dropped = [("127.0.0.1", full.getsockname()[1])] * (2 * protocol.PROBE_WORKERS)
        targets = [*dropped, ("127.0.0.1", open_.getsockname()[1])]
        wait = 0.3
        began = time.monotonic()
        verdicts = agent.probe("r4", targets, wait)
        took = time.monotonic() - began
    assert verdicts == ["timed out"] * len(dropped) + ["ok"]
    # two rounds of the pool, twice (the retry): a thread per target would take 2 * wait
    assert 4 * wait <= took < protocol.probe_budget(len(targets), wait) + 1.0


def test_a_listener_leaves_by_itself_at_its_deadline(tmp_path: Path) -> None:
    """A controller that dies mid-check never sends `close`: the port is free soon anyway."""
    agent = Agent(LocalTransport("here"), python=sys.executable, workdir=str(tmp_path / "wd"))
    agent.install()
    port = free_port()
    agent.listen("r2", [port], 1)
    assert not bindable(port)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not bindable(port):
        time.sleep(0.05)
    assert bindable(port)


def test_a_port_that_cannot_be_bound_is_the_listen_answer(tmp_path: Path) -> None:
    agent = Agent(LocalTransport("here"), python=sys.executable, workdir=str(tmp_path / "wd"))
    agent.install()
    with socket.socket() as busy:
        busy.bind(("0.0.0.0", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(Exception, match=f"cannot listen on TF port {port}"):
            agent.listen("r3", [port], 30)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")
