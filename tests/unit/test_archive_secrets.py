"""No secret of a run lands in its local records (issue 62): the log archive is the edge every
write into `<state>/runs/<run-id>/` passes, and it masks with the run's Masker. The lab's end to
end version, every file and every verb's output grepped: tests/integration/test_secret_records.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from deployer.core.secrets import Masker
from deployer.results import runstore
from deployer.results.archive import LogArchive
from deployer.results.runstore import run_dir
from tests.support.harness import Harness

SECRET = "tok-3c1f9a2e77d0"  # an env table's API_TOKEN
FORWARDED = "fwd-5b08e1c4aa93"  # HF_TOKEN, forwarded from this machine's environment
HIDE = Masker.of([{"API_TOKEN": SECRET, "HF_TOKEN": FORWARDED}])


@pytest.fixture(autouse=True)
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TFDEPLOY_STATE_DIR", str(tmp_path / "state"))
    return tmp_path / "state"


def holders(folder: Path, *values: str) -> list[str]:
    return [
        str(p.relative_to(folder))
        for p in sorted(folder.rglob("*"))
        if p.is_file() and any(v.encode() in p.read_bytes() for v in values)
    ]


def test_a_secret_is_blanked_to_its_length_however_the_writes_cut_it() -> None:
    """Every cut of the log between two writes (a poll ends where it ends): the secret is all
    `*`, each byte at its offset, and an escape sequence before it is defanged once (its ESC a
    NUL, as `logs` reads it back: defanging the read-back bytes again would make it DEL)."""
    data = f"\x1b[1mkey {SECRET} and {FORWARDED}\x1b[0m é\n".encode()
    blanked = data.replace(SECRET.encode(), b"*" * len(SECRET))
    blanked = blanked.replace(FORWARDED.encode(), b"*" * len(FORWARDED)).replace(b"\x1b", b"\0")
    for cut in range(1, len(data)):
        run_id = f"r-cut{cut}"
        archive = LogArchive(run_id, hide=HIDE)
        archive.write("worker:0", "h1", 0, data[:cut])
        archive.write("worker:0", "h1", cut, data[cut:])
        assert (run_dir(run_id) / "worker-0.log").read_bytes() == blanked, cut
    archive = LogArchive("r-bytes", hide=HIDE)
    for at in range(len(data)):  # a byte a poll
        archive.write("worker:0", "h1", at, data[at : at + 1])
    assert (run_dir("r-bytes") / "worker-0.log").read_bytes() == blanked


def test_the_journal_facts_outcome_and_metrics_keep_no_secret(state: Path) -> None:
    archive = LogArchive("r-rec", hide=HIDE)
    archive.note("step", f"pid 7 (python train.py --token {FORWARDED}): SIGKILL")
    archive.keep_outcome({"outcome": "failed", "why": f"{SECRET} refused", "n": 1})
    archive.keep_facts({"tasks": [{"env": {"X": f"a{SECRET}"}, f"k{SECRET}": 2}]})
    archive.write_metrics("worker:0", [{"step": 1.0, f"m{SECRET}": 2.0, "loss": 0.5}])
    assert not holders(state, SECRET, FORWARDED)
    [entry] = runstore.journal("r-rec").records
    assert entry["text"] == "pid 7 (python train.py --token ********): SIGKILL"
    assert runstore.read_outcome("r-rec").fields == {
        "outcome": "failed",
        "why": "******** refused",
        "n": 1,
    }
    [record] = runstore.metrics("r-rec")["worker:0"].records
    assert record == {"step": 1, "loss": 0.5}  # the metric named after a secret is not kept


def test_up_keeps_none_of_its_runs_secrets_in_its_records(
    tmp_path: Path, state: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`up` on fake hosts, a task printing both secrets (the forwarded one cut between two
    polls) and a step that carries one (as an escaped process's command line would): the
    view shows `********`, and no file under the state directory holds either value."""
    monkeypatch.setenv("HF_TOKEN", FORWARDED)
    inventory = f"""\
[job]
name = "j"
code = "code"
command = "python3 train.py"
env = {{ API_TOKEN = "{SECRET}" }}
forward_env = ["HF_TOKEN"]

[[hosts]]
name = "a"
address = "192.0.2.1"
tasks = [{{ role = "worker" }}]
"""
    h = Harness(tmp_path, inventory, monkeypatch)
    a = h.hosts["a"]
    said: list[str] = []

    def script(now: float) -> None:
        said.append("")
        if len(said) == 3:
            a.write("worker:0", f"printing {SECRET} and {FORWARDED[:6]}")
            h.deployment.view.step(f"escaped: pid 7 (train.py --token {FORWARDED})")
        elif len(said) == 5:
            a.write("worker:0", f"{FORWARDED[6:]}\n")
            a.exit("worker:0")

    assert h.run(script) == 0
    assert "worker:0@a | printing ******** and ********" in h.view.output, h.view.output
    assert "escaped: pid 7 (train.py --token ********)" in h.view.steps, h.view.steps
    directory = run_dir(h.deployment.run_id)
    assert (directory / "journal.jsonl").is_file() and (directory / "worker-0.log").is_file()
    assert not holders(state, SECRET, FORWARDED)
    log = (directory / "worker-0.log").read_text()
    assert log == f"printing {'*' * len(SECRET)} and {'*' * len(FORWARDED)}\n", log
