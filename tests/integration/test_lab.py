"""The lab itself: real sshd hosts, isolated from each other, and every fault has its effect."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import paramiko
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.lab import VENV_PYTHON, Lab, LabError, LabHost, cleanup, start_lab
from tests.lab import containers as lab_containers
from tests.lab.inventory import toml_value

pytestmark = pytest.mark.lab
REPO = Path(__file__).resolve().parents[2]


def ssh(
    lab: Lab,
    host: LabHost | str,
    command: str,
    *opts: str,
    timeout: float = 20,
    stdin: bytes | None = None,
) -> subprocess.CompletedProcess[bytes]:
    """Plain OpenSSH with only the lab's config, key and strict known_hosts."""
    argv = ["ssh", "-F", str(lab.ssh_config), *opts, lab.host(host).name, command]
    return subprocess.run(argv, capture_output=True, timeout=timeout, input=stdin)


def tcp_probe(host: LabHost, timeout: float = 1.0) -> str:
    try:
        with socket.create_connection((host.address, host.port), timeout=timeout):
            return "ok"
    except ConnectionRefusedError:
        return "refused"
    except TimeoutError:
        return "timeout"
    except OSError as e:
        return f"error {e.errno}"


def paramiko_client(lab: Lab, known_hosts: Path | None = None) -> paramiko.SSHClient:
    client = paramiko.SSHClient()
    client.load_host_keys(str(known_hosts or lab.known_hosts))
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    return client


def connect(lab: Lab, client: paramiko.SSHClient, host: LabHost, **kw: object) -> None:
    client.connect(
        host.address,
        host.port,
        username=lab.user,
        key_filename=str(lab.key_path),
        look_for_keys=False,
        allow_agent=False,
        timeout=5,
        **kw,
    )  # type: ignore[arg-type]


def start_sleeper(lab: Lab, host: LabHost, seconds: int) -> int:
    """Start `sleep` detached inside the host (via SSH, as the deployer would); returns its pid."""
    done = ssh(lab, host, f"setsid sleep {seconds} >/dev/null 2>&1 </dev/null & echo $!")
    assert done.returncode == 0, done.stderr
    pid = int(done.stdout)
    # $! is printed before setsid has exec'd sleep: wait for the process to be what we asked for.
    deadline = time.monotonic() + 5
    while not any(p.pid == pid and p.cmdline == f"sleep {seconds}" for p in lab.processes(host)):
        assert time.monotonic() < deadline, lab.processes(host)
        time.sleep(0.02)
    return pid


# -- SSH works, with strict host keys, in every mode -------------------------------------------


def test_every_host_answers_plain_ssh_with_strict_host_keys(lab: Lab) -> None:
    assert len(lab.hosts) == 8
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda h: ssh(lab, h, "hostname"), lab.hosts))
    for host, done in zip(lab.hosts, results, strict=True):
        assert done.returncode == 0, (host, done.stderr)
        assert done.stdout.decode().strip() == host.hostname


def test_paramiko_with_reject_policy_accepts_lab_keys_and_rejects_unknown(
    lab: Lab, tmp_path: Path
) -> None:
    host = lab.hosts[1]
    client = paramiko_client(lab)
    connect(lab, client, host)
    _, out, _ = client.exec_command("echo $HOME")
    assert out.read().decode().strip() == ("/root" if lab.isolated else os.path.expanduser("~"))
    client.close()
    # Same host, empty known_hosts: the strict client must refuse it.
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    stranger = paramiko_client(lab, empty)
    with pytest.raises(paramiko.SSHException, match="not found in known_hosts"):
        connect(lab, stranger, host)


def test_lab_python_runs_on_the_hosts(lab: Lab) -> None:
    done = ssh(lab, lab.hosts[0], f"{lab.python} -c 'import sys; print(sys.version_info[:2])'")
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode().strip() == "(3, 11)"


def test_ssh_config_and_files_live_in_the_lab_directory(lab: Lab) -> None:
    for path in (lab.key_path, lab.known_hosts, lab.ssh_config):
        assert path.parent == lab.dir and path.is_file()
    assert not str(lab.dir).startswith(("/tmp", "/root"))  # hosts have their own /tmp and /root
    config = lab.ssh_config.read_text()
    assert all(f"Host {h.name}\n" in config for h in lab.hosts)
    assert "StrictHostKeyChecking yes" in config and "~/.ssh" not in config


# -- inventories --------------------------------------------------------------------------------


