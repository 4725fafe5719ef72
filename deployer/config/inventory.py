"""The inventory file: which hosts exist, how to reach them and which tasks each runs.

Parsing does no I/O beyond reading the one file (checking that the code directory exists, and
reading the user's ssh_config for a host named by a `Host` alias), so every mistake is reported
before any host is touched. `[[hosts]]` lists hosts by hand; any other
top-level table that lists hosts (`[aws]`) is a *host source* plugged in through `register_source`,
so the parser knows no source but its own.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import os
import re
import stat
import tomllib
import urllib.parse
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from deployer.config import jobtables, sshconfig
from deployer.config.frameworks import Framework
from deployer.config.model import (
    GPU_HEALTH_MODES,
    NOTIFY_EVENTS,
    EvaluatorFailure,
    FailurePolicy,
    GpuPolicy,
    Host,
    HostSettings,
    ImageFrom,
    Installer,
    Job,
    NetcheckMode,
    Notify,
    Profiler,
    SSHSettings,
    Strategy,
    TaskSpec,
    TensorBoard,
    WheelsFrom,
)
from deployer.config.roles import BUILTIN_SERVER, ROLE_NAMES, TF_ROLES, has_port
from deployer.config.schema import Table
from deployer.config.sources import (
    Deadline,
    Discovered,
    Held,
    Holdings,
    HostSource,
    Say,
    SourceContext,
    SourceReaders,
    SourceTable,
)
from deployer.core.errors import InventoryError

HOST_KEY_MODES = ("strict", "accept-new")
TRANSPORTS = ("ssh", "local")
BUILTINS = (BUILTIN_SERVER,)  # commands the agent runs itself (remote/supervisor.py)
# The job name starts every run id (<job>-<UTC stamp>-<4 hex>), a directory on every host and a
# file name in the state directory: capped far below NAME_MAX (255) with room for the rest.
MAX_JOB_NAME = 64

# Names end up in remote paths and run ids, so they must never contain '/' or be '..'.
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@-]*$")
# A job name starts every run id, which names a directory on each host: no ':' or '@' there.
_JOB_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")

# What a key left out means is written once, as the model's dataclass defaults (config/model.py);
# the parser reads it from these blank entries (the required fields here are never read).
_JOB = Job(name="", code=Path(), role_commands={})
_HOST = Host(
    name="", address="", tf_address="", port=0, python="", workdir="", ssh=SSHSettings(), tasks=()
)
_TASK = TaskSpec(role="")
_BOARD = TensorBoard(logdir="")


@dataclass(frozen=True)
class Inventory:
    path: Path
    job: Job
    hosts: tuple[Host, ...]
    pending: tuple[HostSource, ...] = ()  # sources whose hosts `discover_hosts` will find
    instances: tuple[Any, ...] = ()  # the machines that discovery found, in host order
    tables: tuple[SourceTable, ...] = ()  # how each discovered source shows them (`plan`)
    sources: tuple[HostSource, ...] = ()  # every source, discovered or not: replace, terminate
    deadlines: tuple[Deadline, ...] = ()  # the provisioned hosts' time limits (the watch warns)


def discover_hosts(inventory: Inventory, *, preview: bool = False) -> Inventory:
    """The inventory with every pending source's hosts appended after the known ones.

    The only step of loading that does I/O beyond the file; a no-op when nothing is pending.
    `preview`: with stand-ins for what `up` would create. `up` provisions instead
    (`provision_hosts`).
    """
    if not inventory.pending:
        return inventory
    file = str(inventory.path)
    return _with_found(inventory, [s.discover(file, preview=preview) for s in inventory.pending])


def provision_hosts(
    inventory: Inventory, say: Say, *, detach: bool = False
) -> tuple[Inventory, Holdings]:
    """`up`'s discovery: each pending source creates what is missing first, telling the user
    through `say` (`detach`: for `up --detach`), and its hosts are appended as
    `discover_hosts` appends them. Returned beside them: what the sources hold for this `up`
    (a Slurm allocation), which the caller keeps and ends. Whatever fails on the way (a later
    source, the hosts' names) ends what the sources before it hold: nothing is left held by
    nobody."""
    file = str(inventory.path)
    found: list[Discovered] = []
    held: list[Held] = []
    try:
        for source in inventory.pending:
            provisioned = source.provision(file, say, detach=detach)
            found.append(provisioned.found)
            if provisioned.held is not None:
                held.append(provisioned.held)
        return _with_found(inventory, found), Holdings(tuple(held))
    except BaseException:
        with contextlib.suppress(Exception):  # the failure that ended provisioning is the news
            Holdings(tuple(held)).end(say)
        raise


def _with_found(inventory: Inventory, founds: list[Discovered]) -> Inventory:
    hosts, instances, tables = list(inventory.hosts), list(inventory.instances), []
    deadlines = list(inventory.deadlines)
    for found in founds:
        hosts += found.hosts
        instances += found.instances
        tables += [found.table] if found.table is not None else []
        deadlines += found.deadlines
    check_unique_hosts(tuple(hosts), str(inventory.path))
    return dataclasses.replace(
        inventory,
        hosts=tuple(hosts),
        instances=tuple(instances),
        tables=(*inventory.tables, *tables),
        deadlines=tuple(deadlines),
        pending=(),
    )


# ---- reading the file --------------------------------------------------------------------------


def load_inventory(path: str | Path, sources: SourceReaders | None = None) -> Inventory:
    """Reads and validates an inventory file; raises InventoryError naming file and key path.

    `sources`: the top-level tables besides `[[hosts]]` that may list hosts, and their readers
    (deployer.sources.READERS for the CLI); any other table is an unknown key.
    """
    path = Path(path)
    try:
        _check_regular(path)
        raw = path.read_bytes()
    except FileNotFoundError:
        raise InventoryError(str(path), "", "file not found") from None
    except OSError as exc:
        raise InventoryError(str(path), "", f"cannot be read: {exc.strerror}") from None
    try:
        # utf-8-sig: editors on Windows start UTF-8 files with a byte order mark; TOML has none.
        data = tomllib.loads(raw.decode("utf-8-sig"))
    except UnicodeDecodeError:
        raise InventoryError(str(path), "", "is not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        raise InventoryError(str(path), "", f"invalid TOML: {exc}") from None
    return parse_inventory(data, path, sources or {})


_FILE_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a named pipe (FIFO)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _check_regular(path: Path) -> None:
    """Reading a FIFO or a device could block forever (or never end): only files are read."""
    mode = path.stat().st_mode
    if not stat.S_ISREG(mode):
        kind = next((name for test, name in _FILE_KINDS if test(mode)), "another kind of file")
        raise InventoryError(
            str(path),
            "",
            f"expected a regular file, but this is {kind}",
            hint="name the inventory's TOML file",
        )


def parse_inventory(
    data: dict[str, object], path: Path, sources: SourceReaders | None = None
) -> Inventory:
    root = Table(data, "", str(path))
    directory = path.parent.absolute()
    job = _parse_job(root.sub_table("job", required=True), directory)
    ssh = parse_ssh(root.sub_table("ssh"), SSHSettings(), directory)
    context = SourceContext(file=str(path), directory=directory, job=job, ssh=ssh)
    readers = sources or {}
    sourced = [
        readers[key]()(root.sub_table(key), context)
        for key in root.written_keys()
        if key != "hosts" and key in readers
    ]
    host_tables = root.table_list("hosts", required=not sourced)
    root.finish()
    aliased: dict[str, tuple[str, int]] = {}
    hosts = tuple(_parse_host(t, context, aliased) for t in host_tables)
    hosts += tuple(h for s in sourced for h in s.hosts)
    check_unique_hosts(hosts, str(path))
    pending = tuple(s.pending for s in sourced if s.pending is not None)
    return Inventory(path=path, job=job, hosts=hosts, pending=pending, sources=pending)


def _name(table: Table, key: str, value: str) -> str:
    if not _NAME.match(value) or ".." in value:
        table.fail(key, f"expected a name of letters, digits and . _ - : @, got {value!r}")
    return value


def _checkpoint_dir(t: Table) -> str | None:
    """A folder on every host: relative (the job's own, under the workdir) never climbs out."""
    value = t.string("checkpoint_dir")
    if value is None:
        return None
    if not value.strip() or not value.isprintable():
        t.fail("checkpoint_dir", f"expected a folder's path, got {value!r}")
    if not value.startswith(("/", "~")) and ".." in PurePosixPath(value).parts:
        t.fail(
            "checkpoint_dir",
            f"a relative checkpoint_dir is the job's own folder on each host, so {value!r} may "
            "not climb out of it with ..",
            hint='write an absolute path (e.g. "/mnt/efs/ckpt") for a folder of your own',
        )
    return value


def _parse_job(t: Table, directory: Path) -> Job:
    name = t.required_string("name")
    if not _JOB_NAME.match(name) or ".." in name:
        t.fail("name", f"expected a job name of letters, digits and . _ -, got {name!r}")
    if len(name) > MAX_JOB_NAME:
        t.fail(
            "name",
            f"expected a job name of at most {MAX_JOB_NAME} characters, got {len(name)}: it "
            "starts every run id, which names a directory on each host",
        )
    code_text = t.required_string("code")
    code = (directory / Path(code_text).expanduser()).resolve()
    if not code.is_dir():
        t.fail("code", f"expected a directory, but {code} does not exist or is not a directory")
    defaults = {r.name: r.default_command for r in TF_ROLES.values() if r.default_command}
    role_commands = defaults | {
        role: _builtin_checked(t, f"role_commands.{role}", command)
        for role, command in t.string_map("role_commands").items()
    }
    for role in role_commands:
        if role not in TF_ROLES:
            t.fail(f"role_commands.{role}", f"expected one of the roles {', '.join(ROLE_NAMES)}")
        elif role_commands[role] == BUILTIN_SERVER and not has_port(role):
            t.fail(f"role_commands.{role}", f"an {role} runs the user's code, not a TF server")
    framework = Framework(t.choice("framework", list(Framework), _JOB.framework))
    role_frameworks = jobtables.role_frameworks(t)
    # A job whose tasks all read another convention needs no TensorFlow on its hosts.
    uses_tf = Framework.TENSORFLOW in (framework, *role_frameworks.values())
    job = Job(
        name=name,
        code=code,
        command=_command(t),
        python=t.string("python", _JOB.python),
        workdir=t.remote_dir("workdir", _JOB.workdir),
        port=t.integer("port", _JOB.port, minimum=1, maximum=65535),
        env=t.env_map("env"),
        setup=t.string_list("setup"),
        role_commands=role_commands,
        secret_env=t.env_names("secret_env"),
        start_timeout=t.number("start_timeout", _JOB.start_timeout, minimum=1),
        stop_grace=t.number("stop_grace", _JOB.stop_grace),
        evaluator_grace=t.number("evaluator_grace", _JOB.evaluator_grace),
        on_failure=FailurePolicy(
            t.choice("on_failure", [p.value for p in FailurePolicy], _JOB.on_failure)
        ),
        evaluator_failure=EvaluatorFailure(
            t.choice(
                "evaluator_failure", [p.value for p in EvaluatorFailure], _JOB.evaluator_failure
            )
        ),
        max_restarts=t.integer("max_restarts", _JOB.max_restarts, minimum=0, maximum=1000),
        restart_backoff=t.number("restart_backoff", _JOB.restart_backoff),
        retry_exit_codes=_retry_exit_codes(t),
        stall_timeout=t.number("stall_timeout", _JOB.stall_timeout, minimum=1),
        gpu_idle_stop=jobtables.gpu_idle_stop(t),
        lease_seconds=t.number("lease_seconds", _JOB.lease_seconds, minimum=5),
        keeper=t.boolean("keeper", _JOB.keeper),
        checkpoint_dir=_checkpoint_dir(t),
        firewall=t.boolean("firewall", _JOB.firewall),
        profiler=_profiler(t),
        profiler_port=t.integer("profiler_port", _JOB.profiler_port, minimum=1, maximum=65535),
        netcheck=_netcheck(t),
        strategy=Strategy(t.choice("strategy", [s.value for s in Strategy], _JOB.strategy)),
        framework=framework,
        role_frameworks=role_frameworks,
        fanout=t.boolean("fanout", _JOB.fanout),
        require_tensorflow=t.boolean("require_tensorflow", _JOB.require_tensorflow and uses_tf),
        allow_mixed_tensorflow=t.boolean("allow_mixed_tensorflow", _JOB.allow_mixed_tensorflow),
        artifacts=t.string_list("artifacts"),
        # `~` as a shell would have it (this machine's home); relative: the working directory
        artifacts_to=os.path.expanduser(t.string("artifacts_to", _JOB.artifacts_to)),
        tensorboard=_tensorboard(t),
        notify=_notify(t),
        forward_env=t.env_names("forward_env"),
        requirements=jobtables.requirements(t, "requirements", code),
        role_requirements=jobtables.role_requirements(t, code),
        system_site_packages=t.boolean("system_site_packages", _JOB.system_site_packages),
        wheels_from=WheelsFrom(
            t.choice("wheels_from", [w.value for w in WheelsFrom], _JOB.wheels_from)
        ),
        installer=Installer(t.choice("installer", [i.value for i in Installer], _JOB.installer)),
        image=jobtables.image(t, "image"),
        role_images=jobtables.role_images(t),
        image_from=ImageFrom(t.choice("image_from", [w.value for w in ImageFrom], _JOB.image_from)),
        container_runtime=jobtables.container_runtime(t),
        container_mounts=jobtables.mounts(t),
    )
    t.finish()
    return job


def _tensorboard(job: Table) -> TensorBoard | None:
    t = job.sub_table("tensorboard")  # read even when absent: a typo gets its "did you mean"
    if not job.has("tensorboard"):
        return None
    task = t.string("task")
    if task is not None and not re.fullmatch(rf"({'|'.join(ROLE_NAMES)}):[0-9]+", task):
        t.fail("task", f"expected a task such as chief:0 or worker:1, got {task!r}")
    board = TensorBoard(
        logdir=t.required_string("logdir"),
        port=t.integer("port", _BOARD.port, minimum=1, maximum=65535),
        task=task,
    )
    t.finish()
    return board


def _notify(job: Table) -> Notify | None:
    t = job.sub_table("notify")  # read even when absent: a typo gets its "did you mean"
    if not job.has("notify"):
        return None
    webhook = t.string("webhook")
    if webhook is not None:
        parts = urllib.parse.urlsplit(webhook)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            t.fail("webhook", "expected an http:// or https:// URL with a host")
    command = t.string("command")
    events = t.string_list("events") if t.has("events") else NOTIFY_EVENTS
    for event in events:
        if event not in NOTIFY_EVENTS:
            t.fail("events", f"expected some of {', '.join(NOTIFY_EVENTS)}, got {event!r}")
    t.finish()  # a misspelt key first: its "did you mean" says more than what is missing
    if webhook is None and command is None:
        t.fail("webhook", "expected webhook = URL, command = ..., or both")
    return Notify(webhook=webhook, command=command, events=tuple(events))


def _retry_exit_codes(t: Table) -> tuple[int, ...] | None:
    """None when unset; either way signals and 128+ are retried (see watch.board.retryable).
    Exit statuses are 0-255: a larger number could never match."""
    codes = t.index_list("retry_exit_codes", what="an exit code", maximum=255)
    return codes if t.has("retry_exit_codes") else None


def parse_ssh(t: Table, base: SSHSettings, directory: Path) -> SSHSettings:
    """An ssh table over `base`; relative files are relative to the inventory's `directory`."""
    timeout = t.number("connect_timeout", base.connect_timeout, minimum=0.1)

    def path(key: str, default: str | None) -> str | None:
        # Relative files are relative to the inventory, like `code`: the same file works from
        # any working directory. '~' paths are left for the transport to expand.
        value = t.string(key)
        if value is None:
            return default
        if value.startswith("~"):
            return value
        return os.path.normpath(directory / value)

    settings = SSHSettings(
        user=t.string("user", base.user),
        port=t.integer("port", base.port, minimum=1, maximum=65535),
        identity=path("identity", base.identity),
        jump=t.string("jump", base.jump),
        host_keys=t.choice("host_keys", HOST_KEY_MODES, base.host_keys),
        known_hosts=path("known_hosts", base.known_hosts),
        connect_timeout=timeout if timeout is not None else base.connect_timeout,
        ssh_config=path("ssh_config", base.ssh_config),
    )
    t.finish()
    return settings


def parse_host_settings(t: Table, context: SourceContext) -> HostSettings:
    """The keys every host entry has (tasks, GPUs, port, python, workdir, ssh), over the job's."""
    job = context.job
    ssh = parse_ssh(t.sub_table("ssh"), context.ssh, context.directory)
    task_tables = t.table_list("tasks", required=True)
    gpus, gpus_auto = read_gpu_count(t)
    return HostSettings(
        port=t.integer("port", job.port, minimum=1, maximum=65535),
        gpus=gpus,
        gpus_auto=gpus_auto,
        share_gpus=t.boolean("share_gpus", _HOST.share_gpus),
        gpu_policy=_gpu_policy(t),
        python=t.string("python", job.python),
        workdir=t.remote_dir("workdir", job.workdir),
        ssh=ssh,
        tasks=tuple(parse_task(tt) for tt in task_tables),
        requirements=(
            jobtables.requirements(t, "requirements", job.code)
            if t.has("requirements")
            else job.requirements
        ),
        image=jobtables.image(t, "image") or job.image,
        container_runtime=jobtables.container_runtime(t) or job.container_runtime,
    )


def _gpu_policy(t: Table) -> GpuPolicy:
    """The GPU health rules' opt-outs and thresholds (docs/gpus.md)."""
    base = _HOST.gpu_policy
    return GpuPolicy(
        health=t.choice("gpu_health", GPU_HEALTH_MODES, base.health),
        max_ecc_errors=t.integer("max_ecc_errors", base.max_ecc_errors, minimum=0),
        allow_busy=t.boolean("allow_busy_gpus", base.allow_busy),
        release_s=t.number("gpu_release_s", base.release_s),
    )


def make_host(
    settings: HostSettings, *, name: str, address: str, tf_address: str, key: str, transport: str
) -> Host:
    return Host(
        name=name,
        address=address,
        tf_address=tf_address,
        port=settings.port,
        gpus=settings.gpus,
        gpus_auto=settings.gpus_auto,
        share_gpus=settings.share_gpus,
        gpu_policy=settings.gpu_policy,
        transport=transport,
        python=settings.python,
        workdir=settings.workdir,
        ssh=settings.ssh,
        tasks=settings.tasks,
        key=key,
        requirements=settings.requirements,
        image=settings.image,
        container_runtime=settings.container_runtime,
    )


def _parse_host(t: Table, context: SourceContext, aliased: dict[str, tuple[str, int]]) -> Host:
    address = t.host_address("address", t.required_string("address"), port_key="ssh.port")
    written = t.string("name")  # a default name is the address, which was checked above
    name = address if written is None else _name(t, "name", written)
    settings = parse_host_settings(t, context)
    transport = t.choice("transport", TRANSPORTS, _HOST.transport)
    tf_address = t.string("tf_address")
    if tf_address is not None:
        tf_address = t.host_address("tf_address", tf_address)
    elif transport == "ssh":
        tf_address = _aliased_tf_address(t, name, address, settings.ssh, aliased)
    host = make_host(
        settings,
        name=name,
        address=address,
        tf_address=address if tf_address is None else tf_address,
        transport=transport,
        key=t.path,
    )
    t.finish()
    return host


def _aliased_tf_address(
    t: Table, name: str, address: str, ssh: SSHSettings, aliased: dict[str, tuple[str, int]]
) -> str:
    """The TF address of a host whose `tf_address` is not written: the HostName ssh_config gives
    its address (an alias is known only to this machine), else the address itself.

    Hosts whose aliases share one HostName on different SSH ports sit behind a port forward
    (a NAT, Vagrant's 127.0.0.1:2222): the address their tasks are reached at cannot be known
    without asking the hosts, so it must be written. `aliased`: HostName -> (host, SSH port) of
    the hosts read so far.
    """
    resolved = sshconfig.tf_address_of(address, ssh.ssh_config)
    if resolved == address:
        return address
    port = sshconfig.ssh_port_of(address, ssh)
    other, other_port = aliased.setdefault(resolved, (name, port))
    if other_port != port:
        t.fail(
            "tf_address",
            f"must be set: ssh_config gives {name!r} and {other!r} the same HostName "
            f"{resolved!r} on SSH ports {port} and {other_port} (a port forward), so the address "
            "other hosts reach their TF tasks at cannot be known without asking the hosts",
            hint="set tf_address on each of these hosts to an address every host can reach",
        )
    return resolved


def parse_task(t: Table) -> TaskSpec:
    """One `tasks` entry."""
    role = t.string("role", required=True)
    if role not in TF_ROLES:
        t.fail("role", f"expected one of {', '.join(ROLE_NAMES)}, got {role!r}")
    assert role is not None
    listed = t.index_list("gpus", what="a GPU index")  # read even when absent: a known key
    gpus = listed if t.has("gpus") else None
    task = TaskSpec(
        role=role,
        count=t.integer("count", _TASK.count, minimum=1, maximum=1024),
        gpus=gpus,
        command=_command(t),
        env=t.env_map("env"),
        threads=t.optional_integer("threads", minimum=1, maximum=4096),
        cpus=t.cpu_list("cpus"),
        key=t.path,
    )
    t.finish()
    return task


def _command(t: Table) -> str | None:
    command = t.string("command")
    return None if command is None else _builtin_checked(t, "command", command)


def _builtin_checked(t: Table, key: str, command: str) -> str:
    """A command naming a built-in ("tfdeploy:...") must name one that exists."""
    word = command.strip()
    if not word.startswith("tfdeploy:"):
        return command
    if word not in BUILTINS:
        names = [b.removeprefix("tfdeploy:") for b in BUILTINS]  # the shared prefix always matches
        close = difflib.get_close_matches(word.removeprefix("tfdeploy:"), names, n=1, cutoff=0.6)
        t.fail(
            key,
            f"unknown built-in command {word!r} (built-ins: {', '.join(BUILTINS)})",
            hint=f"did you mean 'tfdeploy:{close[0]}'?" if close else None,
        )
    return word  # the agent strips it too: plan and hosts agree on what is a built-in


def _netcheck(t: Table) -> NetcheckMode:
    """`netcheck = true` (auto), `false` (off), or a mode's name ("full", "sampled", ...)."""
    names = [m.value for m in NetcheckMode]
    try:
        written = t.boolean("netcheck", True)  # True: only a stand-in, absent is checked below
    except InventoryError:  # not a boolean: then one of the names
        return NetcheckMode(t.choice("netcheck", names, _JOB.netcheck))
    if not t.has("netcheck"):
        return _JOB.netcheck
    return NetcheckMode.AUTO if written else NetcheckMode.OFF


def _profiler(t: Table) -> Profiler:
    """`profiler = true` (tfdeploy starts the server), `false`, or "task" (the task's code)."""
    try:
        written = t.boolean("profiler", False)
    except InventoryError:  # not a boolean: then "task" (or the modes' own names)
        return Profiler(t.choice("profiler", [p.value for p in Profiler], _JOB.profiler))
    return Profiler.TFDEPLOY if written else Profiler.OFF


def read_gpu_count(t: Table) -> tuple[int, bool]:
    """`gpus = N` or `gpus = "auto"` (count them with nvidia-smi at preflight): (N, auto)."""
    if not t.has("gpus"):
        t.integer("gpus", _HOST.gpus)  # marks the key as known
        return _HOST.gpus, _HOST.gpus_auto
    try:
        return t.integer("gpus", _HOST.gpus, minimum=0, maximum=1024), False
    except InventoryError as not_a_count:
        try:
            word = t.string("gpus")
        except InventoryError:
            raise not_a_count from None
        if word != "auto":
            t.fail("gpus", f'expected an integer or "auto" (count with nvidia-smi), got {word!r}')
        return 0, True


def check_unique_hosts(hosts: tuple[Host, ...], file: str) -> None:
    """No two hosts share a name, or an address and SSH port: each would be deployed twice."""
    names: dict[str, str] = {}
    endpoints: dict[tuple[str, int, str], str] = {}
    for host in hosts:
        if host.name in names:
            raise InventoryError(
                file,
                f"{host.key}.name",
                f"duplicate host name {host.name!r} (also {names[host.name]})",
            )
        names[host.name] = host.key
        endpoint = (host.address, host.ssh.port, host.transport)
        if endpoint in endpoints:
            raise InventoryError(
                file,
                f"{host.key}.address",
                f"{host.address} port {host.ssh.port} is already listed as {endpoints[endpoint]}",
                hint="list a host once and give it several tasks instead",
            )
        endpoints[endpoint] = host.key
