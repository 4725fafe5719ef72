"""A compromised host on the lab: a finished run whose host's installed agent a test patches as
an attacker with the host's login would (tests/integration/test_untrusted_host.py,
test_hostile_replies.py).

`hostile_run` runs a short job on lab hosts, each in a workdir of its own (so a patched agent
serves no other test); `Hostile.patch` then edits one host's installed agent over plain ssh, and
the test runs the verb a user would run next. The sources stay as they are (every hello checks
them against their content id and installs them again when they differ): the patched code goes
into their compiled files instead, stamped with the sources' mtime and size so that Python takes
them. A host account's owner can always do this, or replace the interpreter: the check guards
against damage, not against the host.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.lab import Lab, LabHost
from tests.support.lab_cli import tfdeploy

# Run on the host through ssh: each edit replaces one exact text of one agent file.
PATCH = """\
import glob, importlib.util, json, marshal, os, sys
edits = json.loads(sys.stdin.readline())
[home] = glob.glob(os.path.expanduser(edits.pop("@workdir")) + "/agent/*/")
for name, pairs in edits.items():
    path = os.path.join(home, name)
    text = open(path).read()
    for old, new in pairs:
        assert text.count(old) == 1, (name, old)
        text = text.replace(old, new)
    st = os.stat(path)
    head = importlib.util.MAGIC_NUMBER + (0).to_bytes(4, "little")
    head += (int(st.st_mtime) & 0xFFFFFFFF).to_bytes(4, "little")
    head += (st.st_size & 0xFFFFFFFF).to_bytes(4, "little")
    pyc = importlib.util.cache_from_source(path)
    os.makedirs(os.path.dirname(pyc), exist_ok=True)
    with open(pyc, "wb") as f:
        f.write(head + marshal.dumps(compile(text, path, "exec")))
"""

C0_C1_ESC = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
Edits = Mapping[str, Sequence[tuple[str, str]]]


@dataclass
class Hostile:
    """One finished run on lab hosts whose agents the test may patch (the first host's by
    default)."""

    lab: Lab
    hosts: list[LabHost]
    workdirs: dict[str, str]  # host name -> its own workdir
    inventory: Path
    state: Path
    run_id: str
    up_output: str

    @property
    def host(self) -> str:
        return self.hosts[0].name

    @property
    def workdir(self) -> str:
        return self.workdirs[self.host]

    def patch(self, edits: Edits, host: str | None = None) -> None:
        name = host or self.host
        line = json.dumps({"@workdir": self.workdirs[name], **edits})
        argv = self.lab.ssh_argv(name, self.lab.python, "-c", quoted(PATCH))
        done = subprocess.run(argv, input=line + "\n", capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr

    def tfdeploy(self, *args: str) -> subprocess.CompletedProcess[str]:
        return tfdeploy(*args, state=self.state, timeout=120)


@contextlib.contextmanager
def hostile_run(
    lab: Lab,
    tmp_path: Path,
    task: str,
    *,
    hosts: int = 1,
    job: Mapping[str, Any] | None = None,
) -> Iterator[Hostile]:
    """A finished run of `task` (task.py) on the first `hosts` lab hosts, one worker each, each
    host in a fresh workdir that is removed afterwards."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "task.py").write_text(task)
    chosen = list(lab.hosts[:hosts])
    workdirs = {h.name: f"~/.tfdeploy-hostile-{uuid.uuid4().hex[:8]}" for h in chosen}
    inventory = lab.write_inventory(
        tmp_path / "inventory.toml",
        tasks=[[{"role": "worker"}] for _ in chosen],
        job={
            "name": "hostile",
            "code": str(code),
            "command": "python3 task.py",
            "stop_grace": 1,
            **(job or {}),
        },
        hosts=chosen,
        per_host={name: {"workdir": w} for name, w in workdirs.items()},
    )
    state = tmp_path / "state"
    try:
        up = tfdeploy("up", str(inventory), state=state, check_rc=0, timeout=180)
        run_id = up.stdout.split("(run ")[1].split(")")[0]
        yield Hostile(lab, chosen, workdirs, inventory, state, run_id, up.stdout + up.stderr)
    finally:
        for name, workdir in workdirs.items():
            subprocess.run(lab.ssh_argv(name, "rm", "-rf", workdir), timeout=60, check=False)


def quoted(code: str) -> str:
    """`code` as one word of the remote shell's command line."""
    return "'" + code.replace("'", "'\\''") + "'"


def files_under(root: Path, *, skip: tuple[Path, ...] = ()) -> dict[str, tuple[bytes, int]]:
    """Every file under `root` (but `skip`) with its bytes and mode: what must not change."""
    found = {}
    for path in sorted(root.rglob("*")):
        if any(path == s or path.is_relative_to(s) for s in skip) or not path.is_file():
            continue
        found[str(path.relative_to(root))] = (path.read_bytes(), path.stat().st_mode)
    return found


def no_control_characters(output: str) -> None:
    bad = sorted({f"U+{ord(c):04X}" for c in C0_C1_ESC.findall(output)})
    assert not bad, f"control characters reached the terminal: {bad}\n{output!r}"
