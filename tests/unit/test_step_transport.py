"""The step transport (a scheduler's node reached through its login node) on this machine: the
login is a LocalTransport and the launcher a real program (`env`), so every call is shown to
run wrapped, with stdin, files and sessions as a direct transport has them."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest

from deployer.core.errors import HostError
from deployer.hosts.local_transport import LocalTransport
from deployer.hosts.step_transport import StepTransport

LAUNCHER = ("env", "TFDEPLOY_TEST_STEP=7")  # what srun adds: the command runs inside a step


def _node() -> StepTransport:
    return StepTransport("node1", LocalTransport("node1"), LAUNCHER)


def test_run_wraps_the_command_in_the_launcher_and_keeps_stdin() -> None:
    code = "import os, sys; print(os.environ['TFDEPLOY_TEST_STEP'], sys.stdin.read())"
    result = _node().run([sys.executable, "-c", code], stdin=b"hello")
    assert (result.exit_code, result.stdout) == (0, b"7 hello\n")


def test_put_writes_the_file_whole_with_its_mode(tmp_path: Path) -> None:
    target = tmp_path / "deep" / "f.bin"
    data = bytes(range(256)) * 100
    _node().put(data, str(target), mode=0o640)
    assert target.read_bytes() == data
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert [p.name for p in target.parent.iterdir()] == ["f.bin"]  # no part file left


def test_a_put_that_cannot_write_names_the_node_and_path(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(HostError, match=r"node1: cannot write .*file/sub/f"):
        _node().put(b"x", str(blocker / "sub" / "f"))


def test_a_session_carries_requests_and_replies_through_the_launcher() -> None:
    echo = (
        "import json, os, sys\n"
        "for line in sys.stdin:\n"
        "    print(json.dumps([os.environ['TFDEPLOY_TEST_STEP'], line.strip()]), flush=True)\n"
    )
    session = _node().open_session([sys.executable, "-c", echo])
    try:
        assert json.loads(session.request(b"one\n", 10)) == ["7", "one"]
        assert json.loads(session.request(b"two\n", 10)) == ["7", "two"]
    finally:
        session.close()


def test_a_tunnel_to_a_node_reached_as_steps_is_refused_with_the_way_out() -> None:
    with pytest.raises(HostError) as info:
        _node().open_port(6006)
    assert 'reach = "ssh"' in (info.value.hint or "")
    assert os.environ.get("TFDEPLOY_TEST_STEP") is None
