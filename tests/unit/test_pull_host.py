"""The host side of `pull` (remote/results.py), driven as the control side drives it (JSON on
stdin, the real agent): a symlink loop costs one entry, limits apply while walking, `/` is
refused at once, an absolute match is never confused with a relative one, and a collect whose
caller went away stops instead of hashing on (issue #28, items 4 and 9).

The same over SSH, with `tfdeploy pull` and Ctrl-C: tests/integration/test_dataplane.py.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.agent import AGENT, PYTHON, call, new_run, ok, start, wait_for

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def task_dir(workdir: Path) -> Path:
    """The directory of task worker:0 of run r1 (its code/), the task itself already exited."""
    run_dir = new_run(workdir)
    start(workdir, {"name": "worker:0", "command": "true"})
    return run_dir / "code"


def collect(workdir: Path, *patterns: str) -> dict[str, Any]:
    reply = ok(call(workdir, "collect", run_id="r1", patterns=list(patterns)))
    return reply["tasks"]["worker:0"]  # type: ignore[no-any-return]


def fetch(workdir: Path, path: str, *patterns: str) -> bytes:
    request = {
        "v": 1,
        "op": "fetch",
        "workdir": str(workdir),
        "run_id": "r1",
        "task": "worker:0",
        "path": path,
        "patterns": list(patterns),
        "offset": 0,
    }
    done = subprocess.run(
        [PYTHON, str(AGENT)], input=json.dumps(request).encode(), capture_output=True, timeout=30
    )
    line, _, body = done.stdout.partition(b"\n")
    assert json.loads(line)["ok"], line
    return body


def test_a_symlink_loop_is_reported_and_never_walked(workdir: Path, task_dir: Path) -> None:
    loop = task_dir / "loop"
    loop.mkdir()
    (loop / "f").write_text("once")
    (loop / "a").symlink_to(".")
    (loop / "b").symlink_to(".")
    began = time.monotonic()
    listed = collect(workdir, "loop/**", "loop/*", "**/f")
    assert time.monotonic() - began < 5
    assert [f[0] for f in listed["files"]] == ["loop/f"]  # once, not loop/a/a/.../f
    not_followed = [r for r in listed["refused"] if "a symlink to a folder, not followed" in r]
    assert sorted(r.split(":")[0] for r in not_followed) == ["loop/a", "loop/b"]
    for i in range(150):  # a tree full of them: the reply lists 100 and counts the rest
        (loop / f"l{i:03}").symlink_to(".")
    refused = collect(workdir, "loop/**")["refused"]
    assert len(refused) == 101 and refused[-1] == "... and 52 more not pulled"


def test_a_symlinked_folder_named_by_the_user_is_pulled_through(
    workdir: Path, task_dir: Path
) -> None:
    (task_dir / "ckpt-5").mkdir()
    (task_dir / "ckpt-5" / "model.bin").write_text("weights")
    (task_dir / "latest").symlink_to("ckpt-5")
    listed = collect(workdir, "latest")
    assert [f[0] for f in listed["files"]] == ["latest/model.bin"]
    assert fetch(workdir, "latest/model.bin", "latest") == b"weights"


def test_the_whole_file_system_is_refused_at_once(workdir: Path, task_dir: Path) -> None:
    began = time.monotonic()
    listed = collect(workdir, "/", "/*", "/**")
    assert time.monotonic() - began < 5
    assert listed["files"] == []
    assert len(listed["refused"]) == 3
    assert all("names the host's whole file system" in r for r in listed["refused"])


@pytest.mark.slow  # makes 100,001 files: half a minute on a loaded 2-core machine
@pytest.mark.timeout(300)
def test_too_many_files_refuse_the_pattern_while_walking(
    workdir: Path, task_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    many = task_dir / "many"
    many.mkdir()
    for i in range(100_001):
        (many / f"{i:06}").touch()
    (task_dir / "keep.json").write_text("{}")
    listed = collect(workdir, "keep.json", "many/**")
    assert [f[0] for f in listed["files"]] == ["keep.json"]  # nothing of the refused pattern
    assert listed["refused"] == [
        "many/**: names more than 100000 files; nothing of it was pulled: name fewer"
    ]


def test_an_absolute_match_is_never_confused_with_a_relative_one(
    workdir: Path, task_dir: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "etc" / "hostname"
    outside.parent.mkdir()
    outside.write_text("the host's")
    inside = task_dir / str(outside).lstrip("/")  # the task's own file at the same path
    inside.parent.mkdir(parents=True)
    inside.write_text("the task's own")
    relative = str(outside).lstrip("/")
    listed = collect(workdir, str(outside), relative)
    assert sorted(f[0] for f in listed["files"]) == [str(outside), relative]
    assert fetch(workdir, str(outside), str(outside)) == b"the host's"
    assert fetch(workdir, relative, relative) == b"the task's own"


def test_hash_only_hashes_the_named_paths_and_lists_the_rest(workdir: Path, task_dir: Path) -> None:
    """A replica's copies are hashed, the files its host sends are not (they are hashed as they
    are sent): `hash_only` names the copies per task. A path it names that no pattern matches
    is not hashed or listed; a malformed one is refused."""
    (task_dir / "ckpt").mkdir()
    (task_dir / "ckpt" / "a.bin").write_bytes(b"a" * 1000)
    (task_dir / "ckpt" / "b.bin").write_bytes(b"b" * 1000)
    only = {"worker:0": ["ckpt/b.bin", "elsewhere.bin"]}
    reply = ok(call(workdir, "collect", run_id="r1", patterns=["ckpt/*"], hash_only=only))
    listed = {f[0]: f[3] for f in reply["tasks"]["worker:0"]["files"]}
    assert listed == {"ckpt/a.bin": None, "ckpt/b.bin": hashlib.sha256(b"b" * 1000).hexdigest()}
    bad = call(workdir, "collect", run_id="r1", patterns=["ckpt/*"], hash_only={"worker:0": 1})
    assert not bad["ok"] and "hash_only" in bad["error"], bad


def test_a_collect_stops_when_its_caller_goes_away(workdir: Path, task_dir: Path) -> None:
    """Minutes of hashing (a 64 GB sparse file), then the controller leaves: the agent ends
    within seconds instead of hashing on for nobody."""
    with (task_dir / "huge.bin").open("wb") as f:
        f.truncate(64 << 30)
    agent = subprocess.Popen(
        [PYTHON, "-S", str(AGENT), "serve"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert agent.stdin is not None and agent.stdout is not None
    request = {"v": 1, "op": "collect", "workdir": str(workdir), "run_id": "r1"}
    agent.stdin.write(json.dumps({**request, "patterns": ["huge.bin"]}).encode() + b"\n")
    agent.stdin.flush()
    time.sleep(1.0)
    assert agent.poll() is None  # still hashing
    agent.stdin.close()  # the controller closed the session (Ctrl-C, a dropped connection)
    agent.stdout.close()
    try:
        wait_for(lambda: agent.poll() is not None, timeout=5)
    finally:
        agent.kill()
        agent.wait()
