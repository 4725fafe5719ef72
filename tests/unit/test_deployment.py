"""`up` in-process on scripted hosts and a fake clock: the phases and the rules they apply.

The hosts are tests/support/fakehost.py's (the agent protocol answered from a script); everything
above the wire is the real code. Time moves only when the deployment sleeps, so "6 s without
contact" is exact and the whole file runs in about a second.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from deployer.core.errors import HostsFailed, Interrupted, JobFailed
from deployer.core.text import human_size
from tests.support.fakehost import RecordingView
from tests.support.harness import TWO_WORKERS, Harness
from tests.support.helpers import JOB


def both(*scripts: Callable[[float], None]) -> Callable[[float], None]:
    def script(now: float) -> None:
        for s in scripts:
            s(now)

    return script


def test_a_job_that_succeeds_shows_every_line_and_stops_every_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = Harness(tmp_path, TWO_WORKERS, monkeypatch)
    a, b = h.hosts["a"], h.hosts["b"]

    def finish() -> None:
        a.write("worker:0", "epoch 1\r\x1b[2Kepoch 1 done\nbye")
        b.write("worker:1", "héllo\n")
        a.exit("worker:0")
        b.exit("worker:1")

    assert h.run(h.at(3, finish)) == 0
    assert h.view.output == [
        "worker:0@a | epoch 1 done",
        "worker:0@a | bye",  # the unterminated last line, once the task ended
        "worker:1@b | héllo",
    ]
    assert [len(host.ops("stop")) for host in (a, b)] == [1, 1]
    run_id = h.deployment.run_id
    env = a.tasks["worker:0"].env
    assert env["TFDEPLOY_RUN_ID"] == run_id and env["TFDEPLOY_TASK"] == "worker:0"
    assert "job succeeded: worker:0 and worker:1 exited 0" in h.view.steps
    assert (tmp_path / "state" / "runs" / f"{run_id}.json").is_file()
    assert h.view.closed


def test_the_first_failure_is_reported_not_its_consequences(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = Harness(tmp_path, TWO_WORKERS, monkeypatch)
    a, b = h.hosts["a"], h.hosts["b"]

    def fail() -> None:
        b.write("worker:1", "Traceback...\nValueError: bad shape\n")
        b.exit("worker:1", 1)
        h.clock.now += 2  # its peer notices ~2 s later (TF's UnavailableError)
        a.write("worker:0", "UnavailableError: peer gone\n")
        a.exit("worker:0", 1)

    with pytest.raises(JobFailed) as info:
        h.run(h.at(5, fail))
    assert info.value.message.startswith("worker:1@b failed (exit code 1); its last 2 log lines:")
    assert "ValueError: bad shape" in info.value.message
    assert info.value.hint is not None and info.value.hint.startswith("the other tasks were")


def test_a_single_task_job_does_not_mention_other_tasks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = JOB + '[[hosts]]\nname = "a"\naddress = "192.0.2.1"\ntasks = [{ role = "worker" }]\n'
    h = Harness(tmp_path, text, monkeypatch)
    a = h.hosts["a"]

    def fail() -> None:
        a.write("worker:0", "oops\n")
        a.exit("worker:0", 2)

    with pytest.raises(JobFailed) as info:
        h.run(h.at(2, fail))
    assert "its last 1 log line:\n    oops" in info.value.message
    assert info.value.hint == f"full log: tfdeploy logs {h.deployment.run_id} --task worker:0"


@pytest.mark.parametrize(
    ("silent_for", "lost"),
    [(5.0, False), (7.0, True)],  # HOST_LOSS_S = 6: an outage below it, a loss past it
)
def test_a_host_that_stops_answering_is_an_outage_then_a_loss(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, silent_for: float, lost: bool
) -> None:
    h = Harness(tmp_path, TWO_WORKERS, monkeypatch)
    a, b = h.hosts["a"], h.hosts["b"]
    cut: list[float] = []

    def script(now: float) -> None:
        if not cut and now >= 1010:
            cut.append(now)
            b.refusing = "connection refused"
        elif cut and b.refusing and now >= cut[0] + silent_for:
            b.refusing = None  # back (or too late)
        if now >= 1030:
            a.exit("worker:0")
            b.exit("worker:1")

    if lost:
        with pytest.raises(JobFailed) as info:
            h.run(script)
        assert info.value.message.startswith("host b was lost: no contact for 6.0 s")
        assert [len(a.ops("stop")), len(b.ops("stop"))] == [1, 0]  # a lost host is not waited for
    else:
        assert h.run(script) == 0
        assert "contact with b is back; logs resume where they stopped" in h.view.steps
    outages = [s for s in h.view.steps if s.startswith("no answer from b")]
    assert outages == ["no answer from b (connection refused); retrying for up to 6 s"]


def test_a_failed_worker_is_restarted_until_max_restarts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `up`'s own policy (keeper = false; a keeper's: tests/integration/test_keeper.py)
    text = TWO_WORKERS.replace(
        "[job]\n", '[job]\non_failure = "restart"\nmax_restarts = 1\nkeeper = false\n'
    )
    text += '\n[[hosts]]\nname = "p"\naddress = "192.0.2.3"\ntasks = [{ role = "ps" }]\n'
    h = Harness(tmp_path, text, monkeypatch)
    b = h.hosts["b"]
    crashes: list[float] = []

    def crash_twice(now: float) -> None:
        if b.tasks["worker:1"].state == "running" and now >= 1005 + 5 * len(crashes):
            crashes.append(now)
            b.exit("worker:1", signal=9, code=-9)

    with pytest.raises(JobFailed) as info:
        h.run(crash_twice)
    assert len(crashes) == 2
    assert len(b.ops("start")) == 2  # the first start, one restart
    assert "restarting worker:1@b (killed by signal 9): restart 1 of 1" in h.view.steps
    assert info.value.message.startswith("worker:1@b failed after 1 restart (killed by signal 9)")


def test_a_silent_job_is_stopped_by_the_stall_watchdog(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = TWO_WORKERS.replace("[job]\n", "[job]\nstall_timeout = 30\n")
    h = Harness(tmp_path, text, monkeypatch)
    a = h.hosts["a"]

    def chatty_a_until_10(now: float) -> None:
        if now < 1010:
            a.write("worker:0", "step\n")

    with pytest.raises(JobFailed) as info:
        h.run(chatty_a_until_10)
    message = info.value.message
    assert message.startswith("job stalled: no awaited task (worker:0, worker:1)")
    assert "silent for 30 s or more: worker:0@a, worker:1@b" in message
    assert 1039 <= h.clock.now <= 1042  # 30 s after the last line, within a tick


def test_a_run_stopped_from_elsewhere_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = Harness(tmp_path, TWO_WORKERS, monkeypatch)
    a = h.hosts["a"]
    with pytest.raises(JobFailed) as info:
        h.run(h.at(4, lambda: a._op_stop({})))  # what `tfdeploy down` from another shell does
    assert info.value.message.startswith(
        f"run {h.deployment.run_id} was stopped from elsewhere (`tfdeploy down` or another "
        "controller): worker:0@a was stopped by tfdeploy"
    )


@pytest.mark.parametrize(("signum", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_an_interrupt_stops_every_host_and_exits_128_plus_the_signal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, signum: int, status: int
) -> None:
    h = Harness(tmp_path, TWO_WORKERS, monkeypatch)

    class Signalled(KeyboardInterrupt):
        """What the CLI's handlers raise for SIGTERM/SIGHUP (errors.Terminated)."""

        def __init__(self) -> None:
            super().__init__()
            self.signum = signum

    def interrupt() -> None:
        raise Signalled() if signum != signal.SIGINT else KeyboardInterrupt()

    with pytest.raises(Interrupted) as info:
        h.run(h.at(3, interrupt))
    assert info.value.exit_status == status
    assert all(len(host.ops("stop")) == 1 for host in h.hosts.hosts.values())
    assert all(
        t.reason == "stopped" for host in h.hosts.hosts.values() for t in host.tasks.values()
    )


