"""Bulk bytes on real hosts (issue #25): what a pull does when it is interrupted, when the file
changes under it and when the host's key is unknown; the bytes' speed is bench/dataplane.py's.
Under faults (issue #28): Ctrl-C during `up`'s artifacts pull, Ctrl-C while a host hashes, a
symlink loop and `/` on a real host.

Push and pull through a jump host with strict keys: tests/integration/test_results.py
(`test_pull_and_tunnel_through_a_bastion`); an unknown key refused before any push:
tests/integration/test_security.py; a 1 GB file with bounded memory: tests/unit/test_bulk_memory.py.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.lab import Lab
from tests.support.faults import Up
from tests.support.lab_cli import tfdeploy

pytestmark = [pytest.mark.lab]

MB = 1 << 20
# The task writes SIZE bytes of random data, says so, then keeps running (or rewrites the file
# in place forever with "churn", so a pull always sees it change).
WRITE = """\
import hashlib, os, sys, time
size = int(sys.argv[1])
data = os.urandom(size)
with open("big.bin", "wb") as f:
    f.write(data)
print("wrote", hashlib.sha256(data).hexdigest(), flush=True)
while True:
    if sys.argv[2] == "churn":
        with open("big.bin", "r+b") as f:
            f.write(os.urandom(4096))
    time.sleep(0.001 if sys.argv[2] == "churn" else 0.05)
