"""This machine's record of a run (state dir `runs/<id>.json`) that this version cannot read: a
newer tfdeploy's key, a truncated file, a JSON `null`. Each is named with its file and problem,
with `-i INVENTORY` offered, through the real CLI entry; never "no such run" or a traceback.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from deployer.config.model import SSHSettings
from deployer.results.state import RunHost, RunRecord, save
from tests.support.helpers import one_line, run_cli

RUN = "hard-20250101T000000Z-abcd"


def local_inventory(tmp: Path) -> Path:
    """A job of one worker on this machine (transport = "local")."""
    (tmp / "code").mkdir(exist_ok=True)
    path = tmp / "inv.toml"
    path.write_text(
        f'[job]\nname = "hard"\ncode = "code"\ncommand = "true"\nworkdir = "{tmp}/wd"\n'
        f'python = "{sys.executable}"\nrequire_tensorflow = false\n\n'
        '[[hosts]]\nname = "local"\naddress = "127.0.0.1"\ntransport = "local"\n'
        'tasks = [{ role = "worker" }]\n'
    )
    return path


@pytest.fixture
def record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A good record of RUN, whose inventory exists; returns the record's path."""
    monkeypatch.setenv("TFDEPLOY_STATE_DIR", str(tmp_path / "state"))
    inventory = local_inventory(tmp_path)
    host = RunHost("local", "127.0.0.1", "local", "python3", str(tmp_path / "wd"), SSHSettings())
    save(RunRecord(RUN, str(inventory), "hard", 0.0, False, (host,)))
    return tmp_path / "state" / "runs" / f"{RUN}.json"


def good(path: Path) -> dict[str, object]:
    data: dict[str, object] = json.loads(path.read_text())
    return data


def squeezed(text: str) -> str:
    return "".join(text.split())


CORRUPTIONS = {
    "newer": (
        lambda p: json.dumps({**good(p), "lease_kind": "v9"}),
        "unknown key 'lease_kind' (written by a newer tfdeploy?)",
    ),
    "truncated": (
        lambda p: p.read_text()[:40],
        "not valid JSON (a truncated file?): ",
    ),
    "null": (lambda p: "null", "expected a JSON object, got null"),
}


@pytest.mark.parametrize("kind", sorted(CORRUPTIONS))
def test_an_unreadable_record_is_named_with_its_problem_and_i_offered(
    record: Path, tmp_path: Path, kind: str
) -> None:
    corrupt, problem = CORRUPTIONS[kind]
    record.write_text(corrupt(record))
    for verb in ("status", "down", "logs"):
        code, out, err = run_cli(verb, RUN)
        said = one_line(err)
        assert code == 2, (verb, out, err)
        expected = f"error: the record of run {RUN} ({record}) cannot be read: {problem}"
        assert squeezed(expected) in squeezed(err)  # the console folds a long path anywhere
        assert "hint: name the run's inventory with -i INVENTORY" in said
        assert "Traceback" not in err and "internal error" not in said
        assert "neither an inventory file nor a run" not in said


def test_with_i_a_broken_record_is_passed_over(record: Path, tmp_path: Path) -> None:
    record.write_text("null")
    code, _, err = run_cli("status", RUN, "-i", str(tmp_path / "inv.toml"))
    assert code == 2 and "cannot be read" not in err  # 2: no such run there, as asked
    assert f"error: no run {RUN} on local" in one_line(err)  # the inventory's host was asked
