"""The control side's pure rules as tables: no hosts, no threads, no real clock.

Each rule is what lifecycle.py acts on: when a slow host becomes a lost one, which failure is the
root cause, whether a task is restarted, when a job is stalled, how log bytes become lines, how a
push is batched, when a setup re-runs.
"""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import pytest

from deployer.config.plan import Plan
from deployer.core.errors import HostError, InventoryError
from deployer.core.lines import MARKER, MAX_LINE, LineAssembler, clean
from deployer.core.secrets import MASK, mask_text, masked
from deployer.core.text import join_names, plural, size
from deployer.hosts.reply_types import TaskStatus
from deployer.push.sync import READ_BYTES, CodeFile, Manifest, _contents, setup_fingerprint
from deployer.results.state import RUN_ID, new_run_id
from deployer.up.start import start_groups
from deployer.watch.board import TaskBoard, may_restart
from deployer.watch.contact import HOST_LOSS_S, HostContact
from tests.support.helpers import JOB, plan

pytestmark = pytest.mark.names_tf(
    reason="reads and plans inventories with tfdeploy:server tasks; starts none"
)

# ---- hosts: outage or loss -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("last_contact", "now", "failed", "silent", "outage", "lost"),
    [
        (100.0, 101.0, True, False, True, False),  # a failed poll: an outage, told once
        (100.0, 101.0, False, True, False, False),  # merely slow: no message at all
        (100.0, 100.0 + HOST_LOSS_S - 0.01, True, False, True, False),
        (100.0, 100.0 + HOST_LOSS_S, True, False, False, True),  # the threshold itself: lost
        (100.0, 100.0 + HOST_LOSS_S, False, True, False, True),  # unanswered that long: lost
    ],
)
def test_host_contact_tells_outage_from_loss(
    last_contact: float, now: float, failed: bool, silent: bool, outage: bool, lost: bool
) -> None:
    contact = HostContact()
    contact.reached("h", last_contact)
    failures = [HostError("h", "connection refused")] if failed else []
    verdict = contact.judge(failures, ["h"] if silent else [], now)
    assert bool(verdict.outages) == outage
    assert (verdict.loss is not None) == lost
    if lost:
        assert verdict.loss is not None and verdict.loss.since == pytest.approx(now - 100.0)
        assert "h" in contact.lost


def test_an_outage_is_told_once_and_its_end_once() -> None:
    contact = HostContact()
    contact.reached("h", 0.0)
    failure = [HostError("h", "reset")]
    assert len(contact.judge(failure, [], 1.0).outages) == 1
    assert contact.judge(failure, [], 2.0).outages == ()
    assert contact.reached("h", 3.0) is True  # worth a "contact is back"
    assert contact.reached("h", 4.0) is False


def test_a_host_never_reached_counts_from_its_first_failure() -> None:
    contact = HostContact()
    assert contact.judge([HostError("h", "x")], [], 50.0).loss is None
    assert contact.judge([HostError("h", "x")], [], 50.0 + HOST_LOSS_S).loss is not None


# ---- tasks: first failure, restarts, stalls ------------------------------------------------

PSS = (
    JOB
    + """
[job.role_commands]
ps = "tfdeploy:server"

[[hosts]]
name = "a"
address = "192.0.2.1"
tasks = [{ role = "chief" }, { role = "worker", count = 2 }, { role = "ps" }]
"""
)


def status(name: str, state: str = "exited", **fields: object) -> TaskStatus:
    return TaskStatus(name=name, state=state, **fields)  # type: ignore[arg-type]


@pytest.fixture
def pss_plan(tmp_path: Path) -> Plan:
    return plan(tmp_path, PSS)


@pytest.fixture
def pss(pss_plan: Plan) -> TaskBoard:
    return TaskBoard(pss_plan.tasks)


