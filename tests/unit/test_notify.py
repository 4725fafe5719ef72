"""[job.notify]: the inventory's table checked, and remote/notify.py's webhook POST and command
against a real loopback receiver and a real shell; a failure is said by the receiver's host
only (a webhook URL carries a token) and never raised."""

from __future__ import annotations

from pathlib import Path

import pytest

from deployer.config.inventory import load_inventory
from deployer.core.errors import InventoryError
from remote import notify
from tests.fakes.webhook import Receiver
from tests.support.helpers import JOB, load, write_toml

ONE_HOST = JOB + '[[hosts]]\naddress = "10.0.0.1"\ntasks = [{ role = "chief" }]\n'
DOC = notify.document("failed", "j-20261202T000000Z-abcd", "j", "keeper", outcome="failed")


def _with(table: str) -> str:
    return ONE_HOST.replace("[[hosts]]", f"[job.notify]\n{table}\n[[hosts]]", 1)


def test_the_table_names_a_webhook_a_command_and_which_events(tmp_path: Path) -> None:
    job = load(tmp_path, _with('webhook = "https://hooks.example.com/x"')).job
    assert job.notify is not None and job.notify.events == notify.EVENTS
    job = load(tmp_path, _with('command = "true"\nevents = ["failed"]')).job
    assert job.notify is not None and job.notify.events == ("failed",)
    for table, key in (
        ('webhook = "ftp://h/x"', "job.notify.webhook"),
        ('webhook = "https:///nohost"', "job.notify.webhook"),
        ('events = ["failed"]', "job.notify.webhook"),  # neither webhook nor command
        ('command = "true"\nevents = ["done"]', "job.notify.events"),
        ('hook = "x"', "job.notify.hook"),
    ):
        with pytest.raises(InventoryError) as info:
            load_inventory(write_toml(tmp_path, _with(table)))
        assert key in info.value.message, info.value.message


def test_a_webhook_gets_the_document_and_a_failing_one_is_said_by_its_host_only() -> None:
    with Receiver() as hook:
        assert notify.post(hook.url, DOC) is None
        assert hook.received == [DOC]
        hook.status = 500
        said = notify.post(hook.url, DOC)
        assert said == "the webhook at 127.0.0.1 answered HTTP 500"
    gone = notify.post(hook.url, DOC)  # the receiver is closed now
    assert gone is not None and "could not be reached" in gone and "SECRET" not in gone


def test_the_command_runs_with_the_event_in_its_environment(tmp_path: Path) -> None:
    out = tmp_path / "told"
    command = f'echo "$TFDEPLOY_EVENT $TFDEPLOY_RUN_ID $TFDEPLOY_OUTCOME" > {out}'
    assert notify.run_command(command, DOC) is None
    assert out.read_text() == "failed j-20261202T000000Z-abcd failed\n"
    said = notify.run_command("echo first >&2; echo 'no such tool' >&2; exit 3", DOC)
    assert said == "the command exited 3: no such tool"


def test_a_notifier_sends_only_the_events_asked_and_reports_through_said() -> None:
    heard: list[str] = []
    with Receiver(status=503) as hook:
        sender = notify.Notifier({"webhook": hook.url, "events": ["failed"]}, heard.append)
        sender.fire({**DOC, "event": "started"})
        sender.fire(DOC)
        sender.wait()
        assert [d["event"] for d in hook.received] == ["failed"]
    assert heard == ["notification failed: the webhook at 127.0.0.1 answered HTTP 503"]


def test_a_receiver_that_answers_garbage_is_said_not_raised() -> None:
    import socket
    import threading

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()

    def answer() -> None:
        conn, _ = server.accept()
        conn.recv(65536)
        conn.sendall(b"not http at all\r\n\r\n")
        conn.close()

    threading.Thread(target=answer, daemon=True).start()
    url = f"http://127.0.0.1:{server.getsockname()[1]}/hook/SECRET"
    said = notify.post(url, DOC)
    server.close()
    assert said is not None and said.startswith("the webhook at 127.0.0.1 could not be reached")
    assert "SECRET" not in said


def test_events_reach_the_receiver_in_the_order_they_happened() -> None:
    with Receiver() as hook:
        sender = notify.Notifier({"webhook": hook.url}, lambda _: None)
        for event in ("started", "recovered", "recovered", "finished"):
            sender.fire({**DOC, "event": event})
        sender.wait()
        assert [d["event"] for d in hook.received] == [
            "started",
            "recovered",
            "recovered",
            "finished",
        ]
