"""job.artifacts brought home at the end of an attached `up`: after a success, after a failure
(a failed job's checkpoints are what debugging needs) and after Ctrl-C, once per `up`."""

from __future__ import annotations

import shlex

from deployer.hosts.fleet import Fleet
from deployer.results.pull import KEPT, artifacts_home, resume_command
from deployer.watch.runstate import RunState
from deployer.watch.view import Display


class ArtifactsPull:
    """The one pull of an `up`, from `hosts` (shared with the deployment, which adds to it).
    Nothing happens until `started` is set: no task, no artifact."""

    def __init__(self, fleet: Fleet, run: RunState, view: Display, hosts: set[str]) -> None:
        self.fleet, self.run, self.view, self.hosts = fleet, run, view, hosts
        self.started = False  # a start was sent: from here on tasks may have left artifacts
        self.tried = False  # one pull per `up`, even when it was cut short

    def tasks_started(self) -> None:
        """The start phase sent a start (StartPhase's on_start): from here on tasks may have
        left artifacts, and the pull has something to look for."""
        self.started = True

    def __call__(self) -> None:
        """job.artifacts home, once the tasks are stopped (a failure is a line: see
        artifacts_home). Nothing to say when no task was started (Ctrl-C during the push or
        setup). Once per `up`: Ctrl-C or a signal during the pull stops it, keeping what
        arrived, says how to fetch the rest and is raised; it never starts it again."""
        if not self.started or self.tried:
            return
        self.tried = True
        job, run_id = self.run.plan.job, self.run.run_id
        try:
            lines = artifacts_home(self.fleet, job, run_id, self.hosts)
        except KeyboardInterrupt:
            again = resume_command(run_id, job.artifacts, job.artifacts_to)
            self.view.step(f"artifacts pull interrupted: {KEPT}: {again}")
            raise
        for line in lines:
            self.view.step(line)

    def after_failure(self) -> None:
        """The pull after a failed job: Ctrl-C (or a signal) during it skips it, and the
        failure being raised still says which task failed."""
        try:
            self()
        except KeyboardInterrupt:
            job = self.run.plan.job
            patterns = " ".join(shlex.quote(p) for p in job.artifacts)
            to = shlex.quote(job.artifacts_to)
            self.view.step(
                f"artifacts: the pull was interrupted; `tfdeploy pull {self.run.run_id} "
                f"{patterns} --to {to}` fetches them later"
            )