def test_the_earliest_failure_is_the_root_cause(pss: TaskBoard) -> None:
    awaited = ["chief:0", "worker:0", "worker:1"]
    pss.update(
        [status("worker:1", exit_code=1, ended=20.0), status("chief:0", exit_code=1, ended=10.0)]
    )
    assert pss.first_failure(awaited) == "chief:0"
    pss.update([status("ps:0", signal=9, ended=5.0)])  # a server the others depend on counts too
    assert pss.first_failure(awaited) == "ps:0"


def test_successes_and_running_tasks_are_no_failure(pss: TaskBoard) -> None:
    pss.update([status("worker:0", exit_code=0, ended=1.0), status("worker:1", "running")])
    assert pss.first_failure(["worker:0", "worker:1"]) is None


@pytest.mark.parametrize(
    ("policy", "role", "restarts", "reason", "expected"),
    [
        ("restart", "worker", 0, None, True),
        ("restart", "ps", 2, None, True),
        ("restart", "worker", 3, None, False),  # max_restarts used up
        ("restart", "chief", 0, None, False),  # a chief is not restarted alone
        ("restart", "worker", 0, "stopped", False),  # stopped on purpose
        ("restart", "worker", 0, "lease expired", False),
        ("teardown", "worker", 0, None, False),
    ],
)
def test_restart_decisions(
    pss_plan: Plan,
    pss: TaskBoard,
    policy: str,
    role: str,
    restarts: int,
    reason: str | None,
    expected: bool,
) -> None:
    name = {"worker": "worker:0", "ps": "ps:0", "chief": "chief:0"}[role]
    watch = pss[name]
    watch.restarts = restarts
    pss.update([status(name, exit_code=1, reason=reason)])
    job = dataclasses.replace(pss_plan.job, on_failure=policy)
    assert may_restart(watch, job) is expected


def test_stall_verdict_names_the_silent_and_the_frozen(pss: TaskBoard) -> None:
    awaited = ["chief:0", "worker:0", "worker:1"]
    pss.update([status(n, "running") for n in awaited] + [status("ps:0", "running", frozen=True)])
    pss.start_stall_clock(100.0)
    pss.note_activity(100.0)
    assert pss.stalled(awaited, 30.0, 129.9) is None
    assert pss.stalled(awaited, None, 1e9) is None  # no watchdog configured
    pss.update([status("chief:0", "running", log_bytes=10)])
    pss.note_activity(120.0)  # the chief wrote: the job is alive until 150
    assert pss.stalled(awaited, 30.0, 149.0) is None
    verdict = pss.stalled(awaited, 30.0, 150.0)
    assert verdict is not None
    assert "for 30 s (stall_timeout = 30 s)" in verdict
    assert "silent for 30 s or more: chief:0@a, worker:0@a, worker:1@a" in verdict
    assert "frozen (stopped by a signal, e.g. SIGSTOP): ps:0@a" in verdict


def test_tasks_start_in_tensorflows_order(tmp_path: Path) -> None:
    groups = start_groups(plan(tmp_path, PSS))
    assert [[t.name for t in g] for g in groups] == [
        ["ps:0"],
        ["worker:0", "worker:1"],
        ["chief:0"],
    ]


