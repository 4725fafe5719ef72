"""What every lab offers, whichever way its hosts are made (namespaces or loopback sshd)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tests.lab.delay_proxy import DelayProxy
from tests.lab.inventory import render_inventory
from tests.lab.model import LabError, LabHost, LabUnsupported, Proc

if TYPE_CHECKING:
    from tests.lab.slurm import SlurmCluster

HostRef = LabHost | str


def wait_until(what: str, check: Any, timeout: float = 10.0, interval: float = 0.02) -> None:
    """Poll `check()` until it is true; a fault helper returns only once its effect is real."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise LabError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def is_sshd(p: Proc) -> bool:
    """The lab's own sshd: the listener and its per-connection children ("sshd: root@notty")."""
    return p.cmdline.startswith(("sshd:", "/usr/sbin/sshd"))


class Lab:
    """A set of SSH hosts for tests. Subclasses: NamespaceLab (root) and LoopbackLab."""

    isolated: bool = False
    # The Slurm cluster on the hosts of a lab started with `slurm=True` (namespace lab only).
    slurm: SlurmCluster | None = None

    def __init__(self, *, lab_id: str, directory: Path, user: str, python: str) -> None:
        self.id = lab_id
        self.dir = directory
        self.user = user
        # The unprivileged user hosts also accept (namespace lab); on loopback, `user` itself.
        self.login_user = user
        self.python = python
        self.hosts: list[LabHost] = []
        self.bastion: LabHost | None = None
        self.key_path = directory / "id_ed25519"
        self.known_hosts = directory / "known_hosts"
        self.ssh_config = directory / "ssh_config"
        self.authorized_keys = directory / "authorized_keys"
        self.stopped = False

    # -- lookup ---------------------------------------------------------------------------------

    @property
    def all_hosts(self) -> list[LabHost]:
        return self.hosts + ([self.bastion] if self.bastion else [])

    def host(self, ref: HostRef) -> LabHost:
        name = ref if isinstance(ref, str) else ref.name
        for h in self.all_hosts:
            if h.name == name:
                return h
        raise LabError(f"no lab host named {name!r} (have {[h.name for h in self.all_hosts]})")

    def reachable_from_root(self, ref: HostRef) -> bool:
        """Private hosts of the bastion topology can only be reached through the bastion."""
        return self.bastion is None or self.host(ref) == self.bastion

    # -- to be provided by each kind of lab ----------------------------------------------------

    def run(
        self, host: HostRef, cmd: Sequence[str] | str, timeout: float = 30
    ) -> subprocess.CompletedProcess[str]:
        raise NotImplementedError

    def processes(self, host: HostRef) -> list[Proc]:
        raise NotImplementedError

    def listening_ports(self, host: HostRef) -> set[int]:
        raise NotImplementedError

    def kill_sshd(self, host: HostRef) -> None:
        raise NotImplementedError

    def start_sshd(self, host: HostRef) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def _outer_pid(self, host: HostRef, pid: int) -> int:
        raise NotImplementedError

    def _unsupported(self, what: str) -> LabUnsupported:
        return LabUnsupported(
            f"{what} needs the namespace lab (root); the loopback fallback has none"
        )

    def cut_link(self, host: HostRef) -> None:
        raise self._unsupported("cut_link")

    def restore_link(self, host: HostRef) -> None:
        raise self._unsupported("restore_link")

    def cut_controller(self, host: HostRef) -> None:
        raise self._unsupported("cut_controller")

    def restore_controller(self, host: HostRef) -> None:
        raise self._unsupported("restore_controller")

    def crash_host(self, host: HostRef) -> None:
        raise self._unsupported("crash_host")

    def revive_host(self, host: HostRef) -> None:
        raise self._unsupported("revive_host")

    def cap_bandwidth(self, host: HostRef, rate: str = "1mbit") -> None:
        raise self._unsupported("cap_bandwidth")

    def uncap_bandwidth(self, host: HostRef) -> None:
        raise self._unsupported("uncap_bandwidth")

    def cap_uplink(self, rate: str = "100mbit") -> None:
        """Shape what this machine sends into the lab to `rate`; host-to-host traffic stays free."""
        raise self._unsupported("cap_uplink")

    def uncap_uplink(self) -> None:
        raise self._unsupported("uncap_uplink")

    def uplink_bytes(self) -> int:
        """Bytes this machine has sent into the lab so far (a counter: take differences)."""
        raise self._unsupported("uplink_bytes")

    def shared_home(self) -> contextlib.AbstractContextManager[Path]:
        """One directory as the login user's home on every host (see NamespaceLab)."""
        raise self._unsupported("shared_home")

    # -- TF ports -------------------------------------------------------------------------------

    # Ports of a host's TF tasks in the inventories the lab writes: tasks take port, port+1, ...
    TF_PORTS_PER_HOST = 16

    def tf_port(self, host: HostRef, base: int = 2222) -> int:
        """The first TF port of `host` in inventories this lab writes with job port `base`.

        Each namespace host has a network stack of its own, so every host serves on `base`, as
        on a real fleet. Loopback hosts share this machine's one stack, where two TF servers
        cannot both listen on one port (they bind every address): each host gets a block of its
        own, `base + index * TF_PORTS_PER_HOST`.
        """
        if self.isolated:
            return base
        return base + self.all_hosts.index(self.host(host)) * self.TF_PORTS_PER_HOST

    def _tf_ports(
        self,
        hosts: Sequence[LabHost],
        tasks: Sequence[Sequence[Mapping[str, Any]]],
        base: int,
        per_host: Mapping[str, Mapping[str, Any]] | None,
    ) -> dict[str, dict[str, Any]]:
        """`per_host` with each host's own `port` added where the stack is shared (loopback)."""
        merged = {name: dict(extra) for name, extra in (per_host or {}).items()}
        if self.isolated:
            return merged
        for host, host_tasks in zip(hosts, tasks, strict=False):
            count = sum(int(t.get("count", 1)) for t in host_tasks)
            if count > self.TF_PORTS_PER_HOST:
                raise LabError(
                    f"{host.name} has {count} tasks; a loopback host has "
                    f"{self.TF_PORTS_PER_HOST} TF ports"
                )
            merged.setdefault(host.name, {}).setdefault("port", self.tf_port(host, base))
        return merged

    # -- shared behaviour ------------------------------------------------------------------------

    def _proc_state(self, outer: int) -> str:
        try:
            stat = Path(f"/proc/{outer}/stat").read_text()
        except OSError:
            return "gone"
        return stat[stat.rindex(")") + 2]

    def freeze(self, host: HostRef, pid: int) -> None:
        """SIGSTOP a process of the host (`pid` as the host sees it); returns once it is stopped."""
        outer = self._outer_pid(host, pid)
        os.kill(outer, signal.SIGSTOP)
        wait_until(f"pid {pid} to stop", lambda: self._proc_state(outer) in ("T", "t", "gone"))

    def thaw(self, host: HostRef, pid: int) -> None:
        """SIGCONT a frozen process; returns once it is no longer stopped."""
        outer = self._outer_pid(host, pid)
        os.kill(outer, signal.SIGCONT)
        wait_until(f"pid {pid} to continue", lambda: self._proc_state(outer) not in ("T", "t"))

    @contextlib.contextmanager
    def latency(self, host: HostRef, ms: float) -> Iterator[tuple[str, int]]:
        """A delay proxy to the host's sshd with `ms` added each way; yields (address, port)."""
        with self.latency_proxy(host, ms) as proxy:
            yield proxy.address

    @contextlib.contextmanager
    def latency_proxy(self, host: HostRef, ms: float) -> Iterator[DelayProxy]:
        """Like `latency`, yielding the proxy itself: its `address` and its count of `turns`."""
        h = self.host(host)
        if not self.reachable_from_root(h):
            raise LabError(f"{h.name} is private: add latency to the bastion instead")
        proxy = DelayProxy((h.address, h.port), ms / 1000)
        try:
            yield proxy
        finally:
            proxy.stop()

    def leftovers(self, host: HostRef, settle: float = 2.0) -> list[str]:
        """What runs or listens on the host besides its init and sshd; [] means clean.

        Waits up to `settle` seconds for it to become clean, because a process of a job that just
        ended may take a moment to exit; anything still there after that is reported.
        """
        deadline = time.monotonic() + settle
        while True:
            found = self._leftovers_now(self.host(host))
            if not found or time.monotonic() > deadline:
                return found
            time.sleep(0.05)

    def leftovers_of(self, hosts: Sequence[HostRef], settle: float = 2.0) -> dict[str, list[str]]:
        """`leftovers` of several hosts at once, by name, only those with any: each pass reads
        the processes of all of them together (the check after every lab test), and waits up to
        `settle` seconds for the ones not yet clean."""
        pending = [self.host(h) for h in hosts]
        deadline = time.monotonic() + settle
        while True:
            found = self._leftovers_batch(pending)
            pending = [h for h in pending if found[h.name]]
            if not pending or time.monotonic() > deadline:
                return {h.name: found[h.name] for h in pending}
            time.sleep(0.05)

    def _leftovers_batch(self, hosts: Sequence[LabHost]) -> dict[str, list[str]]:
        return {h.name: self._leftovers_now(h) for h in hosts}

    def _leftovers_now(self, h: LabHost) -> list[str]:
        return self._leftovers_in(h, self.processes(h))

    def _leftovers_in(self, h: LabHost, processes: Sequence[Proc]) -> list[str]:
        found = [
            f"process {p.pid} ({p.user}, state {p.state}): {p.cmdline}"
            for p in processes
            if not (self._is_init(p) or self._is_service(p))
        ]
        ports = self.listening_ports(h) - {h.port} - self._service_ports(h)
        found += [f"listening port {port}" for port in sorted(ports)]
        return found

    def _is_init(self, p: Proc) -> bool:
        return False

    def _is_service(self, p: Proc) -> bool:
        """A daemon the host runs for everyone (sshd; a Slurm lab's daemons), not a leftover."""
        return is_sshd(p)

    def _service_ports(self, h: LabHost) -> set[int]:
        return set()

    def kill_leftovers(self, host: HostRef) -> list[str]:
        """`leftovers(host)`, then SIGKILL each process found; returns what was found.

        For a test that must report leftovers itself and still leave the host clean.
        """
        h = self.host(host)
        found = self.leftovers(h)
        for p in self.processes(h):
            if not (self._is_init(p) or self._is_service(p)):
                with contextlib.suppress(LabError, ProcessLookupError):
                    os.kill(self._outer_pid(h, p.pid), signal.SIGKILL)
        return found

    def write_inventory(
        self,
        path: str | os.PathLike[str],
        *,
        tasks: Sequence[Sequence[Mapping[str, Any]]],
        job: Mapping[str, Any] | None = None,
        ssh: Mapping[str, Any] | None = None,
        hosts: Sequence[LabHost] | None = None,
        user: str | None = None,
        per_host: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> Path:
        """Write a tfdeploy inventory for (some of) the lab hosts; `job` must give `code`.

        `user` logs in as someone else than `self.user` (e.g. `self.login_user`, also through
        the bastion); `per_host` adds keys to a host's entry by name: {"h1": {"python": ...}}.
        On loopback each host also gets its own `port` (see `tf_port`) unless `per_host` sets it.
        """
        chosen = list(hosts) if hosts is not None else self.hosts[: len(tasks)]
        if len(chosen) < len(tasks):
            raise LabError(f"{len(tasks)} task lists but the lab has only {len(chosen)} hosts")
        job_table: dict[str, Any] = {
            "name": "labjob",
            "code": None,
            "command": "python3 train.py",
            "python": self.python,
            "workdir": "~/.tfdeploy",
            "port": 2222,
        }
        job_table.update(job or {})
        if job_table["code"] is None:
            raise LabError("write_inventory needs job={'code': <path of the code to deploy>}")
        user = user or self.user
        ssh_table: dict[str, Any] = {
            "user": user,
            "identity": str(self.key_path),
            "known_hosts": str(self.known_hosts),
            "host_keys": "strict",
            "connect_timeout": 5,
        }
        if self.bastion is not None:
            ssh_table["jump"] = f"{user}@{self.bastion.address}:{self.bastion.port}"
        ssh_table.update(ssh or {})
        out = Path(path)
        per_host = self._tf_ports(chosen, tasks, int(job_table["port"]), per_host)
        text = render_inventory(
            job=job_table, ssh=ssh_table, hosts=chosen, tasks=tasks, per_host=per_host
        )
        out.write_text(text)
        return out

    def ssh_argv(self, host: HostRef, *command: str, user: str | None = None) -> list[str]:
        """`ssh -F <lab ssh_config> <name> command...`: plain OpenSSH with the lab's files only.

        `user` logs in as someone else than the config's user (e.g. `self.login_user`).
        """
        login = ["-l", user] if user else []
        return ["ssh", "-F", str(self.ssh_config), *login, self.host(host).name, *command]

    def __enter__(self) -> Lab:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