def test_inventory_round_trips_through_tomllib(lab: Lab, lab_inventory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    tricky = 'job "x"\\ \n\t\u00e9\x01'
    path = lab_inventory(
        [[{"role": "worker"}], [{"role": "worker", "count": 2}, {"role": "ps"}]],
        job={"name": tricky, "env": {"K": "v", "A B": "1"}},
        ssh={"connect_timeout": 2.5},
    )
    data = tomllib.loads(path.read_text())
    assert data["job"]["name"] == tricky
    assert data["job"]["code"] == str(tmp_path)
    assert data["job"]["python"] == lab.python and data["job"]["port"] == 2222
    assert data["job"]["env"] == {"K": "v", "A B": "1"}
    assert data["ssh"] == {
        "user": lab.user,
        "identity": str(lab.key_path),
        "known_hosts": str(lab.known_hosts),
        "host_keys": "strict",
        "connect_timeout": 2.5,
    }
    assert [h["name"] for h in data["hosts"]] == ["h1", "h2"]
    # A loopback host has TF ports of its own on the machine's one network stack (tf_port).
    own_port = {} if lab.isolated else {"port": lab.tf_port(lab.hosts[1])}
    assert data["hosts"][1] == {
        "name": "h2",
        "address": lab.hosts[1].address,
        "ssh": {"port": lab.hosts[1].port},
        **own_port,
        "tasks": [{"role": "worker", "count": 2}, {"role": "ps"}],
    }
    with pytest.raises(LabError, match="code"):
        lab.write_inventory(tmp_path / "x.toml", tasks=[[{"role": "worker"}]])


@given(st.text())
def test_toml_strings_round_trip(value: str) -> None:
    assert tomllib.loads(f"k = {toml_value(value)}")["k"] == value


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
        max_leaves=8,
    ).filter(lambda v: v is not None)
)
def test_toml_values_round_trip(value: object) -> None:
    def strip_none(v: object) -> object:
        if isinstance(v, dict):
            return {k: strip_none(x) for k, x in v.items() if x is not None}
        if isinstance(v, list):
            return [strip_none(x) for x in v if x is not None]
        return v

    value = strip_none(value)
    assert tomllib.loads(f"k = {toml_value(value)}")["k"] == value


# -- isolation ------------------------------------------------------------------------------------


@pytest.mark.isolated
def test_files_in_tmp_and_root_are_private_to_a_host(lab: Lab) -> None:
    h1, h2 = lab.hosts[0], lab.hosts[1]
    name = f"isolation-{os.getpid()}"
    done = ssh(lab, h1, f"echo a > /tmp/{name} && echo b > /root/{name}")
    assert done.returncode == 0, done.stderr
    assert lab.run(h1, f"cat /tmp/{name} /root/{name}").stdout == "a\nb\n"
    assert lab.run(h2, f"ls /tmp/{name} /root/{name}").returncode != 0
    assert ssh(lab, h2, f"test -e /tmp/{name} || test -e /root/{name}").returncode == 1
    assert not Path("/tmp", name).exists() and not Path("/root", name).exists()
    lab.run(h1, f"rm /tmp/{name} /root/{name}")


@pytest.mark.isolated
def test_processes_are_private_to_a_host(lab: Lab) -> None:
    h1, h2 = lab.hosts[0], lab.hosts[1]
    pid = start_sleeper(lab, h1, 3131)
    try:
        mine = [p for p in lab.processes(h1) if p.cmdline == "sleep 3131"]
        assert [p.pid for p in mine] == [pid] and mine[0].pgid == pid  # setsid: own group
        assert not [p for p in lab.processes(h2) if "3131" in p.cmdline]
        assert "sleep 3131" not in lab.run(h2, ["ps", "-eo", "args"]).stdout
        assert "sleep 3131" in lab.run(h1, ["ps", "-eo", "args"]).stdout
        assert any("sleep 3131" in item for item in lab.leftovers(h1, settle=0))
        # All hosts in one pass (the check after every lab test): h1 alone, with the same items.
        left = lab.leftovers_of(lab.hosts, settle=0)
        assert list(left) == [h1.name] and left[h1.name] == lab.leftovers(h1, settle=0), left
        # Each host is its own PID space: its init is pid 1 there.
        assert lab.processes(h2)[0].pid == 1
    finally:
        lab.run(h1, ["kill", "-KILL", str(pid)])
    assert lab.leftovers(h1) == []


@pytest.mark.isolated
def test_hostnames_differ_and_match(lab: Lab) -> None:
    names = {lab.run(h, ["hostname"]).stdout.strip() for h in lab.hosts}
    assert names == {h.hostname for h in lab.hosts} and len(names) == 8
    assert socket.gethostname() not in names


