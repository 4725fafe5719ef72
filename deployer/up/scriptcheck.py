"""Preflight's script check: a task command that runs a Python script of the job's code
directory which is not there (a typo in the script's name) is refused before anything starts,
naming the inventory key and the closest file, instead of a job that starts and fails.

Refused only when the file is certainly missing (docs/failures.md): the command's first word
is a Python interpreter (`python`, `python3`, `python3.X`, a path to one) and its script is a
relative path ending in `.py` that stays inside `code`, where every task runs (in a container
too: the code directory is mounted at the same path and is the container's working directory).
Not checked, since the file may come from elsewhere: `-m module` and `-c` (a module may be the
environment's), an absolute or `~` path (the host's, an image's), a word the shell would expand
(`$X`, globs, `{placeholders}`), a command that does anything before Python (`cd sub && ...`),
and every command of a job with `setup` commands (setup may write the script).
"""

from __future__ import annotations

import difflib
import os
import posixpath
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from deployer.config.plan import Plan, Task
from deployer.core.errors import ExitStatus, InventoryError
from deployer.core.text import plural
from remote import interpreters

# Options of CPython that take the next word as their value (or glue it: `-Werror`).
_WITH_VALUE = frozenset("WX")
_LONG_WITH_VALUE = ("--check-hash-based-pycs",)
_SHELL = frozenset("$`*?[]{}~;&|<>()\\\"'")
MAX_FILES = 20_000  # files of `code` read for the closest name: a huge tree costs no more


class ScriptMissing(InventoryError):
    """A task's command runs a script of the code directory that is not there: exit 3, as
    preflight's other refusals (nothing was started), with the inventory key that says it."""

    exit_status = ExitStatus.UNREACHABLE


@dataclass(frozen=True)
class Missing:
    key: str  # the inventory key the command comes from: job.command, hosts[0].tasks[1].command
    script: str  # as the command names it
    tasks: tuple[str, ...]


def script_of(command: str) -> str | None:
    """The relative `.py` script a Python command line runs, when the check can be sure of it
    (the module says when it cannot: None)."""
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    if not words or not interpreters.is_python_word(words[0]):
        return None
    found = _first_argument(words[1:])
    if found is None or not found.endswith(".py") or _SHELL & set(found):
        return None
    if found.startswith("/") or found.startswith("-"):
        return None
    normal = posixpath.normpath(found)
    return None if normal == ".." or normal.startswith("../") else found


def _first_argument(words: list[str]) -> str | None:
    """The script: the first word after CPython's own options; None for -m, -c and stdin."""
    pending_value = False
    for word in words:
        if pending_value:
            pending_value = False
            continue
        if word in _LONG_WITH_VALUE:
            pending_value = True
            continue
        if word == "-" or word.startswith("--"):
            return None  # stdin, or a long option (--version, --help): no script
        if not word.startswith("-"):
            return word
        for i, flag in enumerate(word[1:]):
            if flag in "cm":
                return None  # a command or a module: not a file of code for certain
            if flag in _WITH_VALUE:
                pending_value = i == len(word) - 2  # `-W x`; `-Wx` carries its value
                break
    return None


def missing_scripts(plan: Plan) -> list[Missing]:
    """Every command whose script is not in the job's code directory, by inventory key."""
    job = plan.job
    if job.setup:
        return []
    code = job.code
    found: dict[tuple[str, str], list[str]] = {}
    for task in plan.tasks:
        script = script_of(task.command) if not task.is_server else None
        if script is None or (code / script).exists():
            continue
        found.setdefault((_key_of(plan, task, script), script), []).append(task.name)
    return [Missing(key, script, tuple(tasks)) for (key, script), tasks in found.items()]


def refuse_missing_scripts(plan: Plan) -> None:
    """Raises ScriptMissing for the first command whose script is not in `code` (preflight
    calls it before any host is asked)."""
    missing = missing_scripts(plan)
    if not missing:
        return
    first, code = missing[0], plan.job.code
    closest = closest_file(code, first.script)
    more = f" (and {plural(len(missing) - 1, 'other command')})" if len(missing) > 1 else ""
    tasks = ", ".join(first.tasks[:4]) + (" ..." if len(first.tasks) > 4 else "")
    raise ScriptMissing(
        str(plan.inventory.path),
        first.key,
        f"the command runs {first.script}, which is not in the job's code directory "
        f"({code}){more}; its tasks ({tasks}) would start and fail, so nothing was started",
        hint=(f"did you mean {closest}? " if closest else "")
        + "a task runs in its code directory: name a file of `code` (or an absolute path "
        "for a script outside it)",
    )


def closest_file(code: Path, script: str) -> str | None:
    """The file of `code` whose relative path is nearest `script` (difflib), if any is near."""
    files = list(_python_files(code))
    near = difflib.get_close_matches(script, files, n=1, cutoff=0.6)
    if not near:  # a script named from another folder: compare the names alone
        by_name = {posixpath.basename(f): f for f in files}
        name = difflib.get_close_matches(posixpath.basename(script), list(by_name), n=1)
        near = [by_name[name[0]]] if name else []
    return near[0] if near else None


def _python_files(code: Path) -> Iterator[str]:
    """The `.py` files of `code`, relative and '/'-separated; at most MAX_FILES are looked at."""
    seen = 0
    for top, dirs, files in os.walk(code):
        dirs[:] = sorted(d for d in dirs if d not in (".git", "__pycache__") and d[:1] != ".")
        for name in sorted(files):
            seen += 1
            if seen > MAX_FILES:
                return
            if name.endswith(".py"):
                yield Path(top, name).relative_to(code).as_posix()


def _key_of(plan: Plan, task: Task, script: str) -> str:
    """Where the task's command is written, as plan.py picks it: the host's task entry, then
    job.role_commands, then job.command (the entry whose command names the same script)."""
    job = plan.job
    host = next((h for h in plan.inventory.hosts if h.name == task.host), None)
    for spec in host.tasks if host is not None else ():
        if spec.role == task.role and spec.command and _same(spec.command, script):
            return f"{spec.key}.command" if spec.key else "command"
    command = job.role_commands.get(task.role)
    if command and _same(command, script):
        return f"job.role_commands.{task.role}"
    return "job.command"


def _same(template: str, script: str) -> bool:
    return script_of(template) == script