# ---- log bytes to lines ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("10%\r50%\r100%", "100%"),  # progress bar: the final state only
        ("abc\b\bX", "aX"),
        ("\x1b[1;32mgreen\x1b[0m", "green"),
        ("\x1b]0;a title\x07text", "text"),  # a terminal-title escape (OSC) vanishes whole
        ("tab\there  ", "tab\there"),
        ("\r", ""),
        ("\u009d0;PWNED-TITLE\u009ctext", "text"),  # OSC ... ST in their C1 forms
        ("a\u009b2Jb", "ab"),  # C1 CSI: clear the screen
        ("\u0090q payload\u009c!", "!"),  # C1 DCS
        ("x\x1b]52;c;aGk=\x1b\\y\x1b[2J", "xy"),  # OSC 52 writes the clipboard
        ("\u0085nel\u0080", "nel"),  # any other C1 control goes alone
        ("30\u00b0C \u00b11 \u00a0\u00e9", "30\u00b0C \u00b11 \u00a0\u00e9"),  # 0xC2-led, printable
        # Issue 47: what hides or reorders text is marked, never passed (nor silently dropped)
        ("evil\u202egnp.exe", "evil\ufffdgnp.exe"),  # right-to-left override
        ("a\u2066b\u2069c\u202ad\u202ce", "a\ufffdb\ufffdc\ufffdd\ufffde"),  # isolates, embeddings
        ("l\u200er\u200fa\u061c", "l\ufffdr\ufffda\ufffd"),  # direction marks
        ("ze\u200bro\u200c\u200d\u2060\ufeff", "ze\ufffdro\ufffd\ufffd\ufffd\ufffd"),  # zero-width
        ("one\u2028two\u2029", "one\ufffdtwo\ufffd"),  # line and paragraph separators
        ("\u2013 \u201cq\u201d\u202f\u2026", "\u2013 \u201cq\u201d\u202f\u2026"),  # 0xE2-led
    ],
)
def test_clean_keeps_what_a_terminal_finally_shows(raw: str, shown: str) -> None:
    assert clean(raw) == shown


def test_utf8_split_across_reads_is_assembled() -> None:
    data = "é€😀\n".encode()
    lines = LineAssembler()
    got = [line for byte in data for line in lines.feed(bytes([byte]))]
    assert got == ["é€😀"]


def test_lines_cut_anywhere_come_out_as_clean_makes_them() -> None:
    """The assembler skips clean()'s work on chunks without control characters; whatever the
    chunking, each line is what clean() makes of it (escapes, \r, \b, tabs, é, NBSP, 😀)."""
    pieces = ["plain ", "é\u00a0😀", "\x1b[1mbold\x1b[0m", "50%\r100%", "ab\bc", "\t", "  ", "\n"]
    rng = random.Random(7)
    weights = [400, 100, 1, 1, 1, 1, 50, 100]  # most chunks have no control character at all
    text = "".join(rng.choices(pieces, weights, k=20_000)) + "\n"
    data = text.encode()
    for _ in range(20):
        cuts = sorted(rng.sample(range(1, len(data)), 40))
        lines = LineAssembler()
        got = [
            x
            for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)
            for x in lines.feed(data[a:b])
        ]
        assert got == [clean(line) for line in text.split("\n")[:-1]]


def test_c1_controls_never_pass_the_assembler_in_any_chunking() -> None:
    """Issue 39 item 4: U+009B/U+009D/U+009C/U+0090 in UTF-8 (0xC2 0x80-0x9F) have no byte
    below 0x20, so the fast path let them through; split between two chunks the 0xC2 sits in
    the decoder and the next chunk starts with the bare 0x9D."""
    text = "a\u009d0;PWNED-TITLE\u009cb \u009b2J\u0090dcs\u009c end \u00b0\n" * 3
    data = text.encode()
    for cut in range(1, len(data)):
        lines = LineAssembler()
        got = lines.feed(data[:cut]) + lines.feed(data[cut:])
        assert got == ["ab  end \u00b0"] * 3, cut
        assert not any("\x80" <= ch <= "\x9f" for line in got for ch in line)


INVISIBLE = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c"
INVISIBLE += "\u200b\u200c\u200d\u2060\ufeff\u2028\u2029"


def test_invisible_characters_never_pass_the_assembler_in_any_chunking() -> None:
    """Issue 47: bidi controls, zero-width characters and U+2028/2029 have no control byte in
    UTF-8 (0xE2 0x80 0xAE...), so the fast path let them reach the terminal; cut anywhere,
    each is the marker, and the printable 0xE2-led characters around them stay."""
    text = f"a{INVISIBLE}b \u2013 \u2026 end\n" * 2
    data = text.encode()
    for cut in range(1, len(data)):
        lines = LineAssembler()
        got = lines.feed(data[:cut]) + lines.feed(data[cut:])
        assert got == [f"a{MARKER * len(INVISIBLE)}b \u2013 \u2026 end"] * 2, cut
        assert not any(ch in INVISIBLE for line in got for ch in line)


