"""The real lab: each host is a network + mount + PID + UTS namespace running its own sshd."""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import ipaddress
import json
import os
import random
import re
import shlex
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.lab import cleanup, procs, sshconf
from tests.lab import containers as lab_containers
from tests.lab import slurm as lab_slurm
from tests.lab.base import HostRef, Lab, is_sshd, wait_until
from tests.lab.model import VENV_PYTHON, LabError, LabHost, Proc
from tests.lab.users import LoginUser, ensure_login_user

_INIT_SRC = Path(__file__).with_name("hostinit.py")
_PR_SET_PDEATHSIG = 1
_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# Runs as the first process of a new host (inside its netns, before the PID 1 init takes over).
_BOOT = """set -e
hostname {hostname}
mount -t tmpfs -o mode=0700 lab-root /root
mount -t tmpfs -o mode=1777 lab-tmp /tmp
{home}
{containers}
{slurm}
ip link set lo up
{links}
mkdir -p /run/sshd
/usr/sbin/sshd -f {config} -E {log}
exec /usr/bin/python3 {init} {name}
"""


@dataclass
class _Slot:
    """What the lab knows about one host besides its public LabHost."""

    host: LabHost
    netns: str
    veth: str  # root-namespace end of the host's (first) link
    nets: list[tuple[str, str, str]]  # (interface inside, address/prefix, mac) per link
    neighbours: list[tuple[str, str, str]]  # permanent (address, mac, dev) entries inside
    proc: subprocess.Popen[bytes] | None = None
    init: int = 0  # pid of the host's PID 1, as the root namespace sees it
    pidns: int = 0
    crashed: bool = False


@dataclass(frozen=True)
class _Subnet:
    """One lab subnet of 10.77.0.0/16: a /24 (up to 244 hosts) or a /23 (up to 500).

    Offsets count from the subnet's first address: .1 is the bridge, hosts start at 10, and the
    last usable offset is the bastion's. A /23 spans two third octets (X and X+1, X even).
    """

    base: int  # third octet of the first address
    prefix: int

    @property
    def size(self) -> int:
        return 1 << (32 - self.prefix)

    @property
    def last(self) -> int:
        return self.size - 2

    @property
    def cidr(self) -> str:
        return f"10.77.{self.base}.0/{self.prefix}"

    def address(self, offset: int) -> str:
        return f"10.77.{self.base + offset // 256}.{offset % 256}"

    def mac(self, offset: int) -> str:
        # Deterministic per subnet and host, so permanent ARP entries can be written in advance.
        octet = self.base + offset // 256
        return f"02:77:{octet:02x}:{offset % 256:02x}:00:02"


MAX_HOSTS = 499  # a /23 less the bridge, the first ten offsets and the bastion's


def _prefix_for(n: int) -> int:
    """A /24 holds hosts .11 to .254 less the bastion's; more hosts take a /23."""
    if n + 10 < 254:
        return 24
    if n + 10 < 510:
        return 23
    raise LabError(f"a lab has at most {MAX_HOSTS} hosts, not {n}")


def _answers(host: LabHost) -> bool:
    """True when a TCP connect to the host gets any answer: a handshake or a refusal."""
    try:
        with socket.create_connection((host.address, host.port), timeout=0.5):
            return True
    except ConnectionRefusedError:
        return True
    except OSError:
        return False


