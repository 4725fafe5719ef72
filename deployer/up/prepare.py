"""Hosts made ready for a run: preflight (facts checked, the plan decided), the push of the
code, the job's setup commands and, with job.firewall, the TF ports closed to all but the
cluster; what recovery runs again for a replacement host."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Collection, Mapping, Sequence

from deployer.config.model import NetcheckMode
from deployer.core.errors import HostsFailed
from deployer.core.fold import fold_names
from deployer.core.text import plural
from deployer.envs import uses
from deployer.hosts.fleet import Fleet, Member
from deployer.hosts.gpus import GpuMonitor
from deployer.push.deliver import deliver
from deployer.push.sync import ByteMeter, Manifest, run_setup
from deployer.up import firewall, frameworkrule, tfrule
from deployer.up.environment import Environments, for_groups, uses_requirements, with_extras
from deployer.up.envprogress import InstallProgress
from deployer.up.images import Images
from deployer.up.preflight import Claim, Findings, preflight
from deployer.up.records import host_record, keep_record
from deployer.up.room import room_problems
from deployer.up.teardown import Teardown
from deployer.watch.progress import HostProgress, Progress, Ticker, sent_progress
from deployer.watch.runstate import RunState
from deployer.watch.view import Display, LiveView
from remote.protocol import HelloReply


class Preparation:
    """The run's hosts (`members`, which recovery replaces) made ready; `contacted_hosts`
    (shared with teardown) grows with every host the push reaches."""

    def __init__(
        self,
        fleet: Fleet,
        run: RunState,
        view: Display,
        teardown: Teardown,
        gpu_monitor: GpuMonitor,
        forwarded: Mapping[str, str],
        *,
        lease: float,
        netcheck: NetcheckMode | None,
        detached: bool,
        refresh_env: bool = False,
    ) -> None:
        self.fleet, self.run, self.view, self.teardown = fleet, run, view, teardown
        self.gpu_monitor, self.forwarded = gpu_monitor, forwarded
        self.lease, self.netcheck, self.detached = lease, netcheck, detached
        self.members = [fleet.member(h.name) for h in run.plan.hosts]
        self.contacted_hosts = teardown.contacted
        self.refresh_env = refresh_env
        self.environment = Environments(run.plan)  # resolved after preflight (environment.py)
        self._facts: Mapping[str, HelloReply] = {}  # the hellos', for tfrule
        self.images = Images(run.plan)  # checked after preflight (images.py)

    def preflight(self, *, keep_stand_ins: bool = False, resume: bool = False) -> Findings:
        """`resume` (`up --resume`): the hellos reopen the run's ended folder (preflight.Claim)."""
        names = fold_names([m.name for m in self.members], join=", ".join)
        self.view.step(f"preflight of {plural(len(self.members), 'host')}: {names}")
        claim = Claim(self.run.run_id, self.lease, resume)
        findings = preflight(
            self.run.plan,
            self.fleet,
            claim,
            forwarded=list(self.forwarded),
            network=self.netcheck,
            keep_stand_ins=keep_stand_ins,
        )
        self.run.adopt(findings.plan)  # GPU counts learnt from the hosts (gpus = "auto")
        self.gpu_monitor.hosts = set(findings.gpu_hosts)
        self.teardown.gpus_before = findings.gpu_reports  # its GPU proof compares with these
        for warning in findings.warnings:
            self.view.step(f"warning: {warning}")
        self.view.step(f"preflight ok: {findings.summary}")
        # What the hosts' facts decide, each a phase of its own: the environment resolved for
        # their platforms, the images checked on them; then one manifest with what each host
        # will store, the TensorFlow rule, and the room for it all.
        self._resolve_environment(findings.facts)
        self._check_images()
        findings = dataclasses.replace(findings, manifest=self._payload(findings.manifest))
        self._tensorflow(findings.facts)
        self._check_room(findings)
        return findings

    def _payload(self, manifest: Manifest) -> Manifest:
        """The push's manifest: the code, and the wheels and image layers each host stores
        (its own only), added to it once."""
        extras = (*self.environment.extras(), *self.images.extras())
        if not extras:
            return manifest
        wheels, layers = self.environment.needs(), self.images.needs()
        empty: frozenset[str] = frozenset()
        needs = {h: wheels.get(h, empty) | layers.get(h, empty) for h in {*wheels, *layers}}
        return with_extras(manifest, extras, needs, [m.name for m in self.members])

    def _tensorflow(
        self,
        facts: Mapping[str, HelloReply],
        installed: Mapping[str, Mapping[str, str | None]] | None = None,
        frameworks: frameworkrule.Installed | None = None,
    ) -> None:
        """The TensorFlow rule (tfrule.py) and the framework rule (frameworkrule.py) on every
        task known now: at preflight from the hosts' pythons, the resolved wheels and the
        images' trial containers; again after the install, from what each venv answered
        (`installed`: its TensorFlow, `frameworks`: its torch, jax, keras), which is how a venv
        of the hosts' own index is known at all, and from the trial after an image's load.
        Nothing has started either time; the hosts drop the run."""
        self._facts = facts
        plan = self.run.plan
        found = tfrule.known_versions(plan, facts, self.environment, self.images, installed)
        try:
            said = tfrule.check(plan.job, found)
            problems = frameworkrule.problems(
                plan, facts, self.environment, self.images, frameworks
            )
            if problems:
                raise HostsFailed(problems)
        except BaseException:
            self.fleet.each_settled(lambda m: m.agent.release(self.run.run_id), self.members)
            raise
        for line in said:
            self.view.step(f"warning: {line}")

    def _check_room(self, findings: Findings) -> None:
        """Room on each host for the wheels and layers it will store (room.py), before any
        byte is sent; the hosts drop the run when one lacks it."""
        problems = room_problems(self.fleet, self.members, findings)
        if problems:
            self.fleet.each_settled(lambda m: m.agent.release(self.run.run_id), self.members)
            raise HostsFailed(problems)

    def _check_images(self) -> None:
        """The job's images checked on every host (pulled there, or saved here for the push to
        carry: images.py); nothing is sent when it fails, and the hosts drop the run."""
        self.images = Images(self.run.plan)
        if not self.images.any:
            return
        self.view.phase("checking the job's container image")
        try:
            with Ticker(self.view, Progress("checking the job's container image")):
                lines = self.images.check(self.fleet, self.members, self.run.run_id)
        except BaseException:
            self.fleet.each_settled(lambda m: m.agent.release(self.run.run_id), self.members)
            raise
        for line in lines:
            self.view.step(line)
        uses.record([lay.path for lay in self.images.layouts.values()], self.run.run_id)

    def _resolve_environment(self, facts: Mapping[str, HelloReply]) -> None:
        """The job's environment resolved for the hosts' platforms, its wheels for the push to
        carry (environment.py); nothing is sent when it fails, and the hosts drop the run."""
        plan = self.run.plan
        self.environment = Environments(plan, refresh=self.refresh_env)
        if not uses_requirements(plan):
            return
        self.view.phase("resolving the job's environment")
        try:
            with Ticker(self.view, Progress("resolving the job's environment")):
                lines = self.environment.resolve(facts)
        except BaseException:
            self.fleet.each_settled(lambda m: m.agent.release(self.run.run_id), self.members)
            raise
        for line in lines:
            self.view.step(line)
        uses.record(self.environment.cache_entries(), self.run.run_id)

    def install_environment(self) -> None:
        """The `env` op on every host with requirements (a built env is reused at once): each
        task's interpreter from then on; then the TensorFlow and framework rules on what the
        venvs answered (and the images' trial containers, after a load)."""
        installed: dict[str, dict[str, str | None]] = {}
        frameworks: dict[str, dict[str, dict[str, str]]] = {}
        if self.environment.any:
            hosts = [m for m in self.members if m.name in self.environment.envs]
            self.view.phase(f"installing the job's environment on {plural(len(hosts), 'host')}")
            installing = Progress(
                "installing the job's environment",
                rows=tuple(HostProgress(m.name, state="installing") for m in hosts),
            )
            with Ticker(self.view, installing) as ticker:
                done, warnings = self.environment.install(
                    self.fleet,
                    hosts,
                    self.run.run_id,
                    lambda p: self._install_progress(ticker, p),
                )
            for line in [*(f"warning: {w}" for w in warnings), *self.environment.lines(done)]:
                self.view.step(line)
            installed = {h: {r["venv"]: r["tensorflow"] for r in rs} for h, rs in done.items()}
            frameworks = {
                h: {r["venv"]: r["frameworks"] for r in rs if "frameworks" in r}
                for h, rs in done.items()
            }
        loading = Progress("loading the job's image on the hosts that lack it")
        with Ticker(self.view, loading) if self.images.lacking() else contextlib.nullcontext():
            loaded = self.images.load(self.fleet, self.members, self.run.run_id)
        for line in loaded:
            self.view.step(line)
        self._tensorflow(self._facts, installed, frameworks)
        self.run.runtimes = {
            t.name: self.environment.runtime(t).in_container(self.images.container(t))
            for t in self.run.plan.tasks
        }

    def _install_progress(self, ticker: Ticker, progress: InstallProgress) -> None:
        """A host's install progress (wheels done of total) in its row of the progress display,
        and piped a plain line per host every few seconds (a terminal's live view draws the
        rows instead)."""
        ticker.host(progress.host, done=progress.installed, total=progress.total, unit="wheels")
        if not _is_live(self.view):
            self.view.step(progress.line())

    def push(
        self,
        manifest: Manifest,
        groups: Sequence[Sequence[str]] = (),
        empty_stores: Collection[str] = (),
        *,
        only: Sequence[Member] | None = None,
    ) -> None:
        """Code to every host (or `only` to these); hosts sharing a workdir get each content
        once, via the first; hosts with `empty_stores` are not asked what they lack."""
        members = self.members if only is None else list(only)
        keep_record(self.run.plan, self.run.run_id, detached=self.detached, view=self.view)
        # From here on a host may hold the run (and soon its setup processes): teardown asks them.
        self.contacted_hosts.update(m.name for m in members)
        # The job's wheels and layers travel with the code: stored, placed nowhere, each host
        # keeping its own (environment.py, images.py); a shared workdir's first host, its group's.
        record = host_record(self.run.plan, self.run.run_id, self.lease)
        manifest = for_groups(manifest, groups)
        self.view.phase(f"pushing the code to {plural(len(members), 'host')}")
        meter = ByteMeter()
        sending = Progress(
            f"sending the code to {plural(len(members), 'host')}",
            note=manifest.sending_note(),
        )
        with Ticker(self.view, sending) as ticker:
            ticker.refresh = lambda: sent_progress(sending, meter)
            pushing = deliver(
                self.fleet,
                members,
                self.run.plan,
                manifest,
                record,
                groups,
                empty_stores,
                meter=meter,
            )
        for line in pushing:
            self.view.step(line)

    def setup(self, manifest: Manifest, *, only: Sequence[Member] | None = None) -> None:
        job = self.run.plan.job
        if not job.setup:
            return
        members = self.members if only is None else list(only)
        commands = plural(len(job.setup), "command")
        self.view.step(f"setup ({commands}) on {plural(len(members), 'host')}")
        ran = self.fleet.each(
            lambda m: run_setup(
                m,
                self.run.run_id,
                job,
                manifest,
                self.environment.setup_runtime(m.host).setup_fields(),
            ),
            members,
            what="setup failed",
        )
        skipped = [n for n, r in ran.items() if not r]
        if skipped:
            self.view.step(f"setup unchanged, skipped on {', '.join(skipped)}")

    def firewall_up(self) -> None:
        """With job.firewall: TF ports accept only the cluster's addresses, before any start."""
        plan = self.run.plan
        if not plan.job.firewall:
            return
        self.teardown.firewalled = [m.name for m in self.members]  # a partial add is cleaned up too
        firewall.add(self.fleet, self.members, plan, self.run.run_id)
        self.view.step(
            f"firewall: TF ports accept only {', '.join(firewall.allowed_addresses(plan))}"
        )


def _is_live(view: object) -> bool:
    """Whether a LiveView draws the events (through the wrappers that mask, steady, adapt or
    defer a view: each holds the one it wraps as `view` or `_view`)."""
    for _ in range(8):
        if isinstance(view, LiveView):
            return True
        view = getattr(view, "view", None) or getattr(view, "_view", None)
        if view is None:
            return False
    return False
