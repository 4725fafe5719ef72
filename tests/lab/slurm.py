"""A real Slurm cluster on namespace lab hosts: h1 is the login node, the others compute nodes.

Debian's slurmctld/slurmd 22.05 and munge run inside the hosts (facts: /work/shared notes and
docs/testing.md). Everything they write (configuration, munge key and socket, state, spool, pid
and log files, fake GPU devices) lives in `<lab dir>/slurm/`, so the lab's own teardown (kill every
process of its namespaces, delete its directory) leaves nothing of the cluster behind.

Each host sees the configuration folder on `/etc/slurm`, the one munge socket's folder on
`/run/munge` and the lab's hosts file on `/etc/hosts` (bind mounts in its own mount namespace):
`squeue`, `sbatch`, `srun` and `scontrol` run on the login node with no variable, as on a cluster.

Process tracking is `proctrack/cgroup` + `task/cgroup` (`ConstrainCores`) by default, as
production clusters run, or with `proctrack="linuxproc"` no cgroups. With cgroups each compute
node mounts its own cgroup v1 subtree of this machine's hierarchies (`make_cgroups`,
`boot_lines`), which the lab's teardown removes once the hosts are gone
(`cleanup.remove_cgroups`).

With `adopt` (on the cgroup configuration only) the compute nodes' sshd admits a session only
through Debian's `pam_slurm_adopt`, as on clusters that refuse SSH to a node without a job:
`PrologFlags=contain` (each job's `extern` step), `UsePAM yes` in those hosts' sshd_config and
the lab's own PAM stack bind-mounted over `/etc/pam.d/sshd` inside each compute host only
(`PAM_SSHD`). The module never acts on root (it ignores root), so root still logs in and the
lab's non-root user (`lab.login_user`) is the one it admits only while a job of theirs runs on
the node, its session then adopted into that job's `step_extern`.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shlex
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tests.lab import cleanup
from tests.lab.model import LabError, LabHost, Proc

if TYPE_CHECKING:
    from tests.lab.netns import NamespaceLab

NODE_CPUS = 2
NODE_GPUS = 2
NODE_MEMORY_MB = 1024
# Short, so node-failure tests end quickly: slurmctld pings every SlurmdTimeout/3 and marks a
# silent node DOWN once SlurmdTimeout has passed since its last answer.
SLURMD_TIMEOUT = 10
KILL_WAIT = 5  # seconds between SIGTERM and SIGKILL of a cancelled job's processes
PARTITIONS = (("debug", 1), ("urgent", 10))  # (name, PriorityTier): urgent preempts debug
DAEMONS = ("/usr/sbin/munged", "/usr/sbin/slurmctld", "/usr/sbin/slurmd")
PORTS = frozenset({6817, 6818})  # slurmctld, slurmd
MUNGE_SOCKET = "/run/munge/munge.socket.2"
# Process tracking: "linuxproc" (the default: no cgroups, a double-forked child escapes its
# step) or "cgroup" (proctrack/cgroup + task/cgroup, as most production clusters run: what a
# step started dies when the step ends).
PROCTRACKS = ("linuxproc", "cgroup")
# The cgroup v1 controllers each compute host gets a subtree of (`cgroup` only): freezer for
# proctrack/cgroup, cpuset, memory and devices for task/cgroup, the others as a node has them.
CGROUP_CONTROLLERS = ("freezer", "cpuset", "memory", "devices", "cpuacct", "cpu", "pids")
# Debian's libpam-slurm-adopt puts the module outside PAM's default folder: named by full path.
PAM_SLURM_ADOPT = "/lib/security/pam_slurm_adopt.so"
# The compute nodes' /etc/pam.d/sshd with `adopt`. sshd checked the key already (pubkey, no PAM
# auth); the account stack decides: pam_slurm_adopt denies a user with no job on the node and
# admits one with a job (adopting the session into it); for root it answers PAM_IGNORE (it never
# acts on root), so pam_permit's success admits root, as an admin's login on a real cluster.
PAM_SSHD = f"""auth required pam_permit.so
account required {PAM_SLURM_ADOPT} action_no_jobs=deny
account required pam_permit.so
session required pam_permit.so
"""


def missing(proctrack: str = "cgroup", adopt: bool = False) -> str | None:
    """Why a Slurm lab cannot start here, or None: the daemons must be installed (and, for
    proctrack/cgroup, this machine must have the cgroup v1 hierarchies; for `adopt`, Debian's
    libpam-slurm-adopt must be installed)."""
    if proctrack not in PROCTRACKS:
        raise LabError(f"unknown Slurm process tracking {proctrack!r}: use one of {PROCTRACKS}")
    if adopt and proctrack != "cgroup":
        raise LabError("pam_slurm_adopt needs proctrack/cgroup: give proctrack='cgroup' too")
    absent = [d for d in DAEMONS if not os.access(d, os.X_OK)]
    absent += [c for c in ("/usr/bin/sbatch", "/usr/bin/squeue") if not os.access(c, os.X_OK)]
    if absent:
        return (
            f"Slurm is not installed ({', '.join(absent)} missing): run scripts/install.sh as root "
            "(Debian packages slurmctld slurmd slurm-client munge)"
        )
    if os.geteuid() != 0:
        return "a Slurm lab needs the namespace lab (root)"
    if proctrack == "cgroup":
        absent = [c for c in CGROUP_CONTROLLERS if not _is_v1_hierarchy(cleanup.CGROUP_ROOT / c)]
        if absent:
            return (
                "a Slurm lab with proctrack/cgroup needs this machine's cgroup v1 hierarchies "
                f"under {cleanup.CGROUP_ROOT} (missing: {', '.join(absent)})"
            )
    if adopt and not os.path.isfile(PAM_SLURM_ADOPT):
        return (
            f"a Slurm lab with pam_slurm_adopt needs {PAM_SLURM_ADOPT}: run scripts/install.sh "
            "as root (Debian package libpam-slurm-adopt)"
        )
    return None


def _is_v1_hierarchy(path: Path) -> bool:
    """A mounted cgroup v1 hierarchy of one controller (its `tasks` file is there)."""
    return (path / "tasks").is_file() and (path / "cgroup.procs").is_file()


def is_daemon(p: Proc) -> bool:
    """The cluster's own daemons (services of the host, like sshd), not processes of a job."""
    return p.cmdline.split(" ", 1)[0] in DAEMONS or p.cmdline.startswith(
        ("munged", "slurmctld", "slurmd")
    )


