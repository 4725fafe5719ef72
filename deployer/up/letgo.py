"""A run that outlives the `up` that started it, or is held by someone else while `up` watches.

`up --detach` lets the run go once every task started: to its keeper (handover.py), or with
`keeper = false` to its hosts alone, each told to drop the lease. An attached `up` whose policy
restarts hands the run to a keeper too (kept_attached), watches it and waits for the keeper's
end of a run that succeeded. Until the hand-over (preflight, push, start) the lease is `up`'s.
"""

from __future__ import annotations

from typing import Protocol

from deployer.core.errors import HostsFailed
from deployer.core.text import plural
from deployer.hosts.fleet import Fleet, Member
from deployer.up.handover import hand_over, keeper_alive, kept, kept_attached
from deployer.watch.guards import holder_guard
from deployer.watch.loop import Watch
from deployer.watch.runstate import RunState
from deployer.watch.view import Display


class Members(Protocol):
    """Where the run's hosts are now: recovery replaces a gone host's (prepare.py)."""

    @property
    def members(self) -> list[Member]: ...


class LetGo:
    """Who holds the run once it started: this `up`, its keeper, or (detached) its hosts.
    `gone` is set once `up` let the run go and returns: the run goes on without it."""

    def __init__(
        self, fleet: Fleet, run: RunState, watching: Watch, view: Display, hosts: Members
    ) -> None:
        self.fleet, self.run, self.watching, self.view, self.hosts = (
            fleet,
            run,
            watching,
            view,
            hosts,
        )
        self.gone = False

    @property
    def held_here(self) -> bool:
        """Whether this `up` holds the run's end (and tells it): not let go, not ended by the
        keeper of a kept run."""
        return not self.gone and not self.watching.holder_ended_run

    def detach(self) -> None:
        """`up --detach`, every task started: the run goes on without this machine, its
        failure policy with its keeper (or, with `keeper = false`, nowhere)."""
        plan, run_id = self.run.plan, self.run.run_id
        if kept(plan):
            where = self._hand_over()
            self.view.step(
                f"run {run_id} is running detached, kept by its keeper on {where}: its "
                f'failure policy (on_failure = "{plan.job.on_failure}") goes on without '
                "this machine"
            )
        else:
            self._drop_leases()
            self.view.step(f"run {run_id} is running detached")
        self.gone = True

    def _drop_leases(self) -> None:
        """The run now outlives this controller on every host (its lease is dropped). A host
        that cannot be told fails the `up`, and teardown stops the run: half of a run, left to
        lapse on one host, is no detached run."""
        members, run_id = self.hosts.members, self.run.run_id
        _, failures = self.fleet.each_settled(lambda m: m.agent.detach(run_id), members)
        if failures:  # raised before the teardown that stops them: `up` prints it after
            plan = self.run.plan
            tasks, hosts = plural(len(plan.tasks), "task"), plural(len(members), "host")
            started = f"{tasks} of run {run_id} had started on {hosts}, and were stopped"
            why = "a run detached on only some hosts is no detached run"
            raise HostsFailed(failures, what="detach failed", outcome=f"{started} ({why})")

    def keep_attached(self) -> None:
        """An attached run whose policy restarts, on the inventory's own hosts, is handed to a
        keeper as a detached one is (handover.py): its policy, lease and end go on when this
        machine sleeps, loses its network or `up` is killed; `up` watches and shows it, and
        Ctrl-C, SIGTERM, a closed terminal and `down` still stop it all (a whole-run stop ends
        the keeper first). Once per run: a restarted attempt keeps its keeper."""
        plan, run_id = self.run.plan, self.run.run_id
        if not kept_attached(plan) or self.watching.keeper_alive is not None:
            return
        where = self._hand_over()
        self.watching.keeper_alive = keeper_alive(self.fleet.member(where), run_id)
        self.watching.holder_guard = holder_guard([self.fleet.member(where)], run_id)
        self.view.step(
            f"run {run_id} is kept by its keeper on {where}: its failure policy (on_failure "
            f'= "{plan.job.on_failure}") and lease go on if this machine sleeps or this '
            "`up` dies; Ctrl-C stops it"
        )

    def _hand_over(self) -> str:
        """The run to its keeper, with its guards as they stand now (the cost spent so far):
        from here the keeper applies them. Returns the keeper's host."""
        guards = self.watching.guards
        return hand_over(
            self.fleet,
            self.hosts.members,
            self.run.plan,
            self.run.run_id,
            self.run.board.attempt,
            guards=guards.plan(self.watching.clock()) if guards is not None else None,
        )

    def await_keeper(self) -> None:
        """A kept run whose awaited tasks succeeded is ended by its keeper (the evaluators'
        grace, the servers' stop, its end told) before this `up` tears down what is left."""
        if self.watching.keeper_alive is not None:
            job = self.run.plan.job
            self.watching.await_holder_end(job.evaluator_grace + 2 * job.stop_grace + 10)
