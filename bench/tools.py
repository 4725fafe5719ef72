"""The four ways of doing the same job on the same lab hosts: tfdeploy and three baselines.

Each tool deploys a code tree to DEST on N hosts and starts one task per host that sleeps (its
own `sleep 1000.K`, so tools never see each other's processes), returning once every task is
confirmed running; `down` returns once every task is confirmed gone.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from bench import workload
from tests.lab import Lab, LabHost

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
ANSIBLE_PLAYBOOK = Path(
    os.environ.get("BENCH_ANSIBLE", "/opt/tfdeploy/bench-venv/bin/ansible-playbook")
)


class BenchError(RuntimeError):
    """A tool failed: the bench stops rather than report a number for work not done."""


@dataclass
class Ctx:
    lab: Lab
    tmp: Path

    @property
    def ssh_config(self) -> Path:
        return self.lab.ssh_config


def run(argv: list[str], *, env: dict[str, str] | None = None, what: str = "") -> str:
    r = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
    if r.returncode != 0:
        tail = (r.stdout + r.stderr)[-1500:]
        raise BenchError(f"{what or argv[0]} failed (exit {r.returncode}):\n{tail}")
    return r.stdout


def wire_bytes(lab: Lab, hosts: list[LabHost]) -> int:
    """Bytes the machine sent to these hosts (root side of each host's veth), SSH included."""
    total = 0
    for h in hosts:
        dev = f"tfl{lab.id}{h.name}"
        try:
            total += int(Path(f"/sys/class/net/{dev}/statistics/tx_bytes").read_text())
        except OSError:
            return -1  # loopback lab: no per-host counter
    return total


def on_hosts(ctx: Ctx, hosts: list[LabHost], command: str) -> None:
    """Untimed housekeeping inside each host (nsenter, no SSH)."""
    for h in hosts:
        r = ctx.lab.run(h, command)
        if r.returncode != 0:
            raise BenchError(f"{h.name}: {command!r} failed: {r.stderr.strip()[-300:]}")


def wait_gone(pattern: str) -> str:
    return f"while pgrep -f '{pattern}' >/dev/null; do sleep 0.02; done"


def wait_running(pattern: str) -> str:
    """Polls until the task runs; gives up (non-zero) after 20 s rather than hang the bench."""
    return (
        f"i=0; until pgrep -f '{pattern}' >/dev/null; "
        "do i=$((i+1)); [ $i -lt 1000 ] || exit 9; sleep 0.02; done"
    )


class Tool:
    name = ""
    tag = ""  # sleep 1000.<tag>
    dest = ""

    def __init__(self, ctx: Ctx) -> None:
        self.ctx = ctx

    @property
    def pattern(self) -> str:
        return f"^sleep 1000[.]{self.tag}$"

    def deploy(self, hosts: list[LabHost], tree: Path) -> int | None:
        """Push the tree, start the tasks; returns code bytes sent per host if the tool says."""
        raise NotImplementedError

    def down(self, hosts: list[LabHost]) -> None:
        raise NotImplementedError

    def reset(self, hosts: list[LabHost], *, keep_files: bool = False) -> None:
        """Untimed: stop this tool's tasks and (unless keep_files) delete what it deployed."""
        kill = f"pkill -9 -f '{self.pattern}'; {wait_gone(self.pattern)}"
        rm = "" if keep_files else f"; rm -rf {self.dest}"
        on_hosts(self.ctx, hosts, kill + rm)


class Tfdeploy(Tool):
    name, tag, dest = "tfdeploy", "0", "/root/.tfdeploy"

    def __init__(self, ctx: Ctx) -> None:
        super().__init__(ctx)
        self.env = os.environ | {"TFDEPLOY_STATE_DIR": str(ctx.tmp / "tfdeploy-state")}

    def inventory(self, hosts: list[LabHost], tree: Path, command: str = "sleep 1000.0") -> Path:
        path = self.ctx.tmp / f"tfdeploy-{len(hosts)}-{tree.name}.toml"
        return self.ctx.lab.write_inventory(
            path,
            tasks=[[{"role": "worker"}]] * len(hosts),
            hosts=hosts,
            job={"code": str(tree), "command": command, "name": "bench", "stop_grace": 10},
        )

    def cli(self, *args: str) -> str:
        return run([sys.executable, "-m", "deployer", *args], env=self.env, what="tfdeploy")

    def deploy(self, hosts: list[LabHost], tree: Path) -> int | None:
        out = self.cli("up", "--detach", str(self.inventory(hosts, tree)))
        m = re.search(r"(\d+(?:\.\d+)?) (B|kB|MB|GB|TB) sent", out)  # human units: 3 digits
        if m is None:
            return 0 if "0 bytes sent" in out else None
        scale = {"B": 1, "kB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}[m.group(2)]
        return int(float(m.group(1)) * scale) // len(hosts)

    def down(self, hosts: list[LabHost]) -> None:
        self.cli("down", str(self.inventory(hosts, self.ctx.tmp)))

    def reset(self, hosts: list[LabHost], *, keep_files: bool = False) -> None:
        if keep_files:
            self.down(hosts)
        else:
            super().reset(hosts)  # cold: the agent and the content store go too

    def preflight(self, hosts: list[LabHost], tree: Path) -> None:
        inv = self.inventory(hosts, tree)
        run([sys.executable, "-m", "bench.preflight", str(inv)], env=self.env, what="preflight")


class Ansible(Tool):
    """ansible-core: forks=N, pipelining, ControlPersist; unarchive, async start, then kill.

    synchronize lives in the ansible.posix collection, not in ansible-core; `copy` of a directory
    transfers file by file (one module run per file), so the archive is Ansible's fast path.
    """

    name, tag, dest = "ansible", "1", "/root/bench-ansible"

    def _files(self, hosts: list[LabHost]) -> tuple[Path, dict[str, str]]:
        d = self.ctx.tmp / "ansible"
        (d / "cp").mkdir(parents=True, exist_ok=True)
        (d / "hosts.ini").write_text("[lab]\n" + "".join(f"{h.name}\n" for h in hosts))
        (d / "ansible.cfg").write_text(
            "[defaults]\n"
            f"inventory = {d / 'hosts.ini'}\n"
            f"interpreter_python = {self.ctx.lab.python}\n"
            "gathering = explicit\nretry_files_enabled = False\nhost_key_checking = True\n"
            f"local_tmp = {d / 'tmp'}\n"
            "[ssh_connection]\npipelining = True\n"
            f"ssh_args = -F {self.ctx.ssh_config} -o ControlMaster=auto -o ControlPersist=60s\n"
            f"control_path_dir = {d / 'cp'}\n"
        )
        (d / "deploy.yml").write_text(
            f"""- hosts: lab
  gather_facts: false
  tasks:
    - file: {{path: {self.dest}/code, state: directory}}
    - unarchive: {{src: "{{{{ tarball }}}}", dest: {self.dest}/code}}
    - command: sleep 1000.1
      args: {{chdir: {self.dest}/code}}
      async: 3600
      poll: 0
    - shell: "{wait_running(self.pattern)}"
"""
        )
        (d / "down.yml").write_text(
            f"""- hosts: lab
  gather_facts: false
  tasks:
    - shell: "pkill -f '{self.pattern}'; {wait_gone(self.pattern)}"
"""
        )
        env = os.environ | {"ANSIBLE_CONFIG": str(d / "ansible.cfg"), "HOME": str(d)}
        return d, env

    def deploy(self, hosts: list[LabHost], tree: Path) -> int | None:
        d, env = self._files(hosts)
        tarball = workload.tar_of(tree, self.ctx.tmp / f"{tree.name}.tar")  # part of the work
        argv = [str(ANSIBLE_PLAYBOOK), "-f", str(len(hosts)), str(d / "deploy.yml")]
        run([*argv, "-e", f"tarball={tarball}"], env=env, what="ansible deploy")
        return None

    def down(self, hosts: list[LabHost]) -> None:
        d, env = self._files(hosts)
        run([str(ANSIBLE_PLAYBOOK), "-f", str(len(hosts)), str(d / "down.yml")], env=env)

    def close(self) -> None:
        # ControlPersist masters outlive the playbook: end them so they hold no lab host open.
        for sock in (self.ctx.tmp / "ansible" / "cp").glob("*"):
            subprocess.run(
                ["ssh", "-O", "exit", "-o", f"ControlPath={sock}", "x"], capture_output=True
            )


class PdshRsync(Tool):
    """pdsh -R exec fans out rsync (push) and ssh (start, stop) to N hosts at once."""

    name, tag, dest = "pdsh+rsync", "2", "/root/bench-rsync"

    def _pdsh(self, hosts: list[LabHost], *argv: str) -> None:
        names = ",".join(h.name for h in hosts)
        env = os.environ | {"PDSH_RCMD_TYPE": "exec"}
        run(
            ["pdsh", "-S", "-R", "exec", "-f", str(len(hosts)), "-w", names, *argv],
            env=env,
            what="pdsh",
        )

    def deploy(self, hosts: list[LabHost], tree: Path) -> int | None:
        ssh = f"ssh -F {self.ctx.ssh_config}"
        self._pdsh(
            hosts,
            "rsync",
            "-a",
            "--mkpath",
            "--delete",
            "-e",
            ssh,
            f"{tree}/",
            f"%h:{self.dest}/code/",
        )
        start = (
            f"cd {self.dest}/code && (setsid sleep 1000.2 >/dev/null 2>&1 </dev/null &) && "
            + wait_running(self.pattern)
        )
        self._pdsh(hosts, "ssh", "-F", str(self.ctx.ssh_config), "%h", start)
        return None

    def down(self, hosts: list[LabHost]) -> None:
        stop = f"pkill -f '{self.pattern}'; {wait_gone(self.pattern)}"
        self._pdsh(hosts, "ssh", "-F", str(self.ctx.ssh_config), "%h", stop)


class FabricLoop(Tool):
    """The floor: one host after another with fabric, put a tar, untar, start, confirm."""

    name, tag, dest = "fabric loop", "3", "/root/bench-fabric"

    def _loop(self, hosts: list[LabHost], action: str, tree: Path | None = None) -> None:
        argv = [sys.executable, "-m", "bench.fabric_loop", action, str(self.ctx.lab.key_path)]
        argv += [str(self.ctx.lab.known_hosts), self.dest, self.pattern]
        argv += [str(self.ctx.tmp / f"{tree.name}.tar") if tree else "-"]
        argv += [f"{h.address}:{h.port}" for h in hosts]
        run(argv, what="fabric loop")

    def deploy(self, hosts: list[LabHost], tree: Path) -> int | None:
        workload.tar_of(tree, self.ctx.tmp / f"{tree.name}.tar")  # part of the work
        self._loop(hosts, "deploy", tree)
        return None

    def down(self, hosts: list[LabHost]) -> None:
        self._loop(hosts, "down")


def settle() -> None:
    """Writes back and drops the page cache, so each run writes into memory the cache already
    used. On this VM (Firecracker) a cache that had grown over a bench made writes of memory
    it had never used cost several times more: the same artifacts pull took 2.4-2.7 s (2.0-2.3
    s of CPU) with 13 GB cached and 0.97-1.0 s (0.55 s) after a drop, whichever version of
    tfdeploy ran, and a cell's runs flipped between the two. The price: every timed command
    starts with its own files read from disk again, tfdeploy's hundreds of Python modules more
    than rsync's one binary (bench.fanout, uplink-bound, does not settle: a settled run read its
    16-host preflight 1.03 s against 0.88 s)."""
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def make_tmp() -> Path:
    return Path(tempfile.mkdtemp(prefix="tfdeploy-bench-"))