"""


def _env(state: Path) -> dict[str, str]:
    return os.environ | {"TFDEPLOY_STATE_DIR": str(state)}


def sha(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(MB), b""):
            digest.update(chunk)
    return digest.hexdigest()


@pytest.fixture
def runs(tmp_path: Path) -> Iterator[list[str]]:
    """Run ids to stop after the test, whatever happened in it (before clean_lab looks)."""
    started: list[str] = []
    yield started
    for run_id in started:
        tfdeploy("down", run_id, state=tmp_path / "state")


def _detached(
    lab_inventory: Any, tmp_path: Path, size: int, mode: str, runs: list[str]
) -> tuple[Path, str, str]:
    code = tmp_path / "code"
    code.mkdir(exist_ok=True)
    (code / "write.py").write_text(WRITE)
    inventory = lab_inventory(
        [[{"role": "worker"}]],
        code=code,
        job={"name": "bulk", "command": f"python3 write.py {size} {mode}", "stop_grace": 1},
    )
    up = tfdeploy("up", "--detach", str(inventory), state=tmp_path / "state", check_rc=0)
    run_id = up.stdout.split("tfdeploy down ")[1].split()[0].strip("`")  # the next steps
    runs.append(run_id)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        logs = tfdeploy("logs", run_id, state=tmp_path / "state")
        if "wrote " in logs.stdout:
            digest = logs.stdout.split("wrote ")[1].split()[0]
            return inventory, run_id, digest
        time.sleep(0.5)
    raise AssertionError("the task never wrote its file")


@pytest.mark.isolated(reason="caps a host's bandwidth")
def test_a_pull_interrupted_mid_file_keeps_its_part_and_resumes(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path, runs: list[str]
) -> None:
    """Ctrl-C mid-transfer: exit 130 at once, the partial file is kept as `.part` (never taken
    for the content), nothing of the pull runs on the host; the next pull fetches the rest."""
    size = 96 * MB
    _, run_id, digest = _detached(lab_inventory, tmp_path, size, "keep", runs)
    host = clean_lab.hosts[0]
    home = tmp_path / "home"
    clean_lab.cap_bandwidth(host, "80mbit")  # ~10 MB/s: the pull takes ~10 s
    try:
        pull = subprocess.Popen(
            [sys.executable, "-m", "deployer", "pull", run_id, "big.bin", "--to", str(home)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=_env(tmp_path / "state"),
        )
        parts: list[Path] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any(p.stat().st_size > 8 * MB for p in parts):
            time.sleep(0.1)
            parts = list(home.rglob("*.part"))
        assert parts, "the pull never started writing"
        pull.send_signal(signal.SIGINT)
        began = time.monotonic()
        out, _ = pull.communicate(timeout=30)
        assert pull.returncode == 130, out
        assert time.monotonic() - began < 5, "Ctrl-C must stop a transfer at once"
    finally:
        clean_lab.uncap_bandwidth(host)
    assert "pull interrupted; what arrived is kept" in out, out
    [part] = home.rglob("*.part")
    kept = part.stat().st_size
    assert 0 < kept < size and not (home / run_id / "worker-0" / "big.bin").exists()
    assert part.stat().st_mode & 0o777 == 0o600  # private until it is whole (issue #28)
    time.sleep(1)
    agents = clean_lab.run(host, "pgrep -af '[a]gent.py serve' || true").stdout
    assert "serve" not in agents, f"a pull's agent is still running: {agents}"
    again = tfdeploy("pull", run_id, "big.bin", "--to", str(home), state=tmp_path / "state")
    assert again.returncode == 0, again.stdout + again.stderr
    sent = int(again.stdout.split("pulled 1 file into")[1].split(": ")[1].split(" bytes")[0])
    assert sent == size - kept  # only the rest travelled
    pulled = home / run_id / "worker-0" / "big.bin"
    assert hashlib.sha256(pulled.read_bytes()).hexdigest() == digest
    assert not list(home.rglob("*.part"))


@pytest.mark.isolated(reason="caps and cuts a host's link")
def test_a_link_cut_mid_pull_says_the_connection_was_lost(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path, runs: list[str]
) -> None:
    """The channel of a cut connection closes without an exit status (paramiko's -1): the user
    reads that the connection was lost, never that the agent failed with exit code -1."""
    size = 96 * MB
    _, run_id, _ = _detached(lab_inventory, tmp_path, size, "keep", runs)
    host = clean_lab.hosts[0]
    home = tmp_path / "home"
    clean_lab.cap_bandwidth(host, "80mbit")  # ~10 MB/s: the pull takes ~10 s
    try:
        pull = subprocess.Popen(
            [sys.executable, "-m", "deployer", "pull", run_id, "big.bin", "--to", str(home)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=_env(tmp_path / "state"),
        )
        parts: list[Path] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any(p.stat().st_size > 8 * MB for p in parts):
            time.sleep(0.1)
            parts = list(home.rglob("*.part"))
        assert parts, "the pull never started writing"
        clean_lab.cut_link(host)
        try:
            out, _ = pull.communicate(timeout=60)
        finally:
            clean_lab.restore_link(host)
    finally:
        clean_lab.uncap_bandwidth(host)
    said = " ".join(out.split())
    assert pull.returncode == 3, out
    assert f"{host.name}: connection lost while talking to the tfdeploy agent" in said, out
    assert "exit code -1" not in said and "agent failed" not in said, out


@pytest.mark.parametrize("folder", ["empty", "holding an earlier pull"])
def test_a_file_that_changes_while_pulled_is_named_and_not_kept(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path, runs: list[str], folder: str
) -> None:
    """Into an empty folder the host hashes as it sends and reports that the file did not
    stand still; into one holding the run, the bytes differ from the hash it listed."""
    _, run_id, _ = _detached(lab_inventory, tmp_path, 32 * MB, "churn", runs)
    home = tmp_path / "home"
    if folder != "empty":
        (home / run_id / "worker-0").mkdir(parents=True)
    pulled = tfdeploy("pull", run_id, "big.bin", "--to", str(home), state=tmp_path / "state")
    assert pulled.returncode == 4, pulled.stdout + pulled.stderr
    out = " ".join(pulled.stdout.split())
    assert "not pulled: worker:0@h1: big.bin: changed while it was pulled" in out, out
    assert not list(home.rglob("big.bin")) and not list(home.rglob("*.part"))


# A task still writing its log while its other files stand still: five files, then the log
# grows by 4 KiB every 5 ms (never still for as long as a pull takes to list and send it).
APPEND = """\
import time
for i in range(5):
    with open(f"out-{i}.bin", "wb") as f:
        f.write(bytes([i]) * (200_000 + i))
print("wrote", flush=True)
with open("train.log", "ab") as log:
    while True:
        log.write(b"step\\n" * 819)
        log.flush()
        time.sleep(0.005)
"""


def test_a_file_still_written_is_refused_alone_and_the_others_arrive(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path, runs: list[str]
) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "append.py").write_text(APPEND)
    job = {"name": "append", "command": "python3 append.py", "stop_grace": 1}
    inventory = lab_inventory([[{"role": "worker"}]], code=code, job=job)
    up = tfdeploy("up", "--detach", str(inventory), state=tmp_path / "state", check_rc=0)
    run_id = up.stdout.split("tfdeploy down ")[1].split()[0].strip("`")  # the next steps
    runs.append(run_id)
    deadline = time.monotonic() + 60
    while "wrote" not in tfdeploy("logs", run_id, state=tmp_path / "state").stdout:
        assert time.monotonic() < deadline, "the task never wrote its files"
        time.sleep(0.5)
    home = tmp_path / "home"
    pulled = tfdeploy("pull", run_id, "*", "--to", str(home), state=tmp_path / "state")
    assert pulled.returncode == 4, pulled.stdout + pulled.stderr
    out = " ".join(pulled.stdout.split())
    assert "not pulled: worker:0@h1: train.log: changed while it was pulled" in out, out
    assert "pulled 6 files into" in out, out  # append.py and the five, not the log
    folder = home / run_id / "worker-0"
    for i in range(5):
        assert (folder / f"out-{i}.bin").read_bytes() == bytes([i]) * (200_000 + i)
    assert not (folder / "train.log").exists() and not list(home.rglob("*.part"))


def test_a_pull_from_a_host_whose_key_is_unknown_is_refused(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path, runs: list[str]
) -> None:
    """Every path that carries bytes rides the same verified connection: a pull with a
    known_hosts that lacks the host's key reaches nothing and copies nothing."""
    inventory, run_id, _ = _detached(lab_inventory, tmp_path, MB, "keep", runs)
    known = tmp_path / "empty_known_hosts"
    known.write_text("")
    strict = Path(str(inventory).replace(".toml", "-strict.toml"))
    text = inventory.read_text()
    assert "known_hosts = " in text
    lines = [
        f'known_hosts = "{known}"' if line.startswith("known_hosts = ") else line
        for line in text.splitlines()
    ]
    strict.write_text("\n".join(lines) + "\n")
    home = tmp_path / "home"
    refused = tfdeploy(
        "pull", run_id, "-i", str(strict), "big.bin", "--to", str(home), state=tmp_path / "st2"
    )
    assert refused.returncode == 3, refused.stdout + refused.stderr
    assert "is not in" in refused.stderr and str(known) in " ".join(refused.stderr.split())
    assert not home.exists() or not list(home.rglob("*.bin*"))


OWN_NAMES = ("tfd-supervisor", "tfd-keeper", "tfd-warden")  # supervisor.py COMM, daemon.spawn


def _wait_gone(lab: Lab, host: Any, within: float) -> None:
    """The host's controller-serving agents are gone within `within` seconds (a loaded machine
    takes a moment to deliver the end of a closed connection), else the test fails naming them."""
    deadline = time.monotonic() + within
    while _agents(lab, host) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _agents(lab, host), f"a pull's agent is still running: {_agents(lab, host)}"


def _agents(lab: Lab, host: Any) -> list[str]:
    """The host's tfdeploy agents that serve a controller (a pull's sessions), not the run's
    supervisors, keeper and warden (forks of an agent: the same command line, their own name)."""
    return [
        p.cmdline
        for p in lab.processes(host)
        if ("agent.py" in p.cmdline or "agent.serve" in p.cmdline) and p.comm not in OWN_NAMES
    ]


def _started(lab_inventory: Any, tmp_path: Path, command: str, runs: list[str]) -> tuple[Path, str]:
    """A detached run of one worker on h1 running `command`, once its output says `ready`."""
    inventory = lab_inventory(
        [[{"role": "worker"}]],
        code=tmp_path,
        job={"name": "faults", "command": command, "stop_grace": 1},
    )
    up = tfdeploy("up", "--detach", str(inventory), state=tmp_path / "state", check_rc=0)
    run_id = up.stdout.split("tfdeploy down ")[1].split()[0].strip("`")  # the next steps
    runs.append(run_id)
    deadline = time.monotonic() + 60
    while "ready" not in tfdeploy("logs", run_id, state=tmp_path / "state").stdout:
        assert time.monotonic() < deadline, "the task never got ready"
        time.sleep(0.5)
    return inventory, run_id


@pytest.mark.isolated(reason="caps the hosts' bandwidth")
def test_ctrl_c_during_ups_artifacts_pull_keeps_what_arrived_and_the_next_pull_fetches_the_rest(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path
) -> None:
    """Issue #28, item 1: the pull is stopped, not started again beside itself (which deleted
    every .part and left the artifacts folder empty); `up` says which pull fetches the rest."""
    size = 64 * MB
    home = tmp_path / "home"
    inventory = lab_inventory(
        [[{"role": "worker"}], [{"role": "worker"}]],
        code=tmp_path,
        job={
            "name": "arts",
            "command": f"head -c {size} /dev/urandom > big.bin && sha256sum big.bin",
            "artifacts": ["big.bin"],
            "artifacts_to": str(home),
            "stop_grace": 1,
        },
    )
    hosts = clean_lab.hosts[:2]
    for host in hosts:
        clean_lab.cap_bandwidth(host, "80mbit")  # ~10 MB/s each: the pull takes ~7 s
    try:
        up = Up(inventory, state=tmp_path / "state")
        up.wait_for("job succeeded", timeout=120)
        deadline = time.monotonic() + 60
        parts: list[Path] = []
        while time.monotonic() < deadline and sum(p.stat().st_size for p in parts) < 16 * MB:
            time.sleep(0.1)
            parts = list(home.rglob("*.part"))
        up.proc.send_signal(signal.SIGINT)
        began = time.monotonic()
        assert up.finish(timeout=30) == 130, up.report()
        assert time.monotonic() - began < 5, "Ctrl-C must stop the pull at once"
    finally:
        for host in hosts:
            clean_lab.uncap_bandwidth(host)
    run_id = up.run_id()
    assert (
        "artifacts pull interrupted: what arrived is kept, and the same pull again fetches "
        f"only the rest: tfdeploy pull {run_id} big.bin --to {home}"
    ) in up.stdout, up.report()
    assert "artifacts were not pulled" not in up.stdout + up.stderr
    assert "stopping every task" not in up.stdout  # they had stopped before the pull
    kept = {p.name: p.stat().st_size for p in home.rglob("*.part")}
    assert kept and all(0 < n < size for n in kept.values()), kept
    for host in hosts:  # its connection closed at Ctrl-C: it ends on its own, not at its idle exit
        _wait_gone(clean_lab, host, within=10.0)
    again = tfdeploy("pull", run_id, "big.bin", "--to", str(home), state=tmp_path / "state")
    assert again.returncode == 0, again.stdout + again.stderr
    sent = int(again.stdout.split("pulled 2 files into")[1].split(": ")[1].split(" bytes")[0])
    assert sent == 2 * size - sum(kept.values())  # only the rest travelled
    digests = {line.split()[-2] for line in up.stdout.splitlines() if line.endswith(" big.bin")}
    pulled = {sha(p) for p in home.joinpath(run_id).glob("worker-*/big.bin")}
    assert len(digests) == 2 and pulled == digests
    assert not list(home.rglob("*.part"))


def test_ctrl_c_while_the_host_hashes_stops_its_agent(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path, runs: list[str]
) -> None:
    """Issue #28, item 9: a minute of hashing on the host (a 64 GB sparse file), Ctrl-C after
    2 s: the host's agent used to hash on for nobody until it was done. The host hashes before
    it sends when the folder already holds something of the run (here: an earlier pull's)."""
    _, run_id = _started(
        lab_inventory, tmp_path, "truncate -s 64G huge.bin && echo ready && sleep 600", runs
    )
    (tmp_path / run_id / "worker-0").mkdir(parents=True)
    host = clean_lab.hosts[0]
    pull = subprocess.Popen(
        [sys.executable, "-m", "deployer", "pull", run_id, "huge.bin", "--to", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=_env(tmp_path / "state"),
    )
    try:
        deadline = time.monotonic() + 30
        while not _agents(clean_lab, host):
            assert time.monotonic() < deadline, "the pull never reached the host"
            time.sleep(0.1)
        time.sleep(2)  # hashing
        assert pull.poll() is None, pull.communicate()[0]
        pull.send_signal(signal.SIGINT)
        out, _ = pull.communicate(timeout=30)
        assert pull.returncode == 130, out
    finally:
        if pull.poll() is None:  # left running, it would write 64 GB of zeros here
            pull.kill()
            pull.wait()
    deadline = time.monotonic() + 5
    while _agents(clean_lab, host):
        assert time.monotonic() < deadline, f"the host still hashes: {_agents(clean_lab, host)}"
        time.sleep(0.1)


def test_a_symlink_loop_and_the_whole_file_system_are_refused_at_once(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path, runs: list[str]
) -> None:
    """Issue #28, item 9: `loop/a -> .`, `loop/b -> .`: `pull RUN 'loop/**'` ran the host's
    agent at 100% CPU with memory growing; `/` walked the disk for 600 s."""
    loop = "mkdir loop && echo once > loop/f && ln -s . loop/a && ln -s . loop/b"
    _, run_id = _started(lab_inventory, tmp_path, f"{loop} && echo ready && sleep 600", runs)
    home = tmp_path / "home"
    began = time.monotonic()
    looped = tfdeploy(
        "pull", run_id, "loop/**", "--to", str(home), state=tmp_path / "state", timeout=60
    )
    assert looped.returncode == 0, looped.stdout + looped.stderr
    assert "pulled 1 file into" in looped.stdout
    for name in ("a", "b"):
        assert f"not pulled: worker:0@h1: loop/{name}: a symlink to a folder, not followed" in (
            looped.stdout
        )
    assert [p.name for p in home.rglob("*") if p.is_file()] == ["f"]
    whole = tfdeploy("pull", run_id, "/", "--to", str(home), state=tmp_path / "state", timeout=60)
    assert whole.returncode == 5, whole.stdout + whole.stderr  # nothing was pulled
    assert "not pulled: worker:0@h1: /: names the host's whole file system" in whole.stdout
    assert "error: no file matched / on worker:0@h1; nothing was pulled" in whole.stderr
    assert time.monotonic() - began < 30