@pytest.mark.isolated
def test_leftovers_reports_a_listening_port_until_it_closes(clean_lab: Lab) -> None:
    lab = clean_lab
    h = lab.hosts[7]
    cmd = (
        f"setsid {lab.python} -m http.server 8765 --bind 0.0.0.0 "
        ">/dev/null 2>&1 </dev/null & echo $!"
    )
    pid = int(ssh(lab, h, cmd).stdout)
    deadline = time.monotonic() + 10
    while 8765 not in lab.listening_ports(h) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert 8765 in lab.listening_ports(h)
    assert 8765 not in lab.listening_ports(lab.hosts[6])
    assert "listening port 8765" in lab.leftovers(h, settle=0)
    left = lab.leftovers_of(lab.hosts, settle=0)
    assert list(left) == [h.name] and "listening port 8765" in left[h.name], left
    lab.run(h, ["kill", "-TERM", str(pid)])
    assert lab.leftovers(h) == []
    assert lab.leftovers_of(lab.hosts) == {}


# -- faults ---------------------------------------------------------------------------------------


@pytest.mark.isolated
def test_cut_link_makes_connects_time_out_and_restore_heals(lab: Lab) -> None:
    h = lab.hosts[2]
    assert tcp_probe(h) == "ok"
    lab.cut_link(h)
    try:
        t = time.monotonic()
        assert tcp_probe(h, timeout=1.0) == "timeout"
        assert time.monotonic() - t >= 0.9
        assert tcp_probe(lab.hosts[3]) == "ok"  # only that host is cut off
    finally:
        lab.restore_link(h)
    assert tcp_probe(h) == "ok"
    assert ssh(lab, h, "true").returncode == 0


@pytest.mark.isolated
def test_kill_sshd_refuses_new_connections_but_keeps_sessions(lab: Lab) -> None:
    h = lab.hosts[3]
    client = paramiko_client(lab)
    connect(lab, client, h)
    lab.kill_sshd(h)
    try:
        t = time.monotonic()
        assert tcp_probe(h, timeout=3) == "refused"
        assert time.monotonic() - t < 0.5
        _, out, _ = client.exec_command("echo still")  # the open session lives on
        assert out.read() == b"still\n"
    finally:
        client.close()
        lab.start_sshd(h)
    assert ssh(lab, h, "true").returncode == 0
    assert lab.leftovers(h) == []


@pytest.mark.isolated
def test_crash_host_kills_everything_and_revive_brings_a_fresh_host(lab: Lab) -> None:
    h = lab.hosts[4]
    start_sleeper(lab, h, 3232)
    lab.run(h, "echo x > /tmp/before-crash")
    lab.crash_host(h)
    try:
        assert lab.processes(h) == []
        assert lab.listening_ports(h) == set()
        everywhere = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True)
        assert "sleep 3232" not in everywhere.stdout  # not hidden: gone from the machine
        assert tcp_probe(h) == "refused"
        with pytest.raises(LabError, match="down"):
            lab.run(h, ["true"])
    finally:
        lab.revive_host(h)
    assert ssh(lab, h, "hostname").stdout.decode().strip() == h.hostname  # same host key
    assert lab.run(h, "ls -A /tmp").stdout == ""  # a fresh /tmp
    assert lab.leftovers(h) == []


@pytest.mark.isolated
def test_freeze_stops_a_process_and_thaw_resumes_it(lab: Lab) -> None:
    h = lab.hosts[5]
    pid = start_sleeper(lab, h, 3333)
    try:

        def state() -> str:
            return lab.run(h, ["cat", f"/proc/{pid}/stat"]).stdout.split(") ")[1][0]

        lab.freeze(h, pid)
        assert state() == "T"
        assert [p.state for p in lab.processes(h) if p.pid == pid] == ["T"]
        lab.thaw(h, pid)
        assert state() in ("R", "S")  # resumed: running still, or back in its sleep
    finally:
        lab.run(h, ["kill", "-KILL", str(pid)])


def test_latency_adds_the_delay_each_way(lab: Lab) -> None:
    h = lab.hosts[6]
    with lab.latency(h, 150) as (address, port):
        t = time.monotonic()
        with socket.create_connection((address, port), timeout=5) as s:
            banner = s.recv(100)
            first = time.monotonic() - t
            s.sendall(b"SSH-2.0-labprobe\r\n" + b"\0" * 64)  # garbage KEX: sshd answers and closes
            while s.recv(4096):
                pass
            total = time.monotonic() - t
        assert banner.startswith(b"SSH-2.0-OpenSSH")
        assert first >= 0.15  # server -> client delayed
        assert total >= 0.45  # plus a full round trip (0.3 s) for the reply to our bytes
        opts = ["-o", f"HostName={address}", "-o", f"Port={port}", "-o", f"HostKeyAlias={h.name}"]
        t = time.monotonic()
        assert ssh(lab, h, "true", *opts).returncode == 0
        slow = time.monotonic() - t
    t = time.monotonic()
    assert ssh(lab, h, "true").returncode == 0
    fast = time.monotonic() - t
    assert slow - fast >= 0.6  # an SSH login takes several round trips of 0.3 s


