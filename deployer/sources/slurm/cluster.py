"""The cluster as its login node's commands: squeue, scontrol, sbatch, scancel, run once each.

Every call goes through the login node's transport (SSH, or this machine for `login =
"local"`), and every answer is read by outputs.py. A command that fails says so in Slurm's own
words (its stderr), naming the command. The cluster's SSH connection to the login node is the
run's one (deployer/hosts/shared_ssh.py): the lease keeper's step and every node's job steps
are channels on it too (`steps_on`), more connections only past the login sshd's MaxSessions.
"""

from __future__ import annotations

import shlex
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import TypeVar

from deployer.config.model import Host, SSHSettings
from deployer.core.errors import ExitStatus, TfdeployError
from deployer.hosts.fleet import scheduler_env
from deployer.hosts.local_transport import LocalTransport
from deployer.hosts.shared_ssh import SharedSSH
from deployer.hosts.ssh import Endpoint
from deployer.hosts.transport import OutputTooLarge, Transport
from deployer.sources.slurm import outputs
from deployer.sources.slurm.outputs import Node, Partition, QueuedJob
from deployer.sources.slurm.settings import LOCAL, SlurmSettings

CALL_S = 60.0  # one Slurm command: slurmctld answers in milliseconds, or is in trouble
# After scancel: how long to wait for the job to leave COMPLETING (Slurm's KillWait, 30 s by
# default, plus the epilog); a cancel is not waited on longer than this.
CANCEL_WAIT_S = 60.0


class SlurmRefused(TfdeployError):
    """Slurm said no (an unknown partition, a request it can never meet, a refused sbatch)."""

    exit_status = ExitStatus.USAGE


class SlurmUnreachable(TfdeployError):
    """A Slurm command could not run or failed for another reason than the request."""

    exit_status = ExitStatus.UNREACHABLE


def login_host(settings: SlurmSettings, ssh: SSHSettings) -> Host:
    """The login node as a host to run commands on (it runs no task)."""
    local = settings.login == LOCAL
    return Host(
        name=f"{settings.login} (Slurm login)" if not local else "Slurm login (local)",
        address="localhost" if local else settings.login,
        tf_address="localhost" if local else settings.login,
        port=0,
        transport="local" if local else "ssh",
        python="python3",
        workdir="~/.tfdeploy",
        ssh=ssh,
        tasks=(),
    )


T = TypeVar("T")


def off_main(call: Callable[[], T]) -> T:
    """`call` on a daemon thread of its own, waited for here: a Ctrl-C or a signal (raised in
    the main thread) then lands in this wait, never inside paramiko or logging. Raised there,
    mid-call, it left logging's module lock held and a connection waiting for a key exchange
    that never came, and `up`'s teardown and release hung behind them for minutes. The
    abandoned call ends by itself (CALL_S) on its thread."""
    result: Future[T] = Future()

    def work() -> None:
        try:
            result.set_result(call())
        except BaseException as exc:  # handed to the waiting thread as it came
            result.set_exception(exc)

    threading.Thread(target=work, name="slurm-call", daemon=True).start()
    return result.result()