def test_a_busy_port_fails_preflight_and_nothing_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = Harness(tmp_path, TWO_WORKERS, monkeypatch)
    h.hosts["b"].facts["busy_ports"] = [23300]
    with pytest.raises(HostsFailed) as info:
        h.run(lambda now: None)
    assert "b: TF port(s) 23300 already in use" in info.value.message
    assert all(not host.ops("start") and not host.ops("stop") for host in h.hosts.hosts.values())


def test_ports_reserved_by_another_run_fail_preflight_and_ours_are_released(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two `up` of one inventory at once: the second finds the first's reservation."""
    h = Harness(tmp_path, TWO_WORKERS, monkeypatch)
    h.hosts["b"].reserved[2222] = "sig-20261123-000000-abcd"
    with pytest.raises(HostsFailed) as info:
        h.run(lambda now: None)
    assert "b: TF port(s) 2222 already in use: reserved by run sig-20261123" in info.value.message
    assert "tfdeploy down sig-20261123-000000-abcd" in (info.value.hint or "")
    a = h.hosts["a"]
    assert a.ops("hello")[0]["run_id"] == h.deployment.run_id
    assert a.ops("release") and a.reserved == {}  # nothing of ours will start: let go
    assert h.hosts["b"].reserved == {2222: "sig-20261123-000000-abcd"}
    assert not a.ops("start") and not h.hosts["b"].ops("start")


def test_a_finished_run_leaves_no_reservation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = Harness(tmp_path, TWO_WORKERS, monkeypatch)
    a, b = h.hosts["a"], h.hosts["b"]

    def finish() -> None:
        a.exit("worker:0")
        b.exit("worker:1")

    def started() -> None:  # the task holds its port now; its start let the reservation go
        assert a.ops("start")[-1].get("release") and a.reserved == {}
        assert not a.ops("release")  # in the same request: no round trip of its own

    assert h.run(both(h.at(1, started), h.at(2, finish))) == 0
    assert a.ops("hello")[0]["ports"] == [2222]
    assert all(host.reserved == {} for host in h.hosts.hosts.values())


def test_hosts_sharing_a_workdir_get_each_content_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = Harness(tmp_path, TWO_WORKERS, monkeypatch)
    (tmp_path / "code" / "model.py").write_bytes(b"x" * 5000)
    a, b = h.hosts["a"], h.hosts["b"]
    b.store = a.store  # one NFS home: one content store
    b.facts["shared_with"] = [a.facts["host_id"]]

    def finish() -> None:
        a.exit("worker:0")
        b.exit("worker:1")

    assert h.run(h.at(2, finish)) == 0
    assert a.received_bytes >= 5000 and b.received_bytes == 0
    assert "a and b share one workdir: each file is sent once" in h.view.steps
    assert b.ops("materialize")  # b still builds its own run directory from the store


@pytest.mark.names_tf(reason="fake hosts: the ps is a plan's task, never started")
def test_a_ps_that_never_listens_misses_the_start_deadline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = TWO_WORKERS.replace("[job]\n", "[job]\nstart_timeout = 20\n") + (
        '\n[[hosts]]\nname = "p"\naddress = "192.0.2.3"\ntasks = [{ role = "ps" }]\n'
    )
    text = text.replace(
        'command = "python3 train.py"',
        'command = "python3 train.py"\n[job.role_commands]\nps = "tfdeploy:server"',
        1,
    )
    h = Harness(tmp_path, text, monkeypatch)
    h.hosts["p"].listen_on_start = False
    with pytest.raises(JobFailed) as info:
        h.run(lambda now: None)
    assert info.value.message.startswith(
        "ps:0 did not accept connections on its TF port within 20 s (start_timeout)"
    )
    assert not h.hosts["a"].ops("start")  # workers wait for the ps: never started
    assert len(h.hosts["p"].ops("stop")) == 1


def _pushed(view: RecordingView) -> str:
    return next(s for s in view.steps if s.startswith("pushed "))


def _both_exit(h: Harness) -> Callable[[], None]:
    """What makes the job on TWO_WORKERS succeed: both workers exit 0."""

    def finish() -> None:
        for host, task in (("a", "worker:0"), ("b", "worker:1")):
            h.hosts[host].exit(task)

    return finish


def test_a_first_push_sends_at_once_to_hosts_whose_store_is_empty(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A host whose hello said its store is empty lacks every content: its first request after
    preflight carries them, with no `materialize or_missing` round trip before. Once it holds
    something it is asked again (a re-deploy of unchanged code is that one request)."""
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "train.py").write_text("print('hi')\n")
    h = Harness(tmp_path, TWO_WORKERS, monkeypatch)

    finish = _both_exit(h)

    h.run(h.at(1, finish))
    for host in ("a", "b"):
        [first] = h.hosts[host].ops("materialize")
        assert first.get("blobs") and not first.get("or_missing"), first
        assert not h.hosts[host].ops("have")
    h.run(h.at(1, finish))
    again = h.hosts["a"].ops("materialize")[1]
    assert again.get("or_missing") and not again.get("blobs"), again


def test_a_push_says_what_was_already_there_only_when_something_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """First push: everything travels, nothing is said to be there (it said "the rest already
    there"); second: nothing travels; a file changed: only it travels, and the rest was there."""
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "train.py").write_text("print('hi')\n")
    (tmp_path / "code" / "data.txt").write_text("1 2 3\n")
    h = Harness(tmp_path, TWO_WORKERS, monkeypatch)

    finish = _both_exit(h)

    h.run(h.at(1, finish))
    first = h.hosts["a"].received_bytes
    assert first == len("print('hi')\n1 2 3\n")
    assert _pushed(h.view).startswith(
        f"pushed 2 files to 2 hosts: {human_size(2 * first)} sent (4 files) (run "
    )
    h.view = RecordingView()
    a = h.hosts["a"]
    asked = (len(a.ops("have")), len(a.ops("materialize")))
    h.run(h.at(1, finish))
    assert a.received_bytes == first
    assert _pushed(h.view).startswith(
        "pushed 2 files to 2 hosts: 0 bytes sent, every file was already there"
    )
    # Unchanged code: one materialize builds the run, no `have` before it (one round trip).
    assert (len(a.ops("have")), len(a.ops("materialize"))) == (asked[0], asked[1] + 1)
    changed = "4 5 6 7\n"
    (tmp_path / "code" / "data.txt").write_text(changed)
    h.view = RecordingView()
    h.run(h.at(1, finish))
    assert h.hosts["a"].received_bytes == first + len(changed)
    assert _pushed(h.view).startswith(
        f"pushed 2 files to 2 hosts: {human_size(2 * len(changed))} sent (2 files), "
        "the rest already there"
    )


@pytest.mark.parametrize("required", [True, False])
def test_a_host_without_tensorflow_fails_preflight_unless_the_job_says_it_needs_none(
    required: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = TWO_WORKERS.replace("[job]\n", f"[job]\nrequire_tensorflow = {str(required).lower()}\n")
    h = Harness(tmp_path, text, monkeypatch)
    h.hosts["b"].facts["tensorflow"] = None
    h.hosts["a"].facts["tensorflow"] = None
    if required:
        with pytest.raises(HostsFailed) as info:
            h.run(lambda now: None)
        assert "b: TensorFlow is not installed for python3" in info.value.message
        assert "require_tensorflow = false" in (info.value.hint or "")
        return

    def finish() -> None:
        h.hosts["a"].exit("worker:0")
        h.hosts["b"].exit("worker:1")

    assert h.run(h.at(2, finish)) == 0


# ---- artifacts when `up` is cut short (issue 28 item 13) --------------------------------------

ARTIFACTS = TWO_WORKERS.replace("[job]\n", '[job]\nartifacts = ["ckpt/*"]\n')


def interrupt_on(op: str) -> Callable[..., object]:
    def handler(req: object) -> object:
        raise KeyboardInterrupt  # Ctrl-C while this call was in flight

    return handler


@pytest.mark.parametrize("op", ["materialize", "setup"])
def test_an_interrupted_push_or_setup_says_nothing_of_artifacts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, op: str
) -> None:
    """`artifacts were not pulled: no host ... knows run` after Ctrl-C during the push: no task
    was started, so there is nothing to pull and nothing to say about it."""
    text = ARTIFACTS.replace("[job]\n", '[job]\nsetup = ["true"]\n')
    h = Harness(tmp_path, text, monkeypatch)
    monkeypatch.setattr(h.hosts["b"], f"_op_{op}", interrupt_on(op))
    with pytest.raises(Interrupted):
        h.run(lambda now: None)
    assert not [s for s in h.view.steps if "artifact" in s], h.view.steps
    assert not h.hosts["a"].ops("collect")


def test_ctrl_c_during_the_artifacts_pull_of_a_failed_job_still_names_the_task(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = Harness(tmp_path, ARTIFACTS, monkeypatch)
    a, b = h.hosts["a"], h.hosts["b"]
    monkeypatch.setattr(a, "_op_collect", interrupt_on("collect"))
    raised: BaseException | None = None
    try:
        h.run(h.at(3, lambda: b.exit("worker:1", 1)))
    except BaseException as exc:  # the bug: a bare KeyboardInterrupt, the failure lost
        raised = exc
    assert isinstance(raised, JobFailed), repr(raised)
    assert raised.message.startswith("worker:1@b failed (exit code 1)")
    run_id = h.deployment.run_id
    said = f"artifacts: the pull was interrupted; `tfdeploy pull {run_id} 'ckpt/*' --to "
    assert any(s.startswith(said) for s in h.view.steps), h.view.steps


def test_artifacts_to_under_home_is_expanded_and_shown_as_it_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`artifacts_to = "~/arts"` made a folder named `~` in the working directory."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    h = Harness(
        tmp_path, ARTIFACTS.replace("[job]\n", '[job]\nartifacts_to = "~/arts"\n'), monkeypatch
    )
    a, b = h.hosts["a"], h.hosts["b"]

    def end() -> None:
        a.files = {"worker:0": {"ckpt/m.bin": b"weights"}}
        a.exit("worker:0")
        b.exit("worker:1")

    assert h.run(h.at(3, end)) == 0
    home = tmp_path / "home" / "arts" / h.deployment.run_id
    assert (home / "worker-0" / "ckpt" / "m.bin").read_bytes() == b"weights"
    assert not (tmp_path / "~").exists()
    assert any(s.startswith(f"artifacts: pulled 1 file into {home}") for s in h.view.steps)


def test_a_failed_detach_says_what_was_started_and_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 47: the error said `detach failed on 1 host; nothing was started` after both
    tasks had started, and teardown had just stopped them."""
    from deployer.core.errors import HostError

    # Dropping the lease is how a run nobody keeps detaches (keeper = false).
    h = Harness(tmp_path, TWO_WORKERS.replace("[job]\n", "[job]\nkeeper = false\n"), monkeypatch)
    a, b = h.hosts["a"], h.hosts["b"]

    def refuse(req: object) -> object:
        raise HostError("b", "the disk is full")

    monkeypatch.setattr(b, "_op_detach", refuse)
    with pytest.raises(HostsFailed) as failed:
        h.run(lambda now: None, detach=True)
    message = failed.value.message
    run_id = h.deployment.run_id
    assert "nothing was started" not in message, message
    assert message.startswith(
        f"detach failed on 1 host; 2 tasks of run {run_id} had started on 2 hosts, and were "
        "stopped (a run detached on only some hosts is no detached run):"
    ), message
    assert [len(host.ops("stop")) for host in (a, b)] == [1, 1]  # what it says happened