@pytest.mark.isolated
def test_cap_bandwidth_slows_a_transfer(lab: Lab) -> None:
    h = lab.hosts[6]
    data = os.urandom(384 * 1024)

    def upload() -> float:
        t = time.monotonic()
        done = ssh(lab, h, "cat > /dev/null", stdin=data)
        assert done.returncode == 0, done.stderr
        return time.monotonic() - t

    def qdisc() -> str:
        return lab.run(h, ["tc", "qdisc", "show", "dev", "eth0"]).stdout

    lab.cap_bandwidth(h, "2mbit")  # 250 kB/s: 384 kB less the 32 kB burst take >= 1.4 s
    try:
        assert "tbf" in qdisc() and "rate 2Mbit" in qdisc(), qdisc()
        slow = upload()
    finally:
        lab.uncap_bandwidth(h)
    # A lower bound only: the cap makes the transfer at least this slow however loaded the
    # machine is; "how much faster uncapped" is a timing claim, which belongs in bench/.
    assert slow >= 1.0, slow
    assert "tbf" not in qdisc(), qdisc()
    upload()  # the host still takes data once uncapped


# -- bastion topology ------------------------------------------------------------------------------


@pytest.mark.isolated
def test_private_hosts_are_reachable_only_through_the_bastion(
    bastion_lab: Lab, tmp_path: Path
) -> None:
    lab = bastion_lab
    text = lab.ssh_config.read_text()
    common = tmp_path / "ssh_config"
    common.write_text(text[text.index("Host *") :])
    assert lab.bastion is not None and len(lab.hosts) == 2
    assert tcp_probe(lab.bastion) == "ok"
    for h in lab.hosts:
        assert tcp_probe(h) != "ok"  # an unreachable route: nothing leaves the machine
        via_config = ssh(lab, h, "hostname")  # ProxyJump from ssh_config
        assert via_config.stdout.decode().strip() == h.hostname, via_config.stderr
        # `ssh -J` by address, with a config that has the lab's files but no per-host entries.
        jump = f"{lab.user}@{lab.bastion.address}:{lab.bastion.port}"
        explicit = subprocess.run(
            ["ssh", "-F", str(common), "-J", jump, h.address, "hostname"],
            capture_output=True,
            text=True,
            timeout=20,
        )
        assert explicit.stdout.strip() == h.hostname, explicit.stderr
    # The bastion does not route: a private host cannot reach the public side.
    probe = f"exec 3<>/dev/tcp/{lab.bastion.address.rsplit('.', 1)[0]}.1/22"
    assert lab.run(lab.hosts[0], ["timeout", "2", "bash", "-c", probe]).returncode != 0
    # paramiko through the bastion, with strict host keys at both hops.
    outer = paramiko_client(lab)
    connect(lab, outer, lab.bastion)
    transport = outer.get_transport()
    assert transport is not None
    channel = transport.open_channel("direct-tcpip", (lab.hosts[1].address, 22), ("127.0.0.1", 0))
    inner = paramiko_client(lab)
    connect(lab, inner, lab.hosts[1], sock=channel)
    _, out, _ = inner.exec_command("hostname")
    assert out.read().decode().strip() == lab.hosts[1].hostname
    inner.close()
    outer.close()


# -- bring-up and teardown -------------------------------------------------------------------------


@pytest.mark.isolated
def test_a_stopped_lab_leaves_nothing_behind(lab: Lab) -> None:
    t = time.monotonic()
    other = start_lab(2)
    up = time.monotonic() - t
    try:
        assert other.id != lab.id
        assert {h.address for h in other.hosts}.isdisjoint(h.address for h in lab.hosts)
        assert ssh(other, other.hosts[1], "hostname").returncode == 0
        assert cleanup.residue(other.id)  # the check sees a running lab...
        other.cut_link(other.hosts[0])
        other.cap_bandwidth(other.hosts[1])
        other.crash_host(other.hosts[1])
    finally:
        other.stop()
    other.stop()  # idempotent
    assert up < 5
    assert cleanup.residue(other.id, ns_inodes=other.ns_inodes) == []  # ...and nothing after
    listing = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert f"tfl{other.id}" not in listing
    assert (
        f"tfdeploy-lab-{other.id}"
        not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    )
    assert ssh(lab, lab.hosts[0], "true").returncode == 0  # the session lab is untouched