@dataclass(frozen=True)
class Job:
    """One line of `squeue -h -o '%i %T %r %N'`: id, state, reason and nodes (may be empty)."""

    id: str
    state: str
    reason: str
    nodes: str


class SlurmCluster:
    """The Slurm side of a NamespaceLab started with `slurm=True` (`lab.slurm`)."""

    def __init__(self, lab: NamespaceLab, proctrack: str = "cgroup", adopt: bool = False) -> None:
        if proctrack not in PROCTRACKS:
            raise LabError(f"unknown Slurm process tracking {proctrack!r}: use one of {PROCTRACKS}")
        if adopt and proctrack != "cgroup":
            raise LabError("pam_slurm_adopt needs proctrack/cgroup: give proctrack='cgroup' too")
        self.lab = lab
        self.proctrack = proctrack
        # The compute nodes' sshd behind pam_slurm_adopt (module docstring).
        self.adopt = adopt
        self.dir = lab.dir / "slurm"
        self.conf_dir = self.dir / "etc"
        self.munge_dir = self.dir / "munge"
        self.dev_dir = self.dir / "dev"
        # Where job scripts and their output go: every host sees /var/tmp (not /tmp or /root).
        self.shared = self.dir / "shared"

    # -- hosts ---------------------------------------------------------------------------------

    @property
    def login(self) -> LabHost:
        return self.lab.hosts[0]

    @property
    def nodes(self) -> list[LabHost]:
        return self.lab.hosts[1:]

    def node(self, name: str) -> LabHost:
        return self.lab.host(name)

    def uses_pam(self, host: LabHost) -> bool:
        """The host's sshd runs PAM (`UsePAM yes`): a compute node of an `adopt` lab."""
        return self.adopt and host != self.login

    # -- files (before the hosts boot) ---------------------------------------------------------

    def write_files(self) -> None:
        """Configuration, munge key, hosts file and fake GPUs, all under the lab directory."""
        if len(self.lab.hosts) < 2:
            raise LabError("a Slurm lab needs a login node and at least one compute node")
        for d in (self.conf_dir, self.munge_dir, self.dev_dir, self.shared, self.dir / "state"):
            d.mkdir(parents=True, exist_ok=True)
        self.dir.chmod(0o755)
        self.shared.chmod(0o1777)
        self.munge_dir.chmod(0o755)  # clients connect to the socket in it
        for h in self.nodes:
            (self.dir / "spool" / h.name).mkdir(parents=True, exist_ok=True)
        key = self.dir / "munge.key"
        key.write_bytes(secrets.token_bytes(128))
        key.chmod(0o600)
        for i in range(NODE_GPUS):
            dev = self.dev_dir / f"nvidia{i}"
            if not dev.exists():  # /dev/null's numbers: a character device that costs nothing
                os.mknod(dev, 0o666 | 0o020000, os.makedev(1, 3))
                dev.chmod(0o666)
        (self.conf_dir / "slurm.conf").write_text(self.slurm_conf())
        (self.conf_dir / "gres.conf").write_text(
            f"Name=gpu File={self.dev_dir}/nvidia[0-{NODE_GPUS - 1}]\n"
        )
        # slurmd 22.05 initialises a cgroup plugin even with proctrack/linuxproc; v1 without
        # automount passes inside a host, whose /sys/fs/cgroup is empty. With proctrack/cgroup
        # each compute host mounts its own subtrees there at boot (`boot_lines`).
        cgroup_conf = "CgroupPlugin=cgroup/v1\nCgroupAutomount=no\n"
        if self.proctrack == "cgroup":
            # As production: a step's processes bound to the CPUs the job was given there.
            cgroup_conf += "CgroupMountpoint=/sys/fs/cgroup\nConstrainCores=yes\n"
            self.make_cgroups()
        (self.conf_dir / "cgroup.conf").write_text(cgroup_conf)
        (self.conf_dir / "plugstack.conf").write_text("")
        if self.adopt:
            (self.dir / "pam.d-sshd").write_text(PAM_SSHD)
        hosts = ["127.0.0.1 localhost", "::1 localhost ip6-localhost ip6-loopback"]
        hosts += [f"{h.address} {h.name} {h.hostname}" for h in self.lab.hosts]
        (self.dir / "hosts").write_text("\n".join(hosts) + "\n")
        Path("/run/munge").mkdir(parents=True, exist_ok=True)  # the mount point hosts bind over

    def slurm_conf(self) -> str:
        d = self.dir
        lines = [
            f"ClusterName=lab{self.lab.id}",
            # slurmctld only starts on the host whose hostname this names.
            f"SlurmctldHost={self.login.hostname}({self.login.address})",
            "MailProg=/bin/true",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            # The same socket seen from outside the hosts (SLURM_CONF=... squeue on the machine).
            f"AuthInfo=socket={self.munge_dir}/munge.socket.2",
            f"StateSaveLocation={d}/state",
            f"SlurmdSpoolDir={d}/spool/%n",
            f"SlurmctldPidFile={d}/slurmctld.pid",
            f"SlurmdPidFile={d}/slurmd-%n.pid",
            f"SlurmctldLogFile={d}/slurmctld.log",
            f"SlurmdLogFile={d}/slurmd-%n.log",
            *(
                ["ProctrackType=proctrack/cgroup", "TaskPlugin=task/cgroup"]
                if self.proctrack == "cgroup"
                else ["ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none"]
            ),
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/filetxt",
            f"JobCompLoc={d}/jobcomp.txt",
            "SchedulerType=sched/backfill",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "GresTypes=gpu",
            "ReturnToService=2",
            f"SlurmdTimeout={SLURMD_TIMEOUT}",
            f"KillWait={KILL_WAIT}",
            "InactiveLimit=0",
            "MpiDefault=none",
            "PreemptType=preempt/partition_prio",
            "PreemptMode=REQUEUE",
            # Each job gets an `extern` step on its nodes at allocation: pam_slurm_adopt puts
            # an admitted SSH session into it.
            *(["PrologFlags=contain"] if self.adopt else []),
        ]
        for h in self.nodes:
            lines.append(
                f"NodeName={h.name} NodeAddr={h.address} NodeHostname={h.hostname} "
                f"CPUs={NODE_CPUS} RealMemory={NODE_MEMORY_MB} Gres=gpu:{NODE_GPUS} State=UNKNOWN"
            )
        names = "ALL"
        for i, (name, tier) in enumerate(PARTITIONS):
            default = "YES" if i == 0 else "NO"
            lines.append(
                f"PartitionName={name} Nodes={names} Default={default} PriorityTier={tier} "
                "MaxTime=INFINITE State=UP"
            )
        return "\n".join(lines) + "\n"

    def cgroup_name(self, host: LabHost) -> str:
        """The host's subtree at the top of each cgroup v1 hierarchy (cleanup finds it by it)."""
        return f"{cleanup.DIR_PREFIX}{self.lab.id}-{host.name}"

    def make_cgroups(self) -> None:
        """A cgroup v1 subtree per compute host and controller on this machine's hierarchies, so
        two slurmds never share a `slurm_<node>/uid_0/job_N/step_M` path. `cleanup.destroy`
        (the lab's teardown) removes them, depth first."""
        for h in self.nodes:
            for c in CGROUP_CONTROLLERS:
                d = cleanup.CGROUP_ROOT / c / self.cgroup_name(h)
                d.mkdir(exist_ok=True)
                if c == "cpuset":  # an empty cpuset takes no task: the parent's CPUs and nodes
                    for f in ("cpuset.cpus", "cpuset.mems"):
                        (d / f).write_text((d.parent / f).read_text())

    def boot_lines(self, host: LabHost) -> list[str]:
        """Shell lines a host runs at boot: the cluster's folders and hosts file mounted, and
        with proctrack/cgroup on a compute node its own cgroup subtrees on /sys/fs/cgroup/<c>
        (each hierarchy mounted on a scratch folder of the host's private /tmp, its subtree
        bind-mounted, the scratch mount dropped); with `adopt`, the lab's PAM stack over a
        compute node's /etc/pam.d/sshd (before its sshd starts)."""
        q = shlex.quote
        lines = [
            f"mount --bind {q(str(self.conf_dir))} /etc/slurm",
            f"mount --bind {q(str(self.munge_dir))} /run/munge",
            f"mount --bind {q(str(self.dir / 'hosts'))} /etc/hosts",
        ]
        if self.proctrack == "cgroup" and host != self.login:
            scratch = "/tmp/.lab-cgroot"
            lines += ["mount -t tmpfs -o mode=0755 cgroup_root /sys/fs/cgroup", f"mkdir {scratch}"]
            for c in CGROUP_CONTROLLERS:
                lines += [
                    f"mkdir /sys/fs/cgroup/{c}",
                    f"mount -t cgroup -o {c} cgroup {scratch}",
                    f"mount --bind {scratch}/{q(self.cgroup_name(host))} /sys/fs/cgroup/{c}",
                    f"umount {scratch}",
                ]
            lines.append(f"rmdir {scratch}")
        if self.uses_pam(host):  # this host's mount namespace only: the machine's file stays
            lines.append(f"mount --bind {q(str(self.dir / 'pam.d-sshd'))} /etc/pam.d/sshd")
        return lines

    # -- daemons -------------------------------------------------------------------------------

    def start(self) -> None:
        """munged and slurmctld on the login node, slurmd on every compute node; returns once
        every node is idle."""
        self.start_daemons(self.login)
        for h in self.nodes:
            self.start_daemons(h)
        self.wait_nodes("idle", timeout=30)

    def start_daemons(self, host: LabHost | str) -> None:
        """What a host starts at boot: munged + slurmctld (login node) or slurmd (compute)."""
        h = self.lab.host(host)
        if h == self.login:
            self._start_munged()
            self._daemon(h, "slurmctld", ["/usr/sbin/slurmctld", "-i"])
            self._wait(
                "slurmctld to answer", lambda: self.login_run("scontrol ping").returncode == 0
            )
        else:
            self.start_slurmd(h)

    def _start_munged(self) -> None:
        d = self.dir
        argv = [
            "/usr/sbin/munged",
            "--force",  # runs as root with the key under /var/tmp (sticky, world-writable)
            f"--socket={MUNGE_SOCKET}",
            f"--key-file={d}/munge.key",
            f"--pid-file={d}/munged.pid",
            f"--log-file={d}/munged.log",
            f"--seed-file={d}/munged.seed",
            "--origin=eth0",
        ]
        self._daemon(self.login, "munged", argv)
        sock = self.munge_dir / "munge.socket.2"
        self._wait("munged's socket", sock.exists)

    def start_slurmd(self, host: LabHost | str) -> None:
        """Start the node's slurmd (again): returns once slurmctld sees the node answer."""
        h = self.lab.host(host)
        self._daemon(h, "slurmd", ["/usr/sbin/slurmd", "-N", h.name])
        self._wait(f"slurmd on {h.name} to listen", lambda: 6818 in self.lab.listening_ports(h), 15)

    def kill_slurmd(self, host: LabHost | str) -> None:
        """SIGKILL the node's slurmd (a node failure as Slurm sees it); its jobs' steps live on."""
        h = self.lab.host(host)
        pids = [p.pid for p in self.lab.processes(h) if p.cmdline.startswith("/usr/sbin/slurmd")]
        if not pids:
            raise LabError(f"no slurmd runs on {h.name}")
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, LabError):
                os.kill(self.lab._outer_pid(h, pid), 9)
        self._wait(f"slurmd on {h.name} to die", lambda: 6818 not in self.lab.listening_ports(h))

    def _daemon(self, host: LabHost, name: str, argv: Sequence[str]) -> None:
        # The daemons fork into the background themselves; their stdio goes to a log file so
        # that `lab.run` (which waits for its pipes to close) returns.
        log = self.dir / f"{name}-{host.name}.out"
        cmd = f"{shlex.join(argv)} </dev/null >>{shlex.quote(str(log))} 2>&1"
        done = self.lab.run(host, cmd, timeout=30)
        if done.returncode != 0:
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise LabError(f"{name} did not start on {host.name} (exit {done.returncode}):\n{tail}")

    def _wait(self, what: str, check: Callable[[], bool], timeout: float = 15) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            if time.monotonic() > deadline:
                said = f"timed out after {timeout:.0f}s waiting for {what}"
                raise LabError(f"{said}{self._state()}{self._logs()}")
            time.sleep(0.05)

    def _state(self) -> str:
        """What slurmctld says of the nodes, jobs and steps, for a wait that timed out."""
        asked = (
            "sinfo -N -o '%N %P %T %C %E'; squeue -a -t all -o '%i %T %j %r %M %N'; "
            "scontrol show node | grep -E 'NodeName|State|Alloc|Reason'; scontrol show step"
        )
        done = self.login_run(asked, timeout=30)
        return f"\n--- the cluster's state:\n{done.stdout}{done.stderr}"

    def _logs(self) -> str:
        tails = []
        for log in sorted(self.dir.glob("*.log")) + sorted(self.dir.glob("*.out")):
            text = log.read_text(errors="replace").strip()
            if text:
                tails.append(f"--- {log.name}:\n{text[-1200:]}")
        return ("\n" + "\n".join(tails)) if tails else ""

    # -- commands on the login node ------------------------------------------------------------

    def login_run(self, cmd: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        """A shell command on the login node as root (`squeue`, `sbatch`, `scontrol`, `srun`)."""
        return self.lab.run(self.login, cmd, timeout=timeout)

    def login_popen(self, cmd: str) -> subprocess.Popen[str]:
        """A shell command on the login node with pipes (e.g. an `srun` step to talk to)."""
        return self.lab.popen(self.login, cmd)

    def check(self, cmd: str, timeout: float = 30) -> str:
        """`login_run` that must succeed; returns its stdout."""
        done = self.login_run(cmd, timeout=timeout)
        if done.returncode != 0:
            raise LabError(f"{cmd!r} on the login node failed ({done.returncode}): {done.stderr}")
        return done.stdout

    def sbatch(self, args: str) -> str:
        """`sbatch --parsable ARGS`; returns the job id."""
        out = self.check(f"sbatch --parsable {args}").strip()
        return out.split(";", 1)[0]

    def jobs(self) -> list[Job]:
        """Every job squeue lists (pending, running, completing...), in its plain format."""
        out = self.check("squeue -h -o '%i %T %r %N'")
        found = []
        for line in out.splitlines():
            parts = line.split(None, 3)
            if len(parts) < 3:
                raise LabError(f"unexpected squeue line {line!r}")
            found.append(Job(parts[0], parts[1], parts[2], parts[3] if len(parts) > 3 else ""))
        return found

    def job_field(self, job_id: str, field: str) -> str:
        """One `Key=value` of `scontrol show job -o J` (e.g. JobState, Reason, Restarts)."""
        out = self.check(f"scontrol show job -o {shlex.quote(job_id)}")
        m = re.search(rf"(?:^|\s){re.escape(field)}=(\S*)", out)
        if m is None:
            raise LabError(f"scontrol show job {job_id} has no {field}: {out}")
        return m[1]

    def job_state(self, job_id: str) -> str:
        return self.job_field(job_id, "JobState")

    def wait_job(self, job_id: str, *states: str, timeout: float = 60) -> str:
        """Poll until the job is in one of `states` (e.g. "RUNNING"); returns the state."""
        seen: list[str] = []

        def reached() -> bool:
            state = self.job_state(job_id)
            if not seen or seen[-1] != state:
                seen.append(state)
            return state in states

        try:
            self._wait(f"job {job_id} to be {'/'.join(states)}", reached, timeout)
        except LabError as e:
            raise LabError(f"{e}\nstates seen: {' -> '.join(seen)}") from None
        return seen[-1]

    def node_state(self, name: str) -> str:
        """One node's state (idle, allocated, mixed, down*...) from `sinfo -h -N -o '%N %T'`.

        Never `sinfo -n NODE`: Slurm 22.05 answers a one-node query from slurmctld's cached
        allocation counts, which only a query of every node refreshes, so after a job ended it
        said "mixed" for minutes while `sinfo -N` and `scontrol show node` said idle (the lab's
        Slurm tests then waited out their bound). sinfo prints a node once per partition it is
        in; the states agree.
        """
        out = self.check("sinfo -h -N -o '%N %T'")
        states = sorted({state for node, state in _pairs(out) if node == name})
        return ",".join(states)

    def wait_nodes(self, state: str, timeout: float = 30, names: Sequence[str] = ()) -> None:
        """Poll until each node (default: all) is in `state` (e.g. "idle", "down*")."""
        chosen = list(names) or [h.name for h in self.nodes]
        self._wait(
            f"nodes {','.join(chosen)} to be {state}",
            lambda: all(self.node_state(n) == state for n in chosen),
            timeout,
        )

    def start_requeued(self, job_id: str, timeout: float = 120) -> None:
        """Start a requeued job now, as an admin's nudge (`StartTime=now`) does, once it can
        start: every node has let go of its earlier run (idle), and the second in which their
        slurmds revoked its credential has passed. slurmd compares a credential's time with the
        revocation in whole seconds, so one made in the same second is refused ("Killing
        non-startable batch JobId=N: Job credential revoked", the job FAILED at 0:00): the
        reason Slurm itself holds a requeued job back (BeginTime, ~2 minutes)."""
        self.wait_nodes("idle", timeout=timeout)
        revoked_by = int(time.time())
        self._wait("the revocation's second to pass", lambda: time.time() >= revoked_by + 1, 5)
        self.check(f"scontrol update JobId={job_id} StartTime=now")

    def cancel_all(self) -> None:
        """scancel every job (root's and the lab's login user's, whose jobs an `adopt` lab
        runs), and wait until squeue is empty and nodes are idle again."""
        self.login_run("scancel --full --user=root")
        if self.lab.login_user != "root":
            self.login_run(f"scancel --full --user={shlex.quote(self.lab.login_user)}")
        self._wait("squeue to be empty", lambda: not self.jobs(), KILL_WAIT * 3 + 10)

    def heal(self) -> None:
        """Every compute node back to idle: slurmd restarted where it is not running, DOWN nodes
        resumed. For fixtures after a test that killed a node."""
        for h in self.nodes:
            if 6818 not in self.lab.listening_ports(h):
                self.start_slurmd(h)
        for h in self.nodes:
            if "down" in self.node_state(h.name) or "drain" in self.node_state(h.name):
                self.login_run(f"scontrol update NodeName={h.name} State=RESUME")
        self.wait_nodes("idle", timeout=SLURMD_TIMEOUT * 3 + 10)

    # -- what Slurm's own tools say, for the parsers tfdeploy has of them ----------------------

    def hostnames(self, expressions: Sequence[str]) -> list[list[str] | None]:
        """`scontrol show hostnames EXPR` on the login node for each expression, in one shell:
        the names Slurm expands it to, or None where Slurm refuses it."""
        # It exits 0 either way; a refusal says "Invalid hostlist" (on stderr).
        script = "".join(
            f"echo '<<<'; scontrol show hostnames {shlex.quote(e)} 2>&1\n" for e in expressions
        )
        out = self.check(script + "true\n", timeout=120)
        found: list[list[str] | None] = []
        for block in out.split("<<<\n")[1:]:
            refused = "Invalid hostlist" in block or "error:" in block
            found.append(None if refused else block.split())
        if len(found) != len(expressions):
            raise LabError(f"scontrol show hostnames: {len(found)} answers to {len(expressions)}")
        return found

    def sbatch_long_options(self) -> dict[str, str]:
        """sbatch's long options as its getopt_long reads them, each with its argument
        ("required", "none", "optional"): the names `sbatch --help`/`--usage` print and those
        getopt_long lists for every one- and two-character prefix, then each name's argument
        from getopt_long's own words. deployer/sources/slurm/sbatch_options.py is this table."""
        names = set(
            re.findall(r"--([a-z][a-z0-9_-]*)", self.check("sbatch --help; sbatch --usage"))
        )
        letters = "abcdefghijklmnopqrstuvwxyz"
        prefixes = [a + b for a in letters for b in ["", *letters, *"0123456789-_"]]
        for _, found in self.sbatch_says(prefixes).values():
            names |= set(found)
        arguments = {}
        for name, (kind, _) in self.sbatch_says(sorted(names)).items():
            arguments[name] = {"requires": "required", "takes-none": "none"}.get(kind, "optional")
        return arguments

    def sbatch_says(self, prefixes: Sequence[str]) -> dict[str, tuple[str, list[str]]]:
        """What sbatch's getopt_long answers to `sbatch --PREFIX` (and `--PREFIX=x`), for each
        prefix: ("ambiguous", candidates), ("requires", [name]), ("takes-none", [name]),
        ("unknown", []) or ("other", []) (it took an option that may have a value: its name is
        not said). Always with `--test-only` first and in the shared folder: a prefix of `--wrap`
        given `=x` is a whole batch job, which must be neither submitted nor leave a file."""
        sbatch = "sbatch --test-only"
        script = f"cd {shlex.quote(str(self.shared))}\n" + "".join(
            f"echo '<<<'; {sbatch} --{p} </dev/null 2>&1; echo '==='; "
            f"{sbatch} --{p}=x </dev/null 2>&1\n"
            for p in prefixes
        )
        out = self.check(script + "true\n", timeout=300)  # each sbatch fails, by design
        said: dict[str, tuple[str, list[str]]] = {}
        for prefix, block in zip(prefixes, out.split("<<<\n")[1:], strict=True):
            bare, _, valued = block.partition("===")
            said[prefix] = _getopt_says(bare, valued)
        return said

    # -- what a job left -----------------------------------------------------------------------

    def leftovers(self, settle: float = KILL_WAIT + 5) -> dict[str, list[str]]:
        """Jobs squeue still lists and processes left on any host, waiting up to `settle`."""
        deadline = time.monotonic() + settle
        while True:
            found: dict[str, list[str]] = {}
            jobs = self.jobs()
            if jobs:
                found["squeue"] = [f"{j.id} {j.state} {j.reason} {j.nodes}" for j in jobs]
            for h in self.lab.hosts:
                left = self.lab.leftovers(h, settle=0)
                if left:
                    found[h.name] = left
            if not found or time.monotonic() > deadline:
                return found
            time.sleep(0.1)


def _getopt_says(bare: str, valued: str) -> tuple[str, list[str]]:
    """glibc getopt_long's words for `--PREFIX` and `--PREFIX=x` (see `sbatch_says`)."""
    m = re.search(r"is ambiguous; possibilities:(.*)", bare)
    if m:
        return "ambiguous", re.findall(r"'--([^']+)'", m[1])
    m = re.search(r"option '--([^']+)' requires an argument", bare)
    if m:
        return "requires", [m[1]]
    if "unrecognized option" in bare:
        return "unknown", []
    m = re.search(r"option '--([^']+)' doesn't allow an argument", valued)
    if m:
        return "takes-none", [m[1]]
    return "other", []


def _pairs(text: str) -> list[tuple[str, str]]:
    """`NODE STATE` lines as pairs; other lines are not node lines."""
    return [(w[0], w[1]) for w in (line.split() for line in text.splitlines()) if len(w) == 2]
