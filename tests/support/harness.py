"""`up` in-process: one Deployment on scripted hosts (tests/support/fakehost.py), a fake clock."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from deployer.hosts.fleet import Fleet
from deployer.up.deployment import Deployment, UpOptions
from tests.support.fakehost import FakeClock, FakeFleetHosts, RecordingView
from tests.support.helpers import JOB, plan

TWO_WORKERS = (
    JOB
    + """
[[hosts]]
name = "a"
address = "192.0.2.1"
tasks = [{ role = "worker" }]

[[hosts]]
name = "b"
address = "192.0.2.2"
tasks = [{ role = "worker" }]
"""
)


class Harness:
    """One deployment on fake hosts; `script(now)` runs at every sleep of the deployment."""

    def __init__(self, tmp_path: Path, text: str, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("TFDEPLOY_STATE_DIR", str(tmp_path / "state"))
        self.clock = FakeClock()
        self.hosts = FakeFleetHosts(self.clock)
        self.plan = plan(tmp_path, text)
        self.view = RecordingView()

    def run(self, script: Callable[[float], None], **options: object) -> int:
        self.clock.on_sleep = script
        opts = UpOptions(poll_interval=1.0, poll_wait=0.05, **options)  # type: ignore[arg-type]
        with Fleet(self.plan.hosts, connect=self.hosts.connect) as fleet:
            deployment = Deployment(
                self.plan, fleet, self.view, opts, clock=self.clock, sleep=self.clock.sleep
            )
            self.deployment = deployment
            return deployment.run()

    def check(self, **options: object) -> int:
        """`tfdeploy check` of the plan on the fake hosts."""
        opts = UpOptions(poll_interval=1.0, poll_wait=0.05, **options)  # type: ignore[arg-type]
        with Fleet(self.plan.hosts, connect=self.hosts.connect) as fleet:
            self.deployment = Deployment(
                self.plan, fleet, self.view, opts, clock=self.clock, sleep=self.clock.sleep
            )
            return self.deployment.check()

    def at(self, t: float, action: Callable[[], None]) -> Callable[[float], None]:
        """A script doing `action` once, when the clock first reaches start + t."""
        start, done = self.clock.now, []

        def script(now: float) -> None:
            if not done and now >= start + t:
                done.append(True)
                action()

        return script