class Cluster:
    """Slurm's commands on the login node, over a connection of its own that `close` ends:
    whoever makes a Cluster closes it (`with Cluster.of(...) as cluster`, or the allocation
    that holds it)."""

    def __init__(self, transport: Transport, login: Host, shared: SharedSSH | None = None) -> None:
        self.transport = transport
        self.login = login
        self._shared = shared  # the SSH connection(s) to the login node; None: it is local

    @classmethod
    def of(cls, settings: SlurmSettings, ssh: SSHSettings) -> Cluster:
        login = login_host(settings, ssh)
        if login.transport == "local":  # here, with the Slurm client's configuration variable
            return cls(LocalTransport(login.name, env=scheduler_env()), login)
        shared = SharedSSH(Endpoint(login.name, login.address, login.ssh))
        return cls(shared.view(login.name), login, shared)

    def steps_on(self, name: str) -> Transport:
        """A transport named `name` (a node's, the lease keeper's) over this cluster's own
        connection to the login node, where that node's job steps are launched: a channel of
        the run's one connection, not a connection of its own. Closed with the cluster."""
        if self._shared is None:
            return LocalTransport(name, env=scheduler_env())
        return self._shared.view(name)

    def close(self) -> None:
        """The login connection closed, and with it every transport `steps_on` made."""
        self.transport.close()
        if self._shared is not None:
            self._shared.close()

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def call(self, argv: Sequence[str], *, stdin: bytes = b"") -> tuple[int, str, str]:
        try:  # a login node that prints without end is ended at the bound, never buffered
            result = off_main(
                lambda: self.transport.run(
                    argv, stdin=stdin, timeout=CALL_S, max_output=2 * outputs.MAX_OUTPUT
                )
            )
        except OutputTooLarge:
            raise outputs.UnreadableOutput(
                shlex.join(argv), f"over {2 * outputs.MAX_OUTPUT} bytes", ""
            ) from None
        for said in (result.stdout, result.stderr):
            if len(said) > outputs.MAX_OUTPUT:  # bytes: not even decoded (outputs.bounded)
                raise outputs.UnreadableOutput(
                    shlex.join(argv), f"{len(said)} bytes, over {outputs.MAX_OUTPUT}", ""
                )
        out = result.stdout.decode(errors="replace")
        err = result.stderr.decode(errors="replace")
        if result.exit_code == 127:
            raise SlurmUnreachable(
                f"{self.transport.name}: {argv[0]} is not found",
                hint="run tfdeploy where Slurm's commands are (a login node), or point `login` "
                "in [slurm] at one",
            )
        return result.exit_code, out, err

    def checked(self, argv: Sequence[str], *, stdin: bytes = b"") -> str:
        code, out, err = self.call(argv, stdin=stdin)
        if code != 0:
            raise SlurmUnreachable(
                f"`{shlex.join(argv)}` failed (exit code {code}): {words(err, out)}",
                hint="check the cluster with `sinfo` on the login node",
            )
        return out

    def job(self, job_id: str) -> QueuedJob | None:
        """The job as squeue sees it; None: gone (ended and forgotten, or never there)."""
        argv = ["squeue", "-h", "-t", "all", "-j", job_id, "-o", outputs.QUEUE_FORMAT]
        code, out, err = self.call(argv)
        if code != 0 and "Invalid job id" in err:
            return None
        if code != 0:
            raise SlurmUnreachable(f"`{shlex.join(argv)}` failed: {words(err, out)}")
        jobs = [j for j in outputs.parse_queue(out, shlex.join(argv)) if j.id == job_id]
        return jobs[0] if jobs else None

    def named(self, name: str) -> list[QueuedJob]:
        """This user's jobs of that name still pending or running."""
        argv = ["squeue", "-h", "--me", "-n", name, "-o", outputs.QUEUE_FORMAT]
        return outputs.parse_queue(self.checked(argv), shlex.join(argv))

    def partition(self, name: str) -> Partition:
        argv = ["scontrol", "show", "partition", name, "-o"]
        code, out, err = self.call(argv)
        if code != 0 or not out.strip():
            raise SlurmRefused(
                f"Slurm has no partition {name!r}: {words(err, out)}",
                hint="`sinfo -s` lists the partitions you may use; set partition in [slurm]",
            )
        return outputs.parse_partition(out, shlex.join(argv))

    def nodes(self, names: Sequence[str]) -> dict[str, Node]:
        argv = ["scontrol", "show", "node", ",".join(names), "-o"]
        return outputs.parse_nodes(self.checked(argv), shlex.join(argv))

    def granted_gpus(self, job_id: str, nodes: Sequence[str]) -> dict[str, tuple[int, ...]]:
        argv = ["scontrol", "show", "job", "-d", "-o", job_id]
        return outputs.parse_granted_gpus(self.checked(argv), shlex.join(argv), nodes)

    def cancel(self, job_id: str, *, wait: float = CANCEL_WAIT_S) -> None:
        """scancel, then waits (up to `wait` s) until Slurm has ended the job's processes on
        its nodes (no longer COMPLETING): once `up` or `down` returns, the nodes are free."""
        code, out, err = self.call(["scancel", job_id])
        if code != 0 and "Invalid job id" not in err and "already completing" not in err:
            raise SlurmUnreachable(
                f"`scancel {job_id}` failed: {words(err, out)}",
                hint=f"cancel it yourself on the login node: scancel {job_id}",
            )
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            job = self.job(job_id)
            if job is None or job.state.ended:  # COMPLETING is not ended yet
                return
            time.sleep(0.5)


def words(err: str, out: str = "") -> str:
    """What Slurm said, on one line, without its `sbatch: error:` prefixes; its last three
    lines, each cleaned and cut (outputs.short: the login node's words are untrusted)."""
    lines = [
        outputs.short(line.replace("sbatch: error: ", "").replace("srun: error: ", "").strip())
        for line in (err or out)[-outputs.MAX_LINE :].splitlines()
        if line.strip()
    ]
    return " / ".join(lines[-3:]) if lines else "(nothing said)"
