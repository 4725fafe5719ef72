"""A second launching host source, `[lab]`: it "launches" lab hosts, and is one module.

A launch takes `count` lab hosts whose sshd it stops, and starts it again `boot_seconds` later
(a machine booting); each is reached through a delay proxy (`latency_ms` each way), so that an
SSH handshake costs real round trips, as to a far region. Its host keys come out of band (the
lab's own known_hosts, as EC2's console output), and the rest is the plumbing every launching
source shares (deployer/sources/launching.py): key pinning, the SSH wait, ending on failure,
ending what is due. Ending a machine gives the lab host back as it was: sshd up, no proxy.

    [lab]
    count = 4
    boot_seconds = 2.0          # sshd starts this long after the launch
    never_boot = ["h8"]         # these never start sshd (the wait must give up on them)
    latency_ms = 100
    timeout = 30                # the launch wait
    terminate_after = "down"
    tasks = [{ role = "worker" }]
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace

import paramiko

from deployer.config.inventory import make_host, parse_host_settings
from deployer.config.model import Host, HostSettings
from deployer.config.schema import Table
from deployer.config.sources import (
    ANY_TIME,
    Discovered,
    Provisioned,
    Say,
    SourceContext,
    Sourced,
    SourceReader,
)
from deployer.hosts.hostkeys import key_name
from deployer.sources import launching
from tests.lab import Lab, LabHost
from tests.lab.delay_proxy import DelayProxy


@dataclass
class LabCloud:
    """The lab hosts as machines to launch; remembers what it changed so `end` can undo it."""

    lab: Lab
    free: list[LabHost]
    proxies: dict[str, DelayProxy] = field(default_factory=dict)
    timers: dict[str, threading.Timer] = field(default_factory=dict)
    ended: list[str] = field(default_factory=list)

    def launch(self, count: int, boot_s: float, never: Sequence[str], delay_ms: float) -> list[str]:
        names = []
        for h in self.free[:count]:
            self.lab.kill_sshd(h)
            self.proxies[h.name] = DelayProxy((h.address, h.port), delay_ms / 1000)
            if h.name not in never:
                self.timers[h.name] = threading.Timer(boot_s, self.lab.start_sshd, args=(h,))
            names.append(h.name)
        del self.free[:count]
        for timer in self.timers.values():
            timer.start()  # all at once: the machines boot side by side
        return names

    def host(self, name: str, settings: HostSettings, key: str) -> Host:
        real = self.lab.host(name)
        address, port = self.proxies[name].address
        host = make_host(
            settings, name=name, address=address, tf_address=real.address, key=key, transport="ssh"
        )
        return replace(host, ssh=replace(host.ssh, port=port))

    def fingerprints(self, name: str) -> tuple[str, ...]:
        """The out-of-band channel: what the lab recorded when it made the host's key."""
        real = self.lab.host(name)
        keys = paramiko.HostKeys(str(self.lab.known_hosts)).lookup(
            key_name(real.address, real.port)
        )
        return tuple(k.fingerprint for k in (keys or {}).values())

    def end(self, names: Sequence[str]) -> None:
        for name in names:
            timer = self.timers.pop(name, None)
            if timer is not None:
                timer.cancel()
                timer.join()
            proxy = self.proxies.pop(name, None)
            if proxy is not None:
                proxy.stop()
            real = self.lab.host(name)
            if real.port not in self.lab.listening_ports(real):
                self.lab.start_sshd(real)
            self.ended.append(name)

    def end_all(self) -> None:
        self.end(list(self.proxies))


@dataclass(frozen=True)
class LabSource:
    """`[lab]` as a HostSource."""

    cloud: LabCloud
    settings: HostSettings
    count: int
    boot_s: float
    never: tuple[str, ...]
    latency_ms: float
    timeout: float
    terminate_after: str
    where: str  # the table's key path
    key: str = "lab"

    def discover(self, file: str, *, preview: bool = False) -> Discovered:
        names = [n for n in self.cloud.proxies if n not in self.cloud.ended]
        return Discovered(hosts=tuple(self._host(n) for n in names))

    def provision(self, file: str, say: Say, *, detach: bool = False) -> Provisioned:
        deadline = time.monotonic() + self.timeout
        with launching.ended_on_failure(self.cloud.end, say) as launched:
            launched += self.cloud.launch(self.count, self.boot_s, self.never, self.latency_ms)
            say(f"launched {', '.join(launched)}")
            hosts = tuple(self._host(n) for n in launched)
            launching.wait_for_ssh(hosts, deadline, say, poll=0.2, wait_name="lab.timeout")
        return Provisioned(Discovered(hosts=hosts))

    def _host(self, name: str) -> Host:
        host = self.cloud.host(name, self.settings, self.where)
        return launching.expecting(host, self.cloud.fingerprints(name))

    def replace(self, file: str, gone: Host, say: Say) -> Host | None:
        return None

    def terminate(self, when: tuple[str, ...], say: Say) -> None:
        def find(due: Sequence[LabSource]) -> list[str]:
            return [n for n in self.cloud.proxies if n not in self.cloud.ended]

        launching.end_due(when, [(self.terminate_after, self)], find, self.cloud.end, say)


def reader(cloud: LabCloud) -> SourceReader:
    """The `[lab]` reader over `cloud`, for `load_inventory(path, {"lab": lambda: reader(c)})`."""

    def read(t: Table, context: SourceContext) -> Sourced:
        source = LabSource(
            cloud=cloud,
            count=t.integer("count", 1, minimum=1, maximum=len(cloud.free)),
            boot_s=t.number("boot_seconds", 0.0),
            never=t.string_list("never_boot"),
            latency_ms=t.number("latency_ms", 0.0),
            timeout=t.number("timeout", 30.0, minimum=1),
            terminate_after=t.choice("terminate_after", ANY_TIME, "down"),
            settings=parse_host_settings(t, context),
            where=t.path,
        )
        t.finish()
        return Sourced(pending=source)

    return read


@contextlib.contextmanager
def lab_cloud(lab: Lab, hosts: Sequence[LabHost]) -> Iterator[LabCloud]:
    """A cloud of `hosts`, every machine ended (the lab host given back) when the block ends."""
    cloud = LabCloud(lab, list(hosts))
    try:
        yield cloud
    finally:
        cloud.end_all()
