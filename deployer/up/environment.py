"""The job's Python environment in `up`: resolved once here, sent with the code, installed once
per host and environment, and the one the tasks run in (docs/environments.md).

- `Environments.resolve`, after preflight's hellos (which report each host's Python, machine
  and glibc) and before anything is sent: hosts are grouped by environment hash and each
  distinct environment is resolved once (deployer/envs, cached on this machine).
- `Environments.extras`: the wheels, added to the push as contents stored but not placed in
  the code directory: only what a host's store lacks travels, through the fan-out.
- `Environments.install`, after the push: the `env` op on every host builds or reuses the venv
  and answers its TensorFlow and the interpreter each task's first word names there; the
  interpreter check runs on those answers, the TensorFlow rule (tfrule.py) with every task's.
- `Environments.where`: each task's (and setup's) interpreter: {"venv": path} or, without
  requirements, {"python": host python}.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from deployer.config.model import Host, Job, Requirements, WheelsFrom
from deployer.config.plan import Plan, Task
from deployer.core.errors import HostError, HostsFailed
from deployer.core.text import human_size, join_names, plural
from deployer.envs import known, uv, wheelhouse
from deployer.envs.identity import EnvIdentity, Interpreter
from deployer.envs.platform import HostPlatform
from deployer.envs.resolve import ResolveError, cache_root, resolve
from deployer.envs.spec import EnvSpec, env_hash, from_file, from_lines
from deployer.envs.wheelhouse import Wheel, Wheelhouse
from deployer.hosts.fleet import Fleet, Member
from deployer.hosts.task_runtime import TaskRuntime
from deployer.push.sync import CodeFile, Manifest
from deployer.up.envprogress import OnProgress, Watch, project
from remote import interpreters as words_of
from remote import protocol
from remote.protocol import HelloReply, InterpretersShape

INSTALL_TIMEOUT_S = 3600.0  # a TensorFlow install with CUDA wheels takes minutes, not seconds


def requirements_of(job: Job, host: Host, task: Task | None = None) -> Requirements:
    """A task's requirements: its role's, else its host's (the job's unless the host says)."""
    if task is not None and task.role in job.role_requirements:
        return job.role_requirements[task.role]
    return host.requirements


def uses_requirements(plan: Plan) -> frozenset[str]:
    """The hosts where some task (or the host's setup) runs in an environment of the job's."""
    hosts = {h.name: h for h in plan.hosts}
    return frozenset(
        h.name
        for h in plan.hosts
        if h.requirements is not None
        or any(requirements_of(plan.job, hosts[t.host], t) for t in plan.tasks_on(h.name))
    )


def spec_of(requirements: Requirements, code: Path) -> EnvSpec:
    if isinstance(requirements, str):
        return from_file(code / requirements, base=code)
    return from_lines(list(requirements or ()), base=code)


def python_words(tasks: Sequence[Task]) -> list[str]:
    """The first words of the tasks' commands that name a Python interpreter."""
    found = [words_of.first_word(t.command) for t in tasks if not t.is_server and t.command]
    return sorted({w for w in found if w and words_of.is_python_word(w)})


def interpreter_problems(
    host: str, answer: InterpretersShape, checked_as: str
) -> tuple[list[HostError], list[str]]:
    """Each first word against the interpreter preflight checked: a different one is an error
    naming both, one that is not found a warning."""
    checked = answer["checked"]
    found = answer["found"]
    problems, warnings = [], []
    for word, ident in sorted(found.items()):
        if ident is None:
            warnings.append(
                f"{host}: the tasks' `{word}` is not found on their PATH; preflight checked "
                f"{checked_as}"
            )
        elif checked is not None and ident != checked:
            parts = ident
            said = f"{parts[0]} (venv {parts[1]})" if parts[1:] and parts[1] else parts[0]
            problems.append(
                HostError(
                    host,
                    f"the tasks' `{word}` is {said}, not {checked_as}, which preflight checked: "
                    "the tasks would run another Python than the one checked",
                    hint=f"start the command with `python` or the full path of {checked_as}, "
                    "or set job.python (or the host's python) to the interpreter the tasks use",
                )
            )
    return problems, warnings


@dataclass(frozen=True)
class HostEnv:
    """One environment on one host: for which requirements, platform and identity."""

    requirements: Requirements
    target: HostPlatform
    resolved: str  # spec.env_hash: the wheelhouse's key (requirements and platform)
    wheelhouse: Wheelhouse | None  # None: the host's own pip fetches (wheels_from = "hosts")
    spec: EnvSpec
    identity: EnvIdentity
    installer: uv.Choice = uv.PIP  # what builds the venv there

    @property
    def hash(self) -> str:
        """The venv's name on the host: every setting that makes it (envs/identity.py)."""
        return self.identity.hash

    @property
    def wheels(self) -> tuple[Wheel, ...]:
        """What the host's store must hold for it: the environment's wheels and uv's."""
        own = self.wheelhouse.wheels if self.wheelhouse else ()
        return own + (self.installer.wheelhouse.wheels if self.installer.wheelhouse else ())

    def paths(self) -> dict[str, str]:
        """Each wheel's file on this machine, by sha256."""
        found = {}
        for house in (self.wheelhouse, self.installer.wheelhouse):
            for w in house.wheels if house else ():
                found[w.sha256] = str(house.wheel_dir / w.file)  # type: ignore[union-attr]
        return found


def identity_of(job: Job, resolved: str, python: str, facts: HelloReply) -> EnvIdentity:
    """The identity of a venv of `resolved` requirements over a host's configured `python`."""
    return EnvIdentity(
        requirements=resolved,
        interpreter=Interpreter.of(python, facts),
        system_site_packages=job.system_site_packages,
        wheels_from=job.wheels_from.value,
    )


@dataclass
class Environments:
    """Every host's environments for one `up`, and what the tasks run in."""

    plan: Plan
    refresh: bool = False
    envs: dict[str, dict[str, HostEnv]] = field(default_factory=dict)  # host -> req key -> env
    venvs: dict[str, dict[str, str]] = field(default_factory=dict)  # host -> req key -> venv
    resolved: int = 0  # distinct environments resolved (or read from the cache)
    fresh: int = 0  # of them, resolved now (not read from the cache)

    @property
    def any(self) -> bool:
        return bool(self.envs)

    def resolve(self, facts: Mapping[str, HelloReply]) -> list[str]:
        """Groups hosts by environment hash and resolves each distinct one once, with the
        installer of its platform (uv's wheel, or pip). What to say."""
        job = self.plan.job
        hosts = {h.name: h for h in self.plan.hosts}
        specs: dict[str, EnvSpec] = {}
        groups: dict[str, tuple[EnvSpec, HostPlatform, list[str]]] = {}
        for name in sorted(uses_requirements(self.plan)):
            host, f = hosts[name], facts[name]
            target = HostPlatform.of(f["python"], f["machine"], f["glibc"])
            wanted = [requirements_of(job, host, t) for t in self.plan.tasks_on(name)]
            for requirements in dict.fromkeys([host.requirements, *wanted]):
                if requirements is None:
                    continue
                key = _key(requirements)
                if key not in specs:
                    specs[key] = spec_of(requirements, job.code)
                digest = env_hash(specs[key], target)
                groups.setdefault(digest, (specs[key], target, []))[2].append(name)
                identity = identity_of(job, digest, host.python, f)
                self.envs.setdefault(name, {})[key] = HostEnv(
                    requirements, target, digest, None, specs[key], identity
                )
        known.remember(
            {
                known.host_key(hosts[n].address, hosts[n].python): {
                    "python": facts[n]["python"],
                    "machine": facts[n]["machine"],
                    "glibc": facts[n]["glibc"],
                }
                for n in uses_requirements(self.plan)
            }
        )
        houses = {d: self._resolved(d, *group) for d, group in groups.items()}
        choices = {d: self._installer(houses[d], target) for d, (_, target, _) in groups.items()}
        for by_key in self.envs.values():
            for key, env in by_key.items():
                choice = choices[env.resolved]
                by_key[key] = dataclasses.replace(
                    env,
                    wheelhouse=houses[env.resolved],
                    installer=choice,
                    identity=dataclasses.replace(env.identity, installer=_installer_word(choice)),
                )
        self.resolved = len(houses)
        said = [
            f"environment {env_hash(spec, target, choices[d].installer)[:12]} for "
            f"{join_names(names)}: {target.describe()}, "
            + (
                f"{plural(len(h.wheels), 'wheel')}, {human_size(h.size)}, {choices[d].said()}"
                if h
                else 'installed from the hosts\' own index (wheels_from = "hosts")'
            )
            for d, (spec, target, names) in groups.items()
            for h in [houses[d]]
        ]
        return said + ([cache_line()] if self.fresh else [])

    def _installer(self, house: Wheelhouse | None, target: HostPlatform) -> uv.Choice:
        """uv (its wheel for the platform) unless the job says pip, the hosts install from
        their own index, or no uv wheel exists for the platform."""
        if house is None:
            return uv.PIP
        return uv.choose(self.plan.job.installer.value, target, refresh=self.refresh)

    def _resolved(
        self, digest: str, spec: EnvSpec, target: HostPlatform, names: list[str]
    ) -> Wheelhouse | None:
        """One environment's wheels (None: the hosts fetch them); its error names its hosts."""
        if self.plan.job.wheels_from is not WheelsFrom.CONTROLLER:
            return None
        if self.refresh or wheelhouse.load(cache_root() / digest, digest) is None:
            self.fresh += 1  # the cache grows: the lines say how much it holds (cache_line)
        try:
            return resolve(spec, target, refresh=self.refresh)
        except ResolveError as exc:
            raise ResolveError(f"{join_names(names)}: {exc.message}", hint=exc.hint) from None

    def extras(self) -> tuple[CodeFile, ...]:
        """The wheels as contents of the push (absolute paths: read from the cache)."""
        found: dict[str, CodeFile] = {}
        for by_key in self.envs.values():
            for env in by_key.values():
                paths = env.paths()
                for w in env.wheels:
                    found.setdefault(w.sha256, CodeFile(paths[w.sha256], w.sha256, 0o644, w.size))
        return tuple(found[k] for k in sorted(found))

    def needs(self) -> dict[str, frozenset[str]]:
        """Each host's wheels: its own environments' (and uv's for its platform), only."""
        return {
            host: frozenset(w.sha256 for env in by_key.values() for w in env.wheels)
            for host, by_key in self.envs.items()
        }

    def cache_entries(self) -> list[Path]:
        """This machine's cache entries the environments use (theirs and uv's): what `prune
        --local` keeps while recent runs use them."""
        found = {
            house.path
            for by_key in self.envs.values()
            for env in by_key.values()
            for house in (env.wheelhouse, env.installer.wheelhouse)
            if house is not None
        }
        return sorted(found)

    def install(
        self,
        fleet: Fleet,
        members: Sequence[Member],
        run_id: str,
        on_progress: OnProgress | None = None,
    ) -> tuple[dict[str, list[protocol.EnvReply]], list[str]]:
        """The env op on every host with an environment; raises HostsFailed (nothing started)
        for a build that failed or a task's other Python. The TensorFlow each venv answers is
        checked with every other task's by tfrule.py. `on_progress`: each building host's
        progress, every few seconds (envprogress.py)."""
        with_env = [m for m in members if m.name in self.envs]
        builds = {
            host: [
                (env.hash, [project(w.file) for w in env.wheelhouse.wheels])
                for env in by_key.values()
                if env.wheelhouse is not None
            ]
            for host, by_key in self.envs.items()
        }
        with Watch(with_env, builds, on_progress or (lambda _: None)) as watch:

            def each(member: Member) -> list[protocol.EnvReply]:
                try:
                    return self._install_on(member, run_id)
                finally:
                    watch.done(member.name)

            done = fleet.each(each, with_env, what="installing the job's environment failed")
        return done, self._problems(done)

    def _problems(self, done: Mapping[str, Sequence[protocol.EnvReply]]) -> list[str]:
        """Raises HostsFailed for what must stop the run; the warnings to print."""
        problems: list[HostError] = []
        warnings: list[str] = []
        for host, replies in done.items():
            for reply in replies:
                checked = f"{reply['venv']}/bin/python"
                found, said = interpreter_problems(host, reply["interpreters"], checked)
                problems += found
                warnings += said
        if problems:
            raise HostsFailed(problems)
        return warnings

    def _install_on(self, member: Member, run_id: str) -> list[protocol.EnvReply]:
        """The env op for each of the host's environments, in turn."""
        replies = []
        words = python_words(self.plan.tasks_on(member.name))
        for key, env in self.envs[member.name].items():
            house = env.wheelhouse
            request: protocol.EnvRequest = {
                "run_id": run_id,
                "hash": env.hash,
                "python": member.agent.python,
                "requirements": house.pinned.read_text()
                if house
                else env.spec.for_target(env.target),
                "wheels": [[w.file, w.sha256] for w in env.wheels] if house else [],
                "system_site_packages": env.identity.system_site_packages,
                "installer": env.identity.installer,
                "online": house is None,
                "words": words,
            }
            reply = member.agent.env(request, INSTALL_TIMEOUT_S)
            self.venvs.setdefault(member.name, {})[key] = reply["venv"]
            replies.append(reply)
        return replies

    def env_of(self, task: Task) -> HostEnv | None:
        """The task's environment (None: it runs on the host's python)."""
        host = next(h for h in self.plan.hosts if h.name == task.host)
        requirements = requirements_of(self.plan.job, host, task)
        if requirements is None:
            return None
        return self.envs.get(task.host, {}).get(_key(requirements))

    def runtime(self, task: Task) -> TaskRuntime:
        """What the task runs in: its environment's venv, or the host python's directory."""
        host = next(h for h in self.plan.hosts if h.name == task.host)
        requirements = requirements_of(self.plan.job, host, task)
        if requirements is not None and task.host in self.venvs:
            return TaskRuntime(host.python, venv=self.venvs[task.host][_key(requirements)])
        return TaskRuntime(host.python)

    def setup_runtime(self, host: Host) -> TaskRuntime:
        """What setup runs in on `host`: the host's environment (its or the job's
        requirements), else the host python's directory first on PATH."""
        venvs = self.venvs.get(host.name, {})
        if host.requirements is not None and _key(host.requirements) in venvs:
            return TaskRuntime(host.python, venv=venvs[_key(host.requirements)])
        return TaskRuntime(host.python)

    def lines(self, done: Mapping[str, Sequence[protocol.EnvReply]]) -> list[str]:
        """One line per outcome: built where (installer, seconds), reused where."""
        built = [
            f"{h} ({r['installer']}, {r['seconds']:.1f} s)"
            for h, rs in sorted(done.items())
            for r in rs
            if r["built"]
        ]
        reused = sorted({h for h, rs in done.items() for r in rs if not r["built"]})
        out = []
        if built:
            out.append(f"environment built on {', '.join(built)}")
        if reused:
            out.append(f"environment reused on {', '.join(reused)}")
        versions = sorted({r["python"] for rs in done.values() for r in rs})
        tf = sorted({r["tensorflow"] or "-" for rs in done.values() for r in rs})
        out.append(f"environment ok: python {'/'.join(versions)}, tensorflow {'/'.join(tf)}")
        return out


def cache_line() -> str:
    """What this machine's cache of environments holds, said when a resolution added to it:
    each requirements variant is an entry (their wheels shared), and nothing removes one but
    `prune --local`."""
    held, entries = wheelhouse.disk_use(cache_root())
    return (
        f"this machine's environment cache: {human_size(held)} in "
        f"{plural(entries, 'environment')} ({cache_root()}); `tfdeploy prune --local` frees "
        "what no recent run uses"
    )


def _key(requirements: Requirements) -> str:
    return requirements if isinstance(requirements, str) else "\n".join(requirements or ())


def with_extras(
    manifest: Manifest,
    extras: tuple[CodeFile, ...],
    needs: Mapping[str, frozenset[str]],
    hosts: Sequence[str],
) -> Manifest:
    """The push's manifest with `extras` among its contents (stored, not placed): each of
    `hosts` keeps what it needed before and what `needs` names for it, nothing else."""
    every = {f.sha256: f for f in (*manifest.extras, *extras)}
    merged = {h: manifest.needs.get(h, frozenset()) | needs.get(h, frozenset()) for h in hosts}
    return dataclasses.replace(
        manifest, extras=tuple(every[k] for k in sorted(every)), needs=merged
    )


def for_groups(manifest: Manifest, groups: Sequence[Sequence[str]]) -> Manifest:
    """Hosts sharing a workdir share a store, which their first host fills: it keeps what
    every host of its group needs."""
    if not manifest.needs:
        return manifest
    needs = dict(manifest.needs)
    for group in groups:
        needs[group[0]] = frozenset().union(*(manifest.needs.get(h, frozenset()) for h in group))
    return dataclasses.replace(manifest, needs=needs)


@dataclass(frozen=True)
class PlannedEnv:
    """What `plan` can say of one host's environment without asking the host: its hash and
    wheels where this machine knows the host's platform from an earlier `up` or `check`."""

    host: str
    requirements: str  # as written: a file name, or the requirement lines joined
    hash: str | None  # None: the host's platform is not known here yet
    platform: str | None
    wheels: int | None  # None: not resolved here yet
    size: int | None

    def line(self) -> str:
        if self.hash is None:
            return f"environment of {self.host} ({self.requirements}): resolved at up"
        state = (
            f"{plural(self.wheels, 'wheel')}, {human_size(self.size or 0)}, resolved here"
            if self.wheels is not None
            else "resolved at up"
        )
        head = f"environment of {self.host} ({self.requirements})"
        return f"{head}: {self.hash[:12]}, {self.platform}, {state}"


def planned_environments(plan: Plan) -> list[PlannedEnv]:
    """Every host's environments as far as this machine knows them (plan touches no host):
    the platform from the last `up`/`check` that reached the host (envs/known.py), the wheels
    from the resolver's cache. A requirements file that cannot be read is said, not raised."""
    job, hosts = plan.job, {h.name: h for h in plan.hosts}
    found: list[PlannedEnv] = []
    for name in sorted(uses_requirements(plan)):
        host = hosts[name]
        wanted = [requirements_of(job, host, t) for t in plan.tasks_on(name)]
        for requirements in dict.fromkeys([host.requirements, *wanted]):
            if requirements is None:
                continue
            said = requirements if isinstance(requirements, str) else ", ".join(requirements)
            target = known.recall(known.host_key(host.address, host.python))
            if target is None:
                found.append(PlannedEnv(name, said, None, None, None, None))
                continue
            digest = env_hash(spec_of(requirements, job.code), target)
            house = wheelhouse.load(cache_root() / digest, digest)
            found.append(
                PlannedEnv(
                    name,
                    said,
                    digest,
                    target.describe(),
                    len(house.wheels) if house else None,
                    house.size if house else None,
                )
            )
    return found


def _installer_word(choice: uv.Choice) -> str:
    """The env request's installer: "auto" for uv, so a uv binary that does not run there
    (platform facts that lied) falls back to pip rather than failing; else "pip"."""
    return "auto" if choice.installer == "uv" else "pip"
