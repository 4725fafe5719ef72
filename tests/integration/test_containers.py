"""Tasks in containers on lab hosts, with real podman (remote/containers.py run inside each host,
as the agent runs it): the host's network, TF_CONFIG inside, files owned by the login user, exit
codes and signals, stop with grace then kill, cleanup by label, an image loaded from an OCI
layout into a store that never saw it. Each test ends with 0 containers and no store mount left
(`clean_container_lab`). What cannot run here (docker, GPU flags) is tested as argv in
tests/unit/test_containers_argv.py; docs/containers.md says which is which."""

from __future__ import annotations

import json
import random
import shlex
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from deployer.envs import images
from remote import containers
from tests.lab import Lab
from tests.lab import containers as lab_containers
from tests.lab.model import VENV_PYTHON

pytestmark = pytest.mark.isolated(reason="container hosts need the namespace lab (root)")

REMOTE = Path(containers.__file__).resolve().parent
IMAGE = lab_containers.TEST_IMAGE


def _remote_on_hosts(lab: Lab) -> Path:
    """remote/ copied into the lab's folder, which every host sees: the checkout may lie where
    hosts cannot look (a clone under /tmp, which each lab host has of its own)."""
    dest = lab.dir / "remote"
    if not dest.is_dir():
        shutil.copytree(REMOTE, dest, ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def call(lab: Lab, host: Any, expr: str, timeout: float = 60) -> Any:
    """`expr` evaluated by remote/containers.py inside the host (its own store); JSON back."""
    code = (
        f"import sys, json; sys.path.insert(0, {str(_remote_on_hosts(lab))!r}); import containers\n"
        f"print(json.dumps({expr}))"
    )
    env = " ".join(shlex.quote(a) for a in lab._container_env(lab.host(host).name))  # type: ignore[attr-defined]
    done = lab.run(host, f"env {env} {VENV_PYTHON} -c {shlex.quote(code)}", timeout=timeout)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def login(lab: Lab) -> tuple[int, int, str]:
    import pwd

    p = pwd.getpwnam(lab.login_user)
    return p.pw_uid, p.pw_gid, p.pw_dir


class RunArgv(list[str]):
    """run_argv's words, with the values its `--env NAME`s take from the client's environment
    (containers.client_env): the supervisor starts the client so, and so does podman_cmd."""

    env: dict[str, str]

    def detached(self) -> RunArgv:
        """The same run with `-d` after `podman run`."""
        words = RunArgv([*self[:2], "-d", *self[2:]])
        words.env = self.env
        return words


def argv(lab: Lab, run_id: str, task: str, command: str, **kw: Any) -> RunArgv:
    uid, gid, home = login(lab)
    work = kw.pop("workdir", f"{home}/.tfdeploy")
    args = dict(
        image=IMAGE,
        run_id=run_id,
        task=task,
        command=command,
        env=kw.pop("env", {}),
        mounts=[work],
        cwd=work,
        uid=uid,
        gid=gid,
    )
    words = RunArgv(containers.run_argv("podman", **{**args, **kw}))
    words.env = containers.client_env({}, args["env"], kw.get("gpus", ()))  # type: ignore[arg-type]
    return words


def podman_cmd(lab: Lab, host: Any, run_argv: RunArgv) -> str:
    lab_env = lab._container_env(lab.host(host).name)  # type: ignore[attr-defined]
    values = [f"{k}={v}" for k, v in run_argv.env.items()]
    env = " ".join(shlex.quote(a) for a in [*lab_env, *values])
    return f"env {env} {shlex.join(run_argv)}"


@pytest.fixture
def host(clean_container_lab: Lab) -> Any:
    """h1 with the test image and the login user's workdir (as an agent would make it)."""
    lab = clean_container_lab
    h = lab.hosts[0]
    lab.import_test_image(h)  # type: ignore[attr-defined]
    uid, gid, home = login(lab)
    lab.run(h, f"mkdir -p {home}/.tfdeploy && chown {uid}:{gid} {home}/.tfdeploy")
    return h


def test_task_environment_arrives_and_files_in_mounts_belong_to_the_login_user(
    clean_container_lab: Lab, host: Any
) -> None:
    lab = clean_container_lab
    uid, gid, home = login(lab)
    tf_config = json.dumps(
        {"cluster": {"worker": ["10.77.0.11:2222"]}, "task": {"type": "worker", "index": 0}}
    )
    env = {"TF_CONFIG": tf_config, "TFDEPLOY_RUN_ID": "rEnv", "FORWARDED": "a b'c"}
    run = argv(lab, "rEnv", "worker/0", "env > env.txt; pwd > pwd.txt; id -u > uid.txt", env=env)
    done = lab.run(host, podman_cmd(lab, host, run))
    assert done.returncode == 0, done.stderr
    got = dict(
        line.split("=", 1)
        for line in lab.run(host, f"cat {home}/.tfdeploy/env.txt").stdout.splitlines()
        if "=" in line
    )
    assert json.loads(got["TF_CONFIG"]) == json.loads(tf_config)
    assert got["TFDEPLOY_RUN_ID"] == "rEnv" and got["FORWARDED"] == "a b'c"
    assert lab.run(host, f"cat {home}/.tfdeploy/pwd.txt").stdout.strip() == f"{home}/.tfdeploy"
    owners = lab.run(host, f"stat -c '%u:%g %n' {home}/.tfdeploy/*.txt").stdout.splitlines()
    assert owners and all(line.startswith(f"{uid}:{gid} ") for line in owners), owners
    # Kept after its exit (no --rm) until removed by the run's label.
    assert call(lab, host, "containers.run_containers('podman', 'rEnv')")
    assert len(call(lab, host, "containers.remove_run('podman', 'rEnv')")) == 1
    lab.run(host, f"rm -f {home}/.tfdeploy/*.txt")


def test_host_network_only_its_own_and_a_port_reachable_from_another_host(
    clean_container_lab: Lab, host: Any
) -> None:
    lab = clean_container_lab
    other = lab.hosts[1]
    script = (
        "ip -o -4 addr show | awk '{print $4}' > /tmp/addrs; echo from-container | nc -l -p 2345"
    )
    run = argv(lab, "rNet", "chief/0", script, workdir="/tmp")
    background = f"({podman_cmd(lab, host, run)} > /tmp/net.log 2>&1; echo $? > /tmp/net.rc)"
    lab.run(host, f"{background} </dev/null >/dev/null 2>&1 &")
    deadline = time.monotonic() + 20
    while 2345 not in lab.listening_ports(host):
        assert time.monotonic() < deadline, lab.run(host, "cat /tmp/net.log").stdout
        time.sleep(0.05)
    probe = (
        f"import socket; s = socket.create_connection(({host.address!r}, 2345), timeout=5); "
        "print(s.recv(100).decode().strip())"
    )
    got = lab.run(other, [VENV_PYTHON, "-c", probe])
    assert got.stdout.strip() == "from-container", got.stderr
    lab.run(host, "while [ ! -s /tmp/net.rc ]; do sleep 0.05; done", timeout=20)
    assert lab.run(host, "cat /tmp/net.rc").stdout.strip() == "0"
    # What the container saw is the host's own network: its address and loopback, nothing else.
    addrs = lab.run(host, "cat /tmp/addrs").stdout.split()
    assert sorted(addrs) == sorted(["127.0.0.1/8", f"{host.address}/24"]), addrs
    assert 2345 not in lab.listening_ports(other)
    call(lab, host, "containers.remove_run('podman', 'rNet')")


@pytest.mark.parametrize(
    ("command", "status", "code"),
    [("exit 7", 7, 7), ("kill -TERM $$", 143, -15), ("kill -KILL $$", 137, -9)],
)
def test_exit_codes_and_signals_are_the_tasks(
    clean_container_lab: Lab, host: Any, command: str, status: int, code: int
) -> None:
    """`--init` matters: without it the task is PID 1, and `kill -TERM $$` does nothing."""
    lab = clean_container_lab
    done = lab.run(host, podman_cmd(lab, host, argv(lab, "rExit", "w/0", command)))
    assert done.returncode == status, done.stderr
    assert containers.returncode(done.returncode) == code
    call(lab, host, "containers.remove_run('podman', 'rExit')")


def test_stop_is_grace_then_kill_and_removes_the_container(
    clean_container_lab: Lab, host: Any
) -> None:
    lab = clean_container_lab
    _, _, home = login(lab)
    loop = "while :; do sleep 0.1; done"  # ready-*: in the workdir, mounted at its own path
    polite = argv(lab, "rStop", "polite", f"trap 'exit 0' TERM; touch ready-polite; {loop}")
    stubborn = argv(lab, "rStop", "stubborn", f"trap '' TERM; touch ready-stubborn; {loop}")
    for run in (polite, stubborn):
        lab.run(host, f"{podman_cmd(lab, host, run.detached())} >/dev/null")
    # Stopped only once each shell has set its trap (a TERM before it, under load, is lost to
    # a container still starting, and the polite one then waits out the grace too).
    deadline = time.monotonic() + 30
    while lab.run(host, f"ls {home}/.tfdeploy/ready-* 2>/dev/null").stdout.count("ready-") < 2:
        assert time.monotonic() < deadline, "the containers' shells never started"
        time.sleep(0.1)
    names = [containers.container_name("rStop", t) for t in ("polite", "stubborn")]
    took = []
    for name in names:
        t0 = time.monotonic()
        call(lab, host, f"containers.stop('podman', {name!r}, 4)")
        took.append(time.monotonic() - t0)
    lab.run(host, f"rm -f {home}/.tfdeploy/ready-*")
    assert took[0] < 3.0, took  # ended on SIGTERM, through the container's init
    assert took[1] >= 4.0, took  # ignored SIGTERM: killed when the grace ran out
    assert call(lab, host, "containers.run_containers('podman', 'rStop')") == []


def test_a_killed_client_leaves_its_container_and_cleanup_by_label_ends_it(
    clean_container_lab: Lab, host: Any
) -> None:
    """What every stop path must do: SIGKILL of a task's process group ends the podman client,
    not the container that conmon keeps; `remove_run` finds the run's containers by label."""
    lab = clean_container_lab
    run = argv(lab, "rKill", "w/0", "sleep 300")
    lab.run(host, f"({podman_cmd(lab, host, run)} >/dev/null 2>&1 &) ; sleep 0")
    deadline = time.monotonic() + 20
    while not call(lab, host, "containers.run_containers('podman', 'rKill')"):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    lab.run(host, "pkill -KILL -x podman; true")  # inside this host only: its own PID namespace
    time.sleep(0.5)
    left = lab.containers_left(host)  # type: ignore[attr-defined]
    assert any("Up" in item for item in left), left  # the container outlived its client
    removed = call(lab, host, "containers.remove_run('podman', 'rKill')")
    assert len(removed) == 1
    assert lab.leftovers(host) == []


def test_an_image_saved_here_loads_on_a_host_that_never_saw_it(
    clean_container_lab: Lab, tmp_path: Path, private_store: Path
) -> None:
    lab = clean_container_lab
    target = lab.hosts[2]
    assert not call(lab, target, f"containers.image_exists('podman', {IMAGE!r})")
    base = _import_here(IMAGE)
    # The host sees this machine's /var/tmp (the lab directory), not its /tmp.
    layout = images.export_oci(base, lab.dir / "images")
    image_id = call(lab, target, f"containers.load_oci('podman', {str(layout.path)!r}, {IMAGE!r})")
    assert image_id == layout.image_id
    assert call(lab, target, f"containers.image_exists('podman', {IMAGE!r})")
    tags = lab.podman(target, f"image inspect --format '{{{{json .RepoTags}}}}' {image_id}")  # type: ignore[attr-defined]
    assert json.loads(tags.stdout) == [IMAGE]  # the path-made name podman gave it is gone
    info = call(lab, target, "containers.runtime_info('podman')")
    assert info == {"runtime": "podman", "rootless": False, "platform": "linux/amd64"}
    # what preflight compares with the host's platform (remote/imageop.py)
    assert call(lab, target, f"containers.image_platform('podman', {IMAGE!r})") == "linux/amd64"
    done = lab.run(
        target, podman_cmd(lab, target, argv(lab, "rLoad", "w/0", "echo loaded", workdir="/tmp"))
    )
    assert done.returncode == 0 and done.stdout.strip() == "loaded", done.stderr
    call(lab, target, "containers.remove_run('podman', 'rLoad')")
    lab.podman(target, "rmi -a -f")  # type: ignore[attr-defined]


def test_a_changed_top_layer_is_all_a_redeploy_sends(tmp_path: Path, private_store: Path) -> None:
    """Two images, the second FROM the first plus a 3 MB file: their OCI layouts share the base
    layer's blob by name, so a host holding the first lacks only the new layer and metadata."""
    # An image of its own, not the run's shared one (tests/support/image_jobs.py): what it
    # checks is this image's layers (a base, then a 3 MB layer FROM it), in a store of its own.
    base = _import_here(IMAGE)
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    # 3 MB that gzip cannot shrink, like trained weights: the layer's blob is about that size.
    (ctx / "weights.bin").write_bytes(random.Random(42).randbytes(3 << 20))
    (ctx / "Containerfile").write_text(f"FROM {base}\nCOPY weights.bin /weights.bin\n")
    images._podman("build", "-q", "-t", "localhost/tfdeploy-test/changed:1", str(ctx), timeout=300)
    first = images.export_oci(base, tmp_path / "images")
    second = images.export_oci("localhost/tfdeploy-test/changed:1", tmp_path / "images")
    assert images.export_oci(base, tmp_path / "images") == first  # saved once, kept by ID
    shared = {b.digest for b in first.blobs} & {b.digest for b in second.blobs}
    assert shared and max(b.size for b in first.blobs if b.digest in shared) > 500_000
    # A host holding the first has its blobs; the store sends a content once, by digest
    # (deployer/up/images.py): what the host lacks is what a re-deploy sends.
    sent = sum(b.size for b in second.blobs if b.digest not in {b.digest for b in first.blobs})
    layer = max(b.size for b in second.blobs if b.digest not in shared)
    print(
        f"base {first.size} B, changed {second.size} B, re-deploy sends {sent} B (layer {layer} B)"
    )
    assert layer > 3 << 20
    assert sent - layer < 4096  # the layer, its manifest and config, nothing of the base


@pytest.fixture
def private_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """This machine's podman with a store of the test's own (vfs), not /var/lib/containers."""
    store = tmp_path / "store"
    conf = tmp_path / "storage.conf"
    conf.write_text(
        lab_containers.storage_conf(store).replace(lab_containers.RUNROOT, str(tmp_path / "run"))
    )
    monkeypatch.setenv("CONTAINERS_STORAGE_CONF", str(conf))
    monkeypatch.setenv("CONTAINERS_CONF", str(_machine_conf(tmp_path)))
    yield store
    images._podman("rmi", "-a", "-f")


def _machine_conf(tmp_path: Path) -> Path:
    path = tmp_path / "containers.conf"
    path.write_text(lab_containers.CONTAINERS_CONF)
    return path


def _import_here(name: str) -> str:
    images._podman("import", "-q", str(lab_containers.test_image_tar()), name)
    return name