def _pdeathsig() -> None:
    # If the test process dies (even by SIGKILL), its hosts die with it instead of lingering.
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class NamespaceLab(Lab):
    """Hosts in namespaces on bridges; needs root. Built by `start_lab`, not directly."""

    isolated = True

    def __init__(
        self,
        *,
        lab_id: str,
        directory: Path,
        persistent: bool = False,
        containers: bool = False,
        slurm: bool = False,
        slurm_proctrack: str = "linuxproc",
        slurm_adopt: bool = False,
    ) -> None:
        super().__init__(lab_id=lab_id, directory=directory, user="root", python=VENV_PYTHON)
        self.persistent = persistent
        # Container hosts (tests/lab/containers.py): podman runs in each host, own image store.
        self.containers = containers
        # A Slurm cluster (tests/lab/slurm.py): h1 the login node, the others compute nodes.
        # `slurm_proctrack`: "linuxproc" (no cgroups) or "cgroup" (as production clusters run);
        # `slurm_adopt`: the compute nodes' sshd behind pam_slurm_adopt (cgroup only).
        self.slurm = (
            lab_slurm.SlurmCluster(self, slurm_proctrack, adopt=slurm_adopt) if slurm else None
        )
        self._slots: dict[str, _Slot] = {}
        self._unreachable: list[str] = []
        self.topology = "flat"
        self._login: LoginUser | None = None
        self._shared_home: Path | None = None

    # -- bring-up --------------------------------------------------------------------------------

    def _plan(self, n: int, topology: str, nets: list[_Subnet]) -> list[str]:
        """Fill in hosts and slots; returns the `ip -batch` lines that build the network."""
        pub = nets[0]
        bridge = f"tfl{self.id}b"
        lines = [
            f"link add {bridge} type bridge forward_delay 0",
            f"link set {bridge} up",
            f"addr add {pub.address(1)}/{pub.prefix} dev {bridge}",
        ]
        members: list[tuple[str, _Subnet, int, str]] = []  # (name, subnet, offset, veth)
        hosts_net = pub
        if topology == "bastion":
            priv = hosts_net = nets[1]
            pbridge = f"tfl{self.id}p"
            lines += [f"link add {pbridge} type bridge forward_delay 0", f"link set {pbridge} up"]
            # The private subnet must never follow the default route off this machine.
            self._unreachable = [priv.cidr]
            lines.append(f"route add unreachable {priv.cidr}")
            members.append(("bastion", pub, pub.last, f"tfl{self.id}x"))
        members += [(f"h{i}", hosts_net, 10 + i, f"tfl{self.id}h{i}") for i in range(1, n + 1)]
        for name, net, offset, veth in members:
            address = net.address(offset)
            host = LabHost(name, address, 22, f"{name}-{self.id}")
            ns = f"{cleanup.NETNS_PREFIX}{self.id}-{name}"
            mac = net.mac(offset)
            slot = _Slot(host, ns, veth, [("eth0", f"{address}/{net.prefix}", mac)], [])
            br = bridge if net == pub else f"tfl{self.id}p"
            lines += [
                f"netns add {ns}",
                f"link add {veth} type veth peer name eth0 address {mac} netns {ns}",
                f"link set {veth} master {br} up",
            ]
            if net == pub:
                # Permanent ARP: after a link cut, packets vanish (a timeout, as with a dead
                # cloud host) instead of failing fast with "No route to host".
                lines.append(f"neigh replace {address} lladdr {mac} dev {bridge} nud permanent")
            self._slots[name] = slot
            if name == "bastion":
                self.bastion = host
            else:
                self.hosts.append(host)
        # Permanent ARP between hosts too: 32 hosts dialling each other at once (a TF job, the
        # network check) flood the bridge with ~1,000 ARP broadcasts and some go unanswered, a
        # loss a cloud network (ARP answered by the hypervisor) does not have.
        # Built once per subnet: with 256 hosts that is 65,280 entries, written by one `ip -batch`
        # per host at boot.
        on_net: dict[ipaddress.IPv4Network, list[tuple[str, str]]] = {}
        for slot in self._slots.values():
            for _, cidr, mac in slot.nets:
                iface = ipaddress.ip_interface(cidr)
                on_net.setdefault(iface.network, []).append((str(iface.ip), mac))
        for slot in self._slots.values():
            for dev, cidr, _ in slot.nets:
                iface = ipaddress.ip_interface(cidr)
                own = str(iface.ip)
                slot.neighbours += [(a, m, dev) for a, m in on_net[iface.network] if a != own]
        if topology == "bastion":
            priv = nets[1]
            b = self._slots["bastion"]
            leg = f"tfl{self.id}y"
            mac = priv.mac(priv.last)
            b.nets.append(("eth1", f"{priv.address(priv.last)}/{priv.prefix}", mac))
            lines += [
                f"link add {leg} type veth peer name eth1 address {mac} netns {b.netns}",
                f"link set {leg} master tfl{self.id}p up",
            ]
            for h in self.hosts:
                b.neighbours.append((h.address, self._slots[h.name].nets[0][2], "eth1"))
        return lines

    def _write_files(self) -> None:
        (self.dir / "hostinit.py").write_text(_INIT_SRC.read_text())
        self.authorized_keys.write_text(Path(f"{self.key_path}.pub").read_text())
        # sshd reads authorized_keys as the login user: let it pass the lab directory (not list
        # it) and read that one file. Private keys stay 0600.
        self.dir.chmod(0o711)
        self.authorized_keys.chmod(0o644)
        known = []
        if self.containers:
            (self.dir / "containers.conf").write_text(lab_containers.CONTAINERS_CONF)
            (self.dir / "registries.conf").write_text(lab_containers.REGISTRIES_CONF)
        for slot in self._slots.values():
            d = self.dir / slot.host.name
            conf = sshconf.sshd_config(
                host_key=d / "ssh_host_ed25519_key",
                authorized_keys=self.authorized_keys,
                pid_file=d / "sshd.pid",
                listen="0.0.0.0:22",
                allow_users=["root", self.login_user],
                set_env=self._container_env(slot.host.name),
                use_pam=self.slurm is not None and self.slurm.uses_pam(slot.host),
            )
            (d / "sshd_config").write_text(conf)
            pub = (d / "ssh_host_ed25519_key.pub").read_text()
            known.append(sshconf.known_hosts_line(slot.host, pub, alias=slot.host.name))
        self.known_hosts.write_text("".join(known))
        if self.slurm is not None:
            self.slurm.write_files()
        private = [h.name for h in self.hosts] if self.bastion else []
        self.ssh_config.write_text(
            sshconf.ssh_config(
                self.all_hosts,
                user=self.user,
                key=self.key_path,
                known_hosts=self.known_hosts,
                jump=self.bastion,
                private=private,
            )
        )

    def _save_state(self) -> None:
        owner = None
        if not self.persistent:
            owner = {"pid": os.getpid(), "start": cleanup.start_time(os.getpid())}
        state = {
            "id": self.id,
            "owner": owner,
            "topology": self.topology,
            "unreachable": self._unreachable,
            "hosts": [vars(s.host) for s in self._slots.values()],
            "bastion": self.bastion.name if self.bastion else None,
        }
        (self.dir / "state.json").write_text(json.dumps(state, indent=2))

    def start(self, n: int, topology: str) -> None:
        """Build the network and boot all hosts in parallel; returns when every sshd listens."""
        self.topology = topology
        self._login = ensure_login_user()
        self.login_user = self._login.name
        names = [f"h{i}" for i in range(1, n + 1)] + (["bastion"] if topology == "bastion" else [])
        sshconf.keygen_all([self.key_path] + [self.dir / h / "ssh_host_ed25519_key" for h in names])
        with open(cleanup.LOCK_PATH, "a") as lock:
            # One lab at a time picks subnets and records them, so two labs never share one.
            fcntl.flock(lock, fcntl.LOCK_EX)
            sizes = [_prefix_for(n)] if topology == "flat" else [24, _prefix_for(n)]
            lines = self._plan(n, topology, _free_subnets(sizes))
            self._write_files()
            self._save_state()
            done = cleanup.ip_batch(lines)
            if done.returncode != 0:
                raise LabError(f"building the lab network failed: {done.stderr.strip()}")
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # sshd's privilege-separation dir
        for slot in self._slots.values():
            self._boot(slot)
        for slot in self._slots.values():
            self._await_boot(slot)
        if self.slurm is not None:
            self.slurm.start()

    def _boot(self, slot: _Slot) -> None:
        links = []
        for dev, addr, _ in slot.nets:
            links += [f"ip link set {dev} up", f"ip addr replace {addr} dev {dev}"]
        neighbours = [
            f"neigh replace {addr} lladdr {mac} dev {dev} nud permanent"
            for addr, mac, dev in slot.neighbours
        ]
        if neighbours:  # one `ip` for all: a 100-host lab has 99 entries per host
            links.append(f"printf '%s\\n' {' '.join(map(shlex.quote, neighbours))} | ip -batch -")
        d = self.dir / slot.host.name
        script = _BOOT.format(
            hostname=shlex.quote(slot.host.hostname),
            home=self._home_mount(),
            containers="\n".join(lab_containers.boot_lines()) if self.containers else "",
            slurm="\n".join(self.slurm.boot_lines(slot.host)) if self.slurm else "",
            links="\n".join(links),
            config=shlex.quote(str(d / "sshd_config")),
            log=shlex.quote(str(d / "sshd.log")),
            init=shlex.quote(str(self.dir / "hostinit.py")),
            name=slot.host.name,
        )
        argv = ["ip", "netns", "exec", slot.netns, "unshare", "--uts", "--mount", "--pid"]
        argv += ["--fork", "--mount-proc", "--kill-child", "--propagation", "private"]
        argv += ["/bin/sh", "-c", script]
        # pdeathsig fires when the spawning *thread* exits, so only tie hosts to the main thread.
        tie = not self.persistent and threading.current_thread() is threading.main_thread()
        with open(d / "boot.log", "ab") as log:
            slot.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C reaches the test run, which then stops the lab
                preexec_fn=_pdeathsig if tie else None,
                env={"PATH": _PATH, "HOME": "/root", "LANG": "C.UTF-8"},
            )
        slot.crashed = False

    def _await_boot(self, slot: _Slot, timeout: float = 15) -> None:
        assert slot.proc is not None
        deadline = time.monotonic() + timeout
        children = Path(f"/proc/{slot.proc.pid}/task/{slot.proc.pid}/children")
        while True:
            if slot.proc.poll() is not None:
                log = (self.dir / slot.host.name / "boot.log").read_text(errors="replace")
                raise LabError(f"host {slot.host.name} failed to boot:\n{log[-2000:]}")
            try:
                kids = children.read_text().split()
            except OSError:
                kids = []
            if kids:
                init = int(kids[0])
                raw = procs.read_raw(init)
                # sshd daemonizes before it binds, so "init runs" is not yet "ready": wait for
                # the listening socket and for the bridge to forward the host's link.
                if raw is not None and "hostinit.py" in raw.cmdline and self._ready(slot, init):
                    slot.init = init
                    slot.pidns = procs.ns_inode(init, "pid") or 0
                    return
            if time.monotonic() > deadline:
                raise LabError(f"host {slot.host.name} did not boot within {timeout:.0f}s")
            time.sleep(0.01)

    def _ready(self, slot: _Slot, init: int) -> bool:
        if 22 not in procs.listening(f"/proc/{init}/net"):
            return False
        legs = [slot.veth] + ([f"tfl{self.id}y"] if slot.host == self.bastion else [])
        return all(self._forwarding(leg) for leg in legs)

    def _forwarding(self, dev: str) -> bool:
        # 3 = BR_STATE_FORWARDING: only then does the bridge pass the host's packets.
        try:
            state = Path(f"/sys/class/net/{dev}/brport/state").read_text().strip()
        except OSError:
            return False
        return self._operstate(dev) == "up" and state == "3"

    # -- container hosts -----------------------------------------------------------------------

    def _container_env(self, name: str) -> list[str]:
        """sshd `SetEnv` lines of a container host: the lab's containers.conf, its own store."""
        if not self.containers:
            return []
        d = self.dir / name
        (d / "storage.conf").write_text(lab_containers.storage_conf(d / "containers"))
        return [
            f"CONTAINERS_CONF={self.dir / 'containers.conf'}",
            f"CONTAINERS_STORAGE_CONF={d / 'storage.conf'}",
            f"CONTAINERS_REGISTRIES_CONF={self.dir / 'registries.conf'}",
        ]

    def trust_registry(self, address: str) -> None:
        """Every container host may pull from `address` (`ADDR:PORT`, plain HTTP): a registry a
        test runs on the lab. The lab's registries.conf, not tfdeploy, marks it insecure."""
        if not self.containers:
            raise LabError("a registry needs a container lab (start_lab(..., containers=True))")
        with (self.dir / "registries.conf").open("a") as f:
            f.write(lab_containers.insecure_registry(address))

    def podman(
        self, host: HostRef, args: str, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """`podman ARGS` (a shell string) as root in the host, with the host's own store."""
        if not self.containers:
            raise LabError("podman needs a container lab (start_lab(..., containers=True))")
        env = " ".join(shlex.quote(a) for a in self._container_env(self.host(host).name))
        return self.run(host, f"env {env} podman {args}", timeout=timeout)

    def import_test_image(self, host: HostRef, name: str = lab_containers.TEST_IMAGE) -> str:
        """The busybox test image into the host's store as `name` (~0.2 s); returns `name`."""
        tar = lab_containers.test_image_tar()
        done = self.podman(host, f"import -q {shlex.quote(str(tar))} {shlex.quote(name)}")
        if done.returncode != 0:
            raise LabError(f"podman import on {self.host(host).name} failed: {done.stderr}")
        return name

    def containers_left(self, host: HostRef) -> list[str]:
        """tfdeploy's containers (any run: found by label) and mounts of the host's store."""
        if not self.containers:
            return []
        slot = self._live(host)
        done = self.podman(host, lab_containers.ps_args())
        if done.returncode != 0:
            return [f"podman ps failed: {done.stderr.strip()}"]
        found = [f"container {line}" for line in done.stdout.splitlines() if line.strip()]
        store = str(self.dir / slot.host.name / "containers")
        mounts = Path(f"/proc/{slot.init}/mountinfo").read_text().splitlines()
        points = [line.split()[4] for line in mounts]
        found += [f"mount {p}" for p in points if p.startswith((store, lab_containers.RUNROOT))]
        return found

    def _leftovers_in(self, h: LabHost, processes: Sequence[Proc]) -> list[str]:
        found = super()._leftovers_in(h, processes)
        if self.containers and not self._slot(h).crashed:
            found += self.containers_left(h)
        return found

    def _leftovers_batch(self, hosts: Sequence[LabHost]) -> dict[str, list[str]]:
        slots = [self._slot(h) for h in hosts]
        raws = procs.by_pidns({s.pidns for s in slots if not s.crashed})
        return {
            s.host.name: self._leftovers_in(
                s.host, [] if s.crashed else procs.to_procs(raws[s.pidns], inner=True)
            )
            for s in slots
        }

    # -- the login user's home ---------------------------------------------------------------

    def _home_mount(self) -> str:
        """The command that gives a host the login user's home: its own, or the shared one."""
        user = self._login
        if user is None:
            raise LabError("the lab has no login user before start()")
        home = shlex.quote(user.home)
        if self._shared_home is not None:
            return f"mount --bind {shlex.quote(str(self._shared_home))} {home}"
        opts = f"mode=0700,uid={user.uid},gid={user.gid}"
        return f"mount -t tmpfs -o {opts} lab-home {home}"

    def _remount_homes(self) -> None:
        assert self._login is not None
        home = shlex.quote(self._login.home)
        for slot in self._slots.values():
            if slot.crashed or not slot.init:
                continue
            done = self.run(slot.host, f"umount -l {home}; {self._home_mount()}")
            if done.returncode != 0:
                raise LabError(f"remounting {home} on {slot.host.name} failed: {done.stderr}")

    @contextlib.contextmanager
    def shared_home(self) -> Iterator[Path]:
        """One directory mounted as the login user's home on every host, like NFS/EFS homes.

        Yields that directory (as this machine sees it). Afterwards each host gets a fresh
        private home again and the directory is deleted. A host revived meanwhile boots with it.
        """
        if self._login is None or self._shared_home is not None:
            raise LabError("shared_home needs a started lab and does not nest")
        shared = self.dir / "shared-home"
        shared.mkdir(mode=0o700)
        os.chown(shared, self._login.uid, self._login.gid)
        self._shared_home = shared
        try:
            self._remount_homes()
            yield shared
        finally:
            self._shared_home = None
            if not self.stopped:
                self._remount_homes()
            shutil.rmtree(shared, ignore_errors=True)

    # -- inspection ------------------------------------------------------------------------------

    def _slot(self, ref: HostRef) -> _Slot:
        return self._slots[self.host(ref).name]

    def _live(self, ref: HostRef) -> _Slot:
        slot = self._slot(ref)
        if slot.crashed or self.stopped:
            raise LabError(f"host {slot.host.name} is down (crashed or lab stopped)")
        return slot

    def run(
        self, host: HostRef, cmd: Sequence[str] | str, timeout: float = 30
    ) -> subprocess.CompletedProcess[str]:
        """Run a command inside the host without SSH (nsenter into all its namespaces).

        A background process must redirect its output, or this waits for it to close the pipes.
        """
        slot = self._live(host)
        argv = ["/bin/sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        ns_argv = ["nsenter", "-t", str(slot.init), "-n", "-m", "-p", "-u", "--", *argv]
        env = {"PATH": _PATH, "HOME": "/root", "USER": "root", "LANG": "C.UTF-8"}
        return subprocess.run(
            ns_argv, capture_output=True, text=True, timeout=timeout, env=env, cwd="/"
        )

    def popen(self, host: HostRef, cmd: str) -> subprocess.Popen[str]:
        """A shell command inside the host with pipes on stdin/stdout/stderr (text, line
        buffered), for a conversation with it; the caller waits for it or kills it."""
        slot = self._live(host)
        argv = ["nsenter", "-t", str(slot.init), "-n", "-m", "-p", "-u", "--", "/bin/sh", "-c"]
        env = {"PATH": _PATH, "HOME": "/root", "USER": "root", "LANG": "C.UTF-8"}
        return subprocess.Popen(
            [*argv, cmd],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            bufsize=1,
            env=env,
            cwd="/",
        )

    def processes(self, host: HostRef) -> list[Proc]:
        slot = self._slot(host)
        if slot.crashed:
            return []
        return procs.to_procs(procs.in_pidns(slot.pidns), inner=True)

    def listening_ports(self, host: HostRef) -> set[int]:
        slot = self._slot(host)
        if slot.crashed:
            return set()  # sockets die with the processes that own them
        return procs.listening(f"/proc/{slot.init}/net")

    def _is_init(self, p: Proc) -> bool:
        return p.pid == 1

    def _is_service(self, p: Proc) -> bool:
        return super()._is_service(p) or (self.slurm is not None and lab_slurm.is_daemon(p))

    def _service_ports(self, h: LabHost) -> set[int]:
        return set(lab_slurm.PORTS) if self.slurm is not None else set()

    def _outer_pid(self, host: HostRef, pid: int) -> int:
        slot = self._live(host)
        for raw in procs.in_pidns(slot.pidns):
            if raw.inner_pid == pid:
                return raw.pid
        raise LabError(f"no process {pid} on {slot.host.name}")

    # -- faults ----------------------------------------------------------------------------------

    def _operstate(self, dev: str) -> str:
        try:
            return Path(f"/sys/class/net/{dev}/operstate").read_text().strip()
        except OSError:
            return "gone"

    def cut_link(self, host: HostRef) -> None:
        """Take the host's link down: packets to and from it vanish (connects time out)."""
        slot = self._live(host)
        subprocess.run(["ip", "link", "set", slot.veth, "down"], check=True)
        wait_until(f"{slot.veth} down", lambda: self._operstate(slot.veth) == "down")

    def cut_controller(self, host: HostRef) -> None:
        """Drop every packet between this machine (the controller) and the host, both ways,
        while the host's peers still reach it: a laptop asleep or off the VPN, a cluster that
        goes on. Rules in this namespace's INPUT and OUTPUT chains only (bridged traffic
        between hosts never passes them)."""
        for rule in self._controller_rules(host):
            subprocess.run(["iptables", "-w", "-I", *rule], check=True)

    def restore_controller(self, host: HostRef) -> None:
        for rule in self._controller_rules(host):
            subprocess.run(["iptables", "-w", "-D", *rule], check=False, capture_output=True)

    def _controller_rules(self, host: HostRef) -> list[list[str]]:
        address = self.host(host).address
        return [["INPUT", "-s", address, "-j", "DROP"], ["OUTPUT", "-d", address, "-j", "DROP"]]

    def restore_link(self, host: HostRef) -> None:
        slot = self._slot(host)
        subprocess.run(["ip", "link", "set", slot.veth, "up"], check=True)
        wait_until(f"{slot.veth} forwarding", lambda: self._forwarding(slot.veth))
        # A forwarding bridge port is not yet a working path: the peer's carrier and the
        # neighbour entry (failed while the link was down) settle a moment later. Healed means
        # a TCP handshake gets an answer, accepted or refused.
        target = self.host(host)
        wait_until(f"{target.name} to answer on the network", lambda: _answers(target))

    def _sshd_listeners(self, slot: _Slot) -> list[procs.RawProc]:
        raws = procs.in_pidns(slot.pidns)
        by_outer = {r.pid: r for r in raws}
        # The listener is the sshd whose parent is the host's init; sessions are its children.
        return [
            r
            for r in raws
            if by_outer.get(r.ppid) is not None
            and by_outer[r.ppid].inner_pid == 1
            and is_sshd(Proc(r.inner_pid, 0, 0, "", r.cmdline))
        ]

    def kill_sshd(self, host: HostRef) -> None:
        """SIGKILL the host's sshd listener: open sessions live on, new connects are refused."""
        slot = self._live(host)
        for r in self._sshd_listeners(slot):
            os.kill(r.pid, signal.SIGKILL)
        wait_until("sshd to stop listening", lambda: 22 not in self.listening_ports(slot.host))

    def start_sshd(self, host: HostRef) -> None:
        slot = self._live(host)
        d = self.dir / slot.host.name
        done = self.run(
            slot.host, ["/usr/sbin/sshd", "-f", str(d / "sshd_config"), "-E", str(d / "sshd.log")]
        )
        if done.returncode != 0:
            raise LabError(f"sshd did not start on {slot.host.name}: {done.stderr.strip()}")
        wait_until("sshd to listen", lambda: 22 in self.listening_ports(slot.host))

    def crash_host(self, host: HostRef) -> None:
        """SIGKILL the host's init: the kernel kills every process of its PID namespace."""
        slot = self._live(host)
        os.kill(slot.init, signal.SIGKILL)
        assert slot.proc is not None
        slot.proc.wait(timeout=10)
        wait_until(f"{slot.host.name} to die", lambda: not procs.in_pidns(slot.pidns))
        slot.crashed = True

    def revive_host(self, host: HostRef) -> None:
        """Boot a fresh host in the crashed one's place: same address, same host key."""
        slot = self._slot(host)
        if not slot.crashed:
            raise LabError(f"host {slot.host.name} is not crashed")
        self._boot(slot)
        self._await_boot(slot)
        if self.slurm is not None:  # a rebooted node starts its services, as a real one does
            self.slurm.start_daemons(slot.host)

    def _tc(self, slot: _Slot, *args: str) -> list[subprocess.CompletedProcess[str]]:
        both = [["tc", *args[:2], "dev", slot.veth, *args[2:]]]
        both.append(["tc", "-n", slot.netns, *args[:2], "dev", "eth0", *args[2:]])
        return [subprocess.run(a, capture_output=True, text=True) for a in both]

    def cap_bandwidth(self, host: HostRef, rate: str = "1mbit") -> None:
        """Shape both directions of the host's link with tbf to `rate` (e.g. "1mbit")."""
        slot = self._live(host)
        for done in self._tc(
            slot,
            "qdisc",
            "replace",
            "root",
            "tbf",
            "rate",
            rate,
            "burst",
            "32kb",
            "latency",
            "400ms",
        ):
            if done.returncode != 0:
                raise LabError(f"tc failed on {slot.host.name}: {done.stderr.strip()}")

    def uncap_bandwidth(self, host: HostRef) -> None:
        slot = self._live(host)
        self._tc(slot, "qdisc", "del", "root")  # "no such qdisc" when not capped is fine

    @property
    def uplink(self) -> str:
        """The lab's (public) bridge as the root namespace sees it: this machine's way in."""
        return f"tfl{self.id}b"

    def cap_uplink(self, rate: str = "100mbit") -> None:
        """Shape what this machine sends into the lab to `rate`, like a controller's uplink.

        tbf on the bridge device's egress: only packets the root namespace sends into the bridge
        leave through it; frames from one host to another are forwarded between the bridge's
        ports and never pass it, and neither does what hosts send to this machine.
        """
        if self.stopped:
            raise LabError("the lab is stopped")
        argv = ["tc", "qdisc", "replace", "dev", self.uplink, "root", "tbf", "rate", rate]
        done = subprocess.run(
            [*argv, "burst", "64kb", "latency", "400ms"], capture_output=True, text=True
        )
        if done.returncode != 0:
            raise LabError(f"tc failed on {self.uplink}: {done.stderr.strip()}")

    def uncap_uplink(self) -> None:
        if self.stopped:
            return  # the bridge, and its qdisc, are gone
        argv = ["tc", "qdisc", "del", "dev", self.uplink, "root"]
        subprocess.run(argv, capture_output=True, text=True)  # not capped: nothing to delete

    def uplink_bytes(self) -> int:
        """tx_bytes of the bridge device: every byte (frames, headers included) sent into it."""
        return int(Path(f"/sys/class/net/{self.uplink}/statistics/tx_bytes").read_text())

    # -- teardown --------------------------------------------------------------------------------

    @property
    def ns_inodes(self) -> set[int]:
        """Namespace inodes of all hosts ever booted, for residue checks after stop."""
        return {s.pidns for s in self._slots.values() if s.pidns}

    def stop(self) -> None:
        """SIGKILL every host, delete namespaces, veths and bridges; wait until they are gone."""
        if self.stopped:
            return
        self.stopped = True
        cleanup.thaw_cgroups(self.id)  # a Slurm step frozen by proctrack/cgroup takes no SIGKILL
        # Killing each PID 1 kills its whole PID namespace; unshare then reaps it and exits, so
        # no zombie is left for the machine's init to collect (slowly) later.
        for slot in self._slots.values():
            if slot.init and not slot.crashed:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(slot.init, signal.SIGKILL)
        for slot in self._slots.values():
            if slot.proc is not None:
                try:
                    slot.proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    slot.proc.kill()
                    slot.proc.wait()
        cleanup.kill_in_netns([s.netns for s in self._slots.values()])
        inodes = self.ns_inodes
        wait_until(
            "lab processes to be gone",
            lambda: not any(procs.ns_inode(p, "pid") in inodes for p in procs.all_pids()),
        )
        cleanup.destroy(self.id, subnets=self._unreachable)


def _free_subnets(prefixes: list[int]) -> list[_Subnet]:
    """Subnets of 10.77.0.0/16 (one per prefix) that no route or address of this machine uses."""
    used = set()
    for args in (["ip", "-4", "route", "show", "table", "all"], ["ip", "-4", "addr"]):
        text = subprocess.run(args, capture_output=True, text=True).stdout
        used |= {int(m) for m in re.findall(r"\b10\.77\.(\d+)\.", text)}
    chosen: list[_Subnet] = []
    for prefix in prefixes:
        span = 1 << (24 - prefix)  # third octets the subnet covers
        free = [o for o in range(0, 256, span) if not any(o + k in used for k in range(span))]
        if not free:
            raise LabError(
                f"no free 10.77.X.0/{prefix} subnet left: stop old labs (python -m tests.lab down)"
            )
        net = _Subnet(random.choice(free), prefix)
        used |= set(range(net.base, net.base + span))
        chosen.append(net)
    return chosen
