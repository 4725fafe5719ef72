"""Hosts made ready for a run: preflight (facts checked, the plan decided), the push of the
code, and the job's setup commands; what recovery runs again for a replacement host."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Collection, Mapping, Sequence

from deployer.config.model import NetcheckMode
from deployer.core.fold import fold_names
from deployer.core.text import human_size, plural
from deployer.hosts.fleet import Fleet, Member
from deployer.hosts.gpus import GpuMonitor
from deployer.push.deliver import deliver
from deployer.push.sync import ByteMeter, Manifest, run_setup
from deployer.up.environment import Environments, uses_requirements, with_extras
from deployer.up.images import Images
from deployer.up.preflight import Claim, Findings, preflight
from deployer.up.records import host_fields, keep_record
from deployer.up.teardown import Teardown
from deployer.watch.progress import HostProgress, Progress, Ticker, sent_progress
from deployer.watch.runstate import RunState
from deployer.watch.view import Display


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
        self.images = Images(run.plan)  # checked after preflight (images.py)

    def preflight(self, *, keep_stand_ins: bool = False) -> Findings:
        names = fold_names([m.name for m in self.members], join=", ".join)
        self.view.step(f"preflight of {plural(len(self.members), 'host')}: {names}")
        claim = Claim(self.run.run_id, self.lease)
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
        return self._check_images(self._resolve_environment(findings))

    def _check_images(self, findings: Findings) -> Findings:
        """The job's images checked on every host (pulled there, or saved here and added to
        the push: images.py); nothing is sent when it fails, and the hosts drop the run."""
        self.images = Images(self.run.plan)
        if not self.images.any:
            return findings
        self.view.phase("checking the job's container image")
        try:
            with Ticker(self.view, Progress("checking the job's container image")):
                lines = self.images.check(self.fleet, self.members, self.run.run_id)
        except BaseException:
            self.fleet.each_settled(lambda m: m.agent.release(self.run.run_id), self.members)
            raise
        for line in lines:
            self.view.step(line)
        extras = findings.manifest.extras + self.images.extras()
        return dataclasses.replace(findings, manifest=with_extras(findings.manifest, extras))

    def _resolve_environment(self, findings: Findings) -> Findings:
        """The job's environment resolved for the hosts' platforms, its wheels added to the
        push (environment.py); nothing is sent when it fails, and the hosts drop the run."""
        plan = self.run.plan
        self.environment = Environments(plan, refresh=self.refresh_env)
        if not uses_requirements(plan):
            return findings
        self.view.phase("resolving the job's environment")
        try:
            with Ticker(self.view, Progress("resolving the job's environment")):
                lines = self.environment.resolve(findings.facts)
        except BaseException:
            self.fleet.each_settled(lambda m: m.agent.release(self.run.run_id), self.members)
            raise
        for line in lines:
            self.view.step(line)
        manifest = with_extras(findings.manifest, self.environment.extras())
        return dataclasses.replace(findings, manifest=manifest)

    def install_environment(self) -> None:
        """The `env` op on every host with requirements (a built env is reused at once): each
        task's interpreter from then on."""
        if self.environment.any:
            hosts = [m for m in self.members if m.name in self.environment.envs]
            self.view.phase(f"installing the job's environment on {plural(len(hosts), 'host')}")
            # Per host rows: the installer's numbers (wheels done of total) go to
            # `ticker.host(name, done=..., total=..., unit="wheels")` where it reports them.
            installing = Progress(
                "installing the job's environment",
                rows=tuple(HostProgress(m.name, state="installing") for m in hosts),
            )
            with Ticker(self.view, installing):
                done, warnings = self.environment.install(self.fleet, hosts, self.run.run_id)
            for line in [*(f"warning: {w}" for w in warnings), *self.environment.lines(done)]:
                self.view.step(line)
        loading = Progress("loading the job's image on the hosts that lack it")
        with Ticker(self.view, loading) if self.images.lacking() else contextlib.nullcontext():
            loaded = self.images.load(self.fleet, self.members, self.run.run_id)
        for line in loaded:
            self.view.step(line)
        self.run.interpreters = {
            t.name: {**self.environment.where(t), **self.images.where(t)}
            for t in self.run.plan.tasks
        }

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
        # The job's wheels travel with the code: stored, placed nowhere (environment.py).
        fields = {**host_fields(self.run.plan, self.run.run_id, self.lease), **manifest.fields()}
        self.view.phase(f"pushing the code to {plural(len(members), 'host')}")
        meter = ByteMeter()
        sending = Progress(
            f"sending the code to {plural(len(members), 'host')}",
            note=f"the code and wheels: {human_size(manifest.total_bytes)}; only what a "
            "host lacks travels",
        )
        with Ticker(self.view, sending) as ticker:
            ticker.refresh = lambda: sent_progress(sending, meter)
            pushing = deliver(
                self.fleet,
                members,
                self.run.plan,
                manifest,
                fields,
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
                m, self.run.run_id, job, manifest, self.environment.setup_where(m.host)
            ),
            members,
            what="setup failed",
        )
        skipped = [n for n, r in ran.items() if not r]
        if skipped:
            self.view.step(f"setup unchanged, skipped on {', '.join(skipped)}")
