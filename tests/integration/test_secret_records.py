"""Secrets stay secret in what tfdeploy writes on this machine (issue 62).

A run's secret values (an `env` value named in `secret_env`, a `forward_env` value under a
secret-looking name) reach the tasks, and never any file tfdeploy writes here: the run record,
the log archive, facts, journal and outcome, metrics, the report page, the pulled artifacts'
folder, nor what `up`, `status --json`, `runs --json`, `logs` and `report` print; nor does a
`forward_env` value under a plain name, which tfdeploy records nowhere (the task does not print
it: printed, it would be no secret, docs/security.md).

The task is TF-shaped (tests/support/standin.py; the subject is tfdeploy, not TensorFlow), and
hostile: worker:1 prints both secrets' raw values and names two metrics after them, then fails,
so they are in its log and in the last lines its failure shows. What tfdeploy does with that
(docs/security.md, "Secrets"): the local archive keeps the line with each secret blanked to as
many `*` as it had bytes (offsets stay the host log's), and drops the two metrics; the task's
own log on its host keeps what it wrote.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.lab import Lab
from tests.support import standin
from tests.support.faults import tfdeploy

pytestmark = pytest.mark.lab

FORWARDED = "TFDTEST_HF_TOKEN"  # forward_env, secret by its name
LISTED = "TFDTEST_RUN_LABEL"  # the env table, secret because secret_env names it
PLAIN = "TFDTEST_FWD_PLAIN"  # forward_env under a plain name: in no record all the same

# Each task says what it received without saying it: each value's length and a hash. Then
# worker:1 leaks both secrets into its output, once, and as the names of two metrics of a
# record (beside `leaked`, which is kept), and the stand-in fails it at step 2.
TELL = f"""
import hashlib, json, os
index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
for name in ({FORWARDED!r}, {LISTED!r}, {PLAIN!r}):
    value = os.environ.get(name, "")
    digest = hashlib.sha256(value.encode()).hexdigest()[:16]
    print("got", name, len(value), "chars, sha256", digest, flush=True)
if index == 1:
    print("leaking", os.environ[{FORWARDED!r}], os.environ[{LISTED!r}], flush=True)
    with open(os.environ["TFDEPLOY_METRICS"], "a") as metrics:  # and as metric names
        leak = {{os.environ[{FORWARDED!r}]: 1.0, os.environ[{LISTED!r}]: 2.0, "leaked": 3.0}}
        metrics.write(json.dumps(dict(step=0, **leak)) + "\\n")
"""


def _digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()[:16]


def _holders(folder: Path, tokens: dict[str, str]) -> dict[str, list[str]]:
    """Per token's name, every file under `folder` (all of them, whatever their kind of
    content) that holds the token's bytes."""
    found: dict[str, list[str]] = {name: [] for name in tokens}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        data = path.read_bytes()
        for name, token in tokens.items():
            if token.encode() in data:
                found[name].append(str(path.relative_to(folder)))
    return {name: paths for name, paths in found.items() if paths}


