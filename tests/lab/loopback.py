"""The fallback without root: one sshd per host on its own 127.0.0.x address, no isolation."""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from remote.protocol import HOST_ID_ENV
from tests.lab import cleanup, procs, sshconf
from tests.lab.base import HostRef, Lab, wait_until
from tests.lab.model import LabError, LabHost, Proc


def _free_port(address: str) -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return int(s.getsockname()[1])


class LoopbackLab(Lab):
    """Hosts share this machine's files, processes and hostname: only SSH itself is real."""

    isolated = False

    def __init__(self, *, lab_id: str, directory: Path, persistent: bool = False) -> None:
        self.persistent = persistent
        super().__init__(
            lab_id=lab_id, directory=directory, user=getpass.getuser(), python=sys.executable
        )

    def start(self, n: int, topology: str) -> None:
        if topology != "flat":
            raise self._unsupported(f"the {topology!r} topology")
        names = [f"h{i}" for i in range(1, n + 1)]
        owner = None
        if not self.persistent:
            owner = {"pid": os.getpid(), "start": cleanup.start_time(os.getpid())}
        (self.dir / "state.json").write_text(json.dumps({"id": self.id, "owner": owner}))
        sshconf.keygen_all([self.key_path] + [self.dir / h / "ssh_host_ed25519_key" for h in names])
        self.authorized_keys.write_text(Path(f"{self.key_path}.pub").read_text())
        hostname = socket.gethostname()
        known = []
        for i, name in enumerate(names):
            # Distinct 127.0.0.x per host (Linux routes all of 127/8 to lo) and a free port,
            # since a non-root sshd cannot bind port 22.
            address = f"127.0.{int(self.id[:2], 16)}.{11 + i}"
            host = LabHost(name, address, _free_port(address), hostname)
            d = self.dir / name
            (d / "sshd_config").write_text(
                sshconf.sshd_config(
                    host_key=d / "ssh_host_ed25519_key",
                    authorized_keys=self.authorized_keys,
                    pid_file=d / "sshd.pid",
                    listen=f"{address}:{host.port}",
                    allow_users=[self.user],
                    # One machine, so one computed host identity: the agent's override (the one
                    # remote/hostid.py has for several hosts on one machine) keeps each host's
                    # runs, leases and network-check listeners apart, like hosts on a shared home.
                    set_env=[self._mark(name).decode()],
                )
            )
            pub = (d / "ssh_host_ed25519_key.pub").read_text()
            known.append(sshconf.known_hosts_line(host, pub, alias=name))
            self.hosts.append(host)
        self.known_hosts.write_text("".join(known))
        self.ssh_config.write_text(
            sshconf.ssh_config(
                self.hosts, user=self.user, key=self.key_path, known_hosts=self.known_hosts
            )
        )
        for h in self.hosts:
            self.start_sshd(h)

    def _mark(self, name: str) -> bytes:
        """`TFDEPLOY_HOST_ID=<id>`: the host's own identity for its agent, in every session.

        Unique to this lab, so that `processes` and `stop` never reach another lab's processes.
        """
        return f"{HOST_ID_ENV}={self._host_id(name)}".encode()

    def _host_id(self, name: str) -> str:
        return f"{socket.gethostname()}-lab{self.id}-{name}"

    def _pid(self, h: LabHost) -> int | None:
        try:
            return int((self.dir / h.name / "sshd.pid").read_text())
        except (OSError, ValueError):
            return None

    def run(
        self, host: HostRef, cmd: Sequence[str] | str, timeout: float = 30
    ) -> subprocess.CompletedProcess[str]:
        """Runs on this machine itself: loopback hosts have nothing of their own to enter."""
        self.host(host)
        argv = ["/bin/sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)

    def processes(self, host: HostRef) -> list[Proc]:
        """The host's sshd and what runs under it, and what carries the host's identity in its
        environment (the agent's detached supervisors and their tasks, which SSH sessions
        start); a daemon that detached and dropped that variable escapes this view."""
        return procs.to_procs(self._raw_processes(self.host(host)), inner=False)

    def _raw_processes(self, h: LabHost) -> list[procs.RawProc]:
        return procs.descendants(self._pid(h) or -1, marked=self._mark(h.name))

    def listening_ports(self, host: HostRef) -> set[int]:
        """Ports bound to exactly the host's address (wildcard ones belong to the machine)."""
        return procs.listening("/proc/self/net", self.host(host).address)

    def _outer_pid(self, host: HostRef, pid: int) -> int:
        if pid not in {p.pid for p in self.processes(host)}:
            raise LabError(f"no process {pid} under {self.host(host).name}'s sshd")
        return pid

    def kill_sshd(self, host: HostRef) -> None:
        h = self.host(host)
        pid = self._pid(h)
        if pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        wait_until("sshd to stop listening", lambda: h.port not in self.listening_ports(h))

    def start_sshd(self, host: HostRef) -> None:
        h = self.host(host)
        d = self.dir / h.name
        argv = ["/usr/sbin/sshd", "-f", str(d / "sshd_config"), "-E", str(d / "sshd.log")]
        done = subprocess.run(argv, capture_output=True, text=True)
        if done.returncode != 0:
            raise LabError(f"sshd for {h.name} did not start: {done.stderr.strip()}")
        wait_until("sshd to listen", lambda: h.port in self.listening_ports(h))

    def stop(self) -> None:
        if self.stopped:
            return
        self.stopped = True
        for h in self.hosts:
            # Sessions and detached runs too, as a namespace host's end would: nothing else
            # would end them, and a later lab's hosts would find them holding ports.
            for p in reversed(self._raw_processes(h)):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGKILL)
            # What the host kept in the default workdir (a namespace host's home is a tmpfs).
            shutil.rmtree(Path.home() / ".tfdeploy" / "hosts" / self._host_id(h.name), True)
        shutil.rmtree(self.dir, ignore_errors=True)