@pytest.mark.isolated
def test_a_killed_test_run_is_cleaned_up_by_the_next(lab: Lab) -> None:
    code = "from tests.lab import start_lab; lab = start_lab(1); print(lab.id, flush=True); input()"
    child = subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    orphan = child.stdout.readline().strip()
    assert cleanup.netns_names(orphan)
    child.send_signal(signal.SIGKILL)  # no teardown at all
    child.wait()
    assert orphan in cleanup.clean_stale()
    assert cleanup.residue(orphan) == []
    assert lab.id not in cleanup.clean_stale()  # a live lab is never touched
    assert ssh(lab, lab.hosts[0], "true").returncode == 0


@pytest.mark.names_tf(reason="checks the inventory `tests.lab up` writes; runs no job")
def test_cli_up_writes_a_ready_inventory_and_down_removes_the_lab(tmp_path: Path) -> None:
    inventory = tmp_path / "lab.toml"
    cli = [sys.executable, "-m", "tests.lab"]
    up = subprocess.run(
        [*cli, "up", "2", "--inventory", str(inventory)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert up.returncode == 0, up.stderr
    lab_id = up.stdout.split()[1]
    try:
        data = tomllib.loads(inventory.read_text())
        assert [h["name"] for h in data["hosts"]] == ["h1", "h2"]
        h = data["hosts"][1]
        config = cleanup.lab_dir(lab_id) / "ssh_config"
        done = subprocess.run(
            ["ssh", "-F", str(config), "h2", "echo up"], capture_output=True, text=True, timeout=20
        )
        assert done.stdout == "up\n", done.stderr
        assert h["ssh"]["port"] > 0 and data["ssh"]["host_keys"] == "strict"
        # The README's first multi-host run: the digits example, run by this interpreter.
        job = data["job"]
        assert job["code"] == str(REPO / "examples" / "digits") and job["python"] == sys.executable
        assert job["command"] == "python3 mwms.py" and job["artifacts"] == ["ckpt/**"]
    finally:
        down = subprocess.run([*cli, "down", lab_id], cwd=REPO, capture_output=True, text=True)
    assert down.returncode == 0, down.stderr
    assert cleanup.residue(lab_id) == []


@pytest.mark.isolated(reason="hosts with a private /root and /tmp, and podman in each")
def test_cli_up_replaces_an_interpreter_the_hosts_cannot_see_and_gives_container_hosts(
    tmp_path: Path,
) -> None:
    # A quick start's .venv made from pyenv's python3 under /root: its bin/python is a link into
    # a folder the hosts have their own empty copy of (here a link through /tmp, as private).
    if (why := lab_containers.available()) is not None:
        pytest.skip(why)
    if not os.access(VENV_PYTHON, os.X_OK):
        pytest.skip(f"no {VENV_PYTHON} to fall back to (scripts/install.sh makes it)")
    hidden = tmp_path / "python3"
    hidden.symlink_to(sys.executable)
    inventory = tmp_path / "lab.toml"
    cli = [sys.executable, "-m", "tests.lab"]
    up = subprocess.run(
        [*cli, "up", "1", "--containers", "--python", str(hidden), "--inventory", str(inventory)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert up.returncode == 0, up.stdout + up.stderr
    lab_id = up.stdout.split("lab ", 1)[1].split()[0]
    try:
        assert f"note: the hosts cannot see {hidden}" in up.stdout, up.stdout
        assert f"the inventory uses {VENV_PYTHON} instead" in up.stdout, up.stdout
        assert "1 hosts (namespaces, podman)" in up.stdout, up.stdout
        assert tomllib.loads(inventory.read_text())["job"]["python"] == VENV_PYTHON
        config = cleanup.lab_dir(lab_id) / "ssh_config"
        root = "{{.Store.GraphRoot}}"
        done = subprocess.run(
            ["ssh", "-F", str(config), "h1", f"podman info --format '{root}'"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        # The host's podman runs, with its own image store in the lab's directory.
        assert done.stdout.strip() == str(cleanup.lab_dir(lab_id) / "h1" / "containers"), done
    finally:
        down = subprocess.run([*cli, "down", lab_id], cwd=REPO, capture_output=True, text=True)
    assert down.returncode == 0, down.stderr
    assert cleanup.residue(lab_id) == []
