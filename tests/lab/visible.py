"""Which interpreter the practice hosts run: one they can see.

A namespace lab host mounts its own empty /root and /tmp (netns.py), so an interpreter that lives
there, or is a link into there, is a dangling path on the host: a quick start's `.venv` made from
pyenv's python3 (under /root/.pyenv) is one. `python -m tests.lab up` checks the interpreter it
writes into the inventory and, when the hosts cannot run it, falls back to one they can, saying so,
or refuses, saying how to make one (README, "Practice hosts").
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.lab.model import VENV_PYTHON, LabError

PRIVATE = (Path("/root"), Path("/tmp"))  # each namespace host has its own (empty) copy
# Where to fall back to, in order: scripts/install.sh's venv (from Debian's /usr/bin/python3).
FALLBACKS = (VENV_PYTHON,)
PROBE = "import sys; print(sys.prefix); print(sys.base_prefix)"


@dataclass(frozen=True)
class Choice:
    """The interpreter for the hosts, and what was done to get it (None: the one asked for)."""

    python: str
    note: str | None = None


def _hops(path: Path) -> list[Path]:
    """`path` and every link it goes through to its file, each with its folders resolved: a host
    follows the same links, so any one of them inside its private /root or /tmp dangles there."""
    hops = []
    for _ in range(40):  # the kernel's own limit on links followed
        path = Path(os.path.realpath(path.parent)) / path.name
        hops.append(path)
        if not path.is_symlink():
            break
        path = path.parent / os.readlink(path)
    return hops


def _private(path: Path) -> tuple[Path, Path] | None:
    """(the hop, the private directory it lies in) for the first hop of `path` in one."""
    for hop in _hops(path):
        for d in PRIVATE:
            if hop == d or d in hop.parents:
                return hop, d
    return None


def hidden_because(python: str) -> str | None:
    """Why lab hosts cannot run `python` (None: they can): the file, a link on its way, or the
    installation it starts from (a venv's base Python) lies under /root or /tmp."""
    path = Path(python)
    if not path.is_absolute():
        return f"{python} is not an absolute path"
    found = _private(path)
    if found is not None:
        hop, d = found
        return f"{python} is {hop}, under {d}" if hop != path else f"{python} is under {d}"
    try:
        done = subprocess.run([python, "-c", PROBE], capture_output=True, text=True, timeout=30)
    except OSError as e:
        return f"{python} does not run here: {e}"
    if done.returncode != 0:
        return f"{python} does not run here: {done.stderr.strip()[-200:]}"
    for prefix in done.stdout.split():
        found = _private(Path(prefix))
        if found is not None:
            return f"{python} runs from {prefix}, under {found[1]}"
    return None


def choose(python: str, *, isolated: bool, fallbacks: tuple[str, ...] = FALLBACKS) -> Choice:
    """`python` if the hosts can run it; else the first fallback they can, with a note saying
    why; else LabError saying how to make one. A loopback lab's hosts see every file."""
    if not isolated:
        return Choice(python)
    why = hidden_because(python)
    if why is None:
        return Choice(python)
    for other in fallbacks:
        if os.access(other, os.X_OK) and hidden_because(other) is None:
            note = (
                f"the hosts cannot see {python} (each has its own /root and /tmp): {why}; "
                f"the inventory uses {other} instead"
            )
            return Choice(other, note)
    raise LabError(
        f"the hosts cannot run {python} (each has its own /root and /tmp): {why}. Make a venv "
        "outside them from a system Python, e.g. `/usr/bin/python3 -m venv /opt/tfdeploy/venv` "
        "(as scripts/install.sh does) and give it with --python, or start the lab with it"
    )