def test_secrets_reach_the_tasks_and_no_file_or_output_of_tfdeploy_here(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lab = clean_lab
    tokens = {
        FORWARDED: "fwdtok" + secrets.token_hex(12),
        LISTED: "listed" + secrets.token_hex(12),
        PLAIN: "plainfw" + secrets.token_hex(12),
    }
    for name in (FORWARDED, PLAIN):  # from this machine's environment: the CLI inherits it
        monkeypatch.setenv(name, tokens[name])
    code = tmp_path / "code"
    standin.write(code)
    (code / "tell.py").write_text(TELL)
    inventory = lab_inventory(
        [[{"role": "worker"}]] * 2,
        code=code,
        job={
            "name": "secrecy",
            "command": f"{lab.python} tell.py && exec {lab.python} {standin.NAME} 6 "
            "--interval 0.1 --fail-at 2 --fail-task worker:1",
            "env": {LISTED: tokens[LISTED]},
            "secret_env": [LISTED],
            "forward_env": [FORWARDED, PLAIN],
            "artifacts": ["ckpt/**"],
            "artifacts_to": str(tmp_path / "pulled"),
            "stop_grace": 2,
        },
    )
    state = tmp_path / "state"

    up = tfdeploy("up", str(inventory), state=state, timeout=240, check_rc=1)
    run_id = re.search(r"\(run (secrecy-\S+)\)$", up.stdout, re.M)
    assert run_id, up.stdout
    run = run_id.group(1)
    # Sent: each task got each value (its length and hash, said by the task itself).
    for name, token in tokens.items():
        said = f"got {name} {len(token)} chars, sha256 {_digest(token)}"
        assert up.stdout.count(said) == 2, f"{said!r}\n{up.stdout}"
    # The leak was streamed and shown in the failure's last lines, masked.
    assert "leaking ******** ********" in up.stdout + up.stderr, up.stdout + up.stderr

    commands: dict[str, subprocess.CompletedProcess[str]] = {"up": up}
    commands["status --json"] = tfdeploy("status", run, "--json", state=state, check_rc=0)
    commands["status INVENTORY --json"] = tfdeploy(
        "status", str(inventory), "--all", "--json", state=state, check_rc=0
    )
    commands["runs --json"] = tfdeploy("runs", "--json", state=state, check_rc=0)
    commands["runs"] = tfdeploy("runs", state=state, check_rc=0)
    commands["logs"] = tfdeploy("logs", run, state=state, check_rc=0)
    commands["logs --raw"] = tfdeploy("logs", run, "--raw", state=state, check_rc=0)
    # A damaged archive is fetched again whole from the hosts by `logs --sync`: that copy too.
    (state / "runs" / run / "worker-1.log").unlink()
    commands["logs --sync"] = tfdeploy(
        "logs", run, "-i", str(inventory), "--sync", state=state, check_rc=0
    )
    commands["report"] = tfdeploy("report", run, state=state, check_rc=0)
    page = Path(commands["report"].stdout.strip().splitlines()[-1])
    commands["report -o"] = tfdeploy(
        "report", run, "-o", str(tmp_path / "page.html"), state=state, check_rc=0
    )
    # What the reads read: the run and its failure, so that finding no token means something.
    [entry] = [r for r in json.loads(commands["runs --json"].stdout)["runs"] if r["run_id"] == run]
    assert entry["outcome"] == "failed", entry
    blanked = f"leaking {'*' * len(tokens[FORWARDED])} {'*' * len(tokens[LISTED])}"
    assert f"worker:1@h2 | {blanked}\n" in commands["logs"].stdout, commands["logs"].stdout
    # --raw reads the hosts' logs (the archive's is defanged), where the task's line is whole:
    # `logs` masks it as `up` showed it.
    raw = commands["logs --raw"].stdout
    assert "worker:1@h2 | leaking ******** ********\n" in raw, raw
    assert page.is_file() and page.is_relative_to(state), page

    printed = {
        f"{verb} {stream}": getattr(result, stream)
        for verb, result in commands.items()
        for stream in ("stdout", "stderr")
    }
    shown = {
        where: [name for name, token in tokens.items() if token in text]
        for where, text in printed.items()
    }
    assert not {where: names for where, names in shown.items() if names}, printed

    # Every file tfdeploy wrote here: the state directory (records, archive, facts, journal,
    # outcome, metrics, the report page), the artifacts' folder and the page written with -o.
    assert (tmp_path / "pulled" / run).is_dir()  # the artifacts were pulled there
    for folder in (state, tmp_path / "pulled"):
        assert not _holders(folder, tokens), folder
    assert not any(t.encode() in (tmp_path / "page.html").read_bytes() for t in tokens.values())

    # The record that named two metrics after the secrets was kept, without those two.
    stored = (state / "runs" / run / "metrics" / "worker-1.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in stored]  # `time`: when it arrived (the poller's)
    assert {"step": 0, "leaked": 3.0} in [
        {k: v for k, v in r.items() if k != "time"} for r in records
    ]
    assert all(isinstance(r.get("time"), float) for r in records), stored

    # The decision for a secret the task itself printed: the archive keeps its line, each
    # secret blanked to as many `*` as it had bytes, so every offset is still the host log's.
    archived = (state / "runs" / run / "worker-1.log").read_text()
    assert f"{blanked}\n" in archived, archived
    host_log = lab.run(
        lab.hosts[1], ["sh", "-c", f"cat ~/.tfdeploy/hosts/*/runs/{run}/tasks/worker-1/output.log"]
    ).stdout
    assert len(host_log.encode()) == len(archived.encode()), (host_log, archived)
    assert f"leaking {tokens[FORWARDED]} {tokens[LISTED]}\n" in host_log, host_log