def test_unterminated_and_runaway_lines() -> None:
    lines = LineAssembler()
    assert lines.feed(b"partial") == []
    assert lines.flush() == ["partial"]
    assert lines.flush() == []
    long = lines.feed(b"x" * (MAX_LINE + 1))
    assert long == ["x" * (MAX_LINE + 1)]  # cut, not buffered forever


# ---- push batching and setup fingerprints ----------------------------------------------------


def code_file(path: str, size_: int, sha: str = "0" * 64) -> CodeFile:
    return CodeFile(path=path, sha256=sha, mode=0o644, size=size_)


def test_a_push_reads_each_file_in_bounded_pieces_and_notices_a_changed_size(
    tmp_path: Path,
) -> None:
    """Memory stays bounded whatever the file's size; a file that grew or shrank since it was
    hashed is named, not sent under the old hash."""
    big = tmp_path / "big"
    big.write_bytes(b"x" * (2 * READ_BYTES + 5))
    small = tmp_path / "small"
    small.write_bytes(b"abc")
    files = [code_file("big", 2 * READ_BYTES + 5), code_file("small", 3)]
    pieces = list(_contents(tmp_path, files))
    assert [len(p) for p in pieces] == [READ_BYTES, READ_BYTES, 5, 3]
    assert b"".join(pieces) == big.read_bytes() + b"abc"
    small.write_bytes(b"abcd")  # grew after the manifest was made
    with pytest.raises(InventoryError, match="small changed while tfdeploy was pushing it"):
        list(_contents(tmp_path, files))
    small.write_bytes(b"ab")  # shrank
    with pytest.raises(InventoryError, match="small changed while tfdeploy was pushing it"):
        list(_contents(tmp_path, files))


def test_setup_fingerprint_changes_with_what_setup_depends_on() -> None:
    req = code_file("requirements.txt", 10, "a" * 64)
    other = code_file("train.py", 10, "b" * 64)
    manifest = Manifest(root=Path("."), files=(req, other))
    commands = ("pip install -r requirements.txt",)
    base = setup_fingerprint(commands, {"A": "1"}, manifest)
    edited_train = Manifest(root=Path("."), files=(req, code_file("train.py", 10, "c" * 64)))
    edited_req = Manifest(root=Path("."), files=(code_file("requirements.txt", 9, "d" * 64), other))
    assert setup_fingerprint(commands, {"A": "1"}, edited_train) == base  # unrelated edit
    assert setup_fingerprint(commands, {"A": "1"}, edited_req) != base
    assert setup_fingerprint(commands, {"A": "2"}, manifest) != base
    assert setup_fingerprint(("pip install numpy",), {"A": "1"}, manifest) != base


# ---- small helpers every message uses --------------------------------------------------------


def test_wording_helpers() -> None:
    assert [plural(1, "file"), plural(2, "file"), plural(0, "host")] == [
        "1 file",
        "2 files",
        "0 hosts",
    ]
    assert [size(812), size(14541), size(3 * 2**20)] == ["812 B", "14.2 KiB", "3.0 MiB"]
    assert [join_names(["a"]), join_names(["a", "b"]), join_names(["a", "b", "c"])] == [
        "a",
        "a and b",
        "a, b and c",
    ]


def test_run_ids_are_valid_and_sortable() -> None:
    early, late = new_run_id("job", 0.0), new_run_id("job", 86400.0)
    assert RUN_ID.match(early) and early.startswith("job-19700101T000000Z-")
    assert early < late


def test_secrets_are_masked_in_values_and_messages() -> None:
    env = {"WANDB_API_KEY": "s3cr3t-value", "LR": "0.1", "MY_VAR": "hidden!"}
    assert masked(env, ["MY_VAR"]) == {"WANDB_API_KEY": MASK, "LR": "0.1", "MY_VAR": MASK}
    text = "curl -H s3cr3t-value ... hidden! lr=0.1"
    assert mask_text(text, env, ["MY_VAR"]) == f"curl -H {MASK} ... {MASK} lr=0.1"
