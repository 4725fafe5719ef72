"""Issue 47: what a host writes reaches this machine's stdout as text, never as terminal control.

Real commands on lab hosts print every hostile class (C0, C1, CSI, OSC 52's clipboard write,
DCS, bidi overrides and isolates, direction marks, zero-width characters, U+2028/2029); what
`exec`, `up` and `logs` (from the hosts and from the archive) write is read on a pipe and on a
terminal (`script -qfec` gives the command a pty), and `--raw` gives the bytes back.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.lab import Lab

pytestmark = pytest.mark.lab

# Each hostile class once, in a line a task prints (Python's escapes, written into a script).
HOSTILE = (
    "A\\x07B\\x1b[2JC\\x1b]52;c;ZWNobw==\\x1b\\\\D\\x1bP1$qm\\x1b\\\\E\\u009b31mF\\u009d0;T\\u009cG"
    "\\x00\\x0e\\x7fH\\u202eevil\\u202cI\\u2066J\\u2069K\\u200eL\\u200fM\\u061cN\\u200bO"
    "\\u200cP\\u200dQ\\u2060R\\ufeffS\\u2028T\\u2029U"
)
SHOWN = "ABCDEFGH\ufffdevil\ufffd" + "\ufffd".join("IJKLMNOPQRSTU")  # what the filter leaves of it
FORBIDDEN = [chr(c) for c in range(0x20) if c not in (0x09, 0x0A, 0x0D)] + [
    chr(c) for c in range(0x7F, 0xA0)
]
INVISIBLE = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c"
INVISIBLE += "\u200b\u200c\u200d\u2060\ufeff\u2028\u2029"
PRINTER = f"import sys\nsys.stdout.write('{HOSTILE}\\n')\nsys.stdout.flush()\n"


def _tfdeploy(args: list[str], tmp_path: Path, *, terminal: bool) -> bytes:
    """What `tfdeploy ARGS` wrote to stdout (and, on a terminal, stderr too), as bytes."""
    argv = [sys.executable, "-m", "deployer", *args]
    env = os.environ | {"TFDEPLOY_STATE_DIR": str(tmp_path / "state"), "TERM": "xterm"}
    if terminal:
        argv = ["script", "-qfec", shlex.join(argv), "/dev/null"]
    done = subprocess.run(argv, capture_output=True, timeout=180, env=env, stdin=subprocess.DEVNULL)
    return done.stdout


def _assert_safe(out: bytes, *, terminal: bool) -> None:
    text = out.decode()
    if terminal:  # rich's own colours and the live view's cursor moves are ours: drop them
        text = _without_our_sequences(text)
    bad = sorted({f"U+{ord(ch):04X}" for ch in text if ch in FORBIDDEN or ch in INVISIBLE})
    assert not bad, f"{bad} reached stdout:\n{text!r}"
    assert "52;c;" not in text and "\x1b]" not in text


def _without_our_sequences(text: str) -> str:
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)  # SGR, cursor moves, erase
    return text.replace("\r", "")


@pytest.mark.parametrize("terminal", [False, True], ids=["pipe", "pty"])
def test_exec_prints_a_hosts_hostile_output_as_text(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path, terminal: bool
) -> None:
    """The issue's exploit: `exec INV -- "printf '\\033]52;c;ZWNobw==\\033\\\\'"` wrote the
    clipboard, piped and on a terminal; every other class went through as well."""
    inventory = lab_inventory([[{"role": "worker"}]] * 2, job={"name": "ex"})
    printer = f"{clean_lab.python} -c {shlex.quote(PRINTER)}"  # a host's /tmp is its own
    command = f"{printer}; printf '\\033]52;c;ZWNobw==\\033\\\\'"
    out = _tfdeploy(["exec", str(inventory), "--", command], tmp_path, terminal=terminal)
    _assert_safe(out, terminal=terminal)
    shown = out.decode()
    for host in clean_lab.hosts[:2]:
        assert f"{host.name} | {SHOWN}" in shown, shown


def test_exec_raw_gives_the_bytes_back(clean_lab: Lab, lab_inventory: Any, tmp_path: Path) -> None:
    inventory = lab_inventory([[{"role": "worker"}]], job={"name": "ex"})
    command = "printf 'a\\033]52;c;ZWNobw==\\033\\\\b\\342\\200\\256c\\n'"
    out = _tfdeploy(["exec", "--raw", str(inventory), "--", command], tmp_path, terminal=False)
    assert out == "a\x1b]52;c;ZWNobw==\x1b\\b\u202ec\n".encode()


@pytest.mark.parametrize("terminal", [False, True], ids=["pipe", "pty"])
def test_task_output_is_text_in_up_and_in_logs_from_hosts_and_archive(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path, terminal: bool
) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "printer.py").write_text(PRINTER)
    job = {"name": "hostile", "command": f"{clean_lab.python} printer.py", "lease_seconds": 30}
    inventory = lab_inventory([[{"role": "worker"}]] * 2, code=code, job=job)
    up = _tfdeploy(["up", "--no-netcheck", str(inventory)], tmp_path, terminal=terminal)
    _assert_safe(up, terminal=terminal)
    assert up.decode().count(SHOWN) >= 2, up.decode()  # the live view or plain lines showed it
    [index] = (tmp_path / "state" / "runs").glob("*/archive.json")
    run_dir = index.parent  # `up` saw the run end: `logs` reads its archive
    archived = _tfdeploy(["logs", run_dir.name], tmp_path, terminal=terminal)
    _assert_safe(archived, terminal=terminal)
    assert archived.decode().count(SHOWN) == 2, archived.decode()
    hosts = _tfdeploy(["logs", "--sync", run_dir.name], tmp_path, terminal=terminal)
    _assert_safe(hosts, terminal=terminal)
    assert hosts.decode().count(SHOWN) == 2, hosts.decode()
    raw = _tfdeploy(["logs", "--raw", run_dir.name], tmp_path, terminal=False)
    assert raw.count(b"\x1b]52;c;ZWNobw==") == 2 and "\u202e".encode() in raw
