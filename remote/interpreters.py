"""Which Python a task runs: its environment in a job's venv or with the host's `python`, and the
real path of a command's first word, so preflight checks the interpreter the task will run.

A task's `python3 train.py` is looked up on the task's PATH, not on the `python` preflight was
given. Activating the venv (or putting the host python's directory first, as a venv's `activate`
does) makes the two agree; `resolve_command` lets preflight prove that they do.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
from typing import TYPE_CHECKING, Mapping, Sequence

if TYPE_CHECKING:  # the control side imports this module too, as remote.interpreters
    import protocol

# The first words that name a Python interpreter: python, python3, python3.11 (or a path to one).
_PYTHON_WORD = re.compile(r"python(3(\.\d+)?)?")


def venv_env(venv: str, base: Mapping[str, str]) -> dict[str, str]:
    """The environment of a task that runs in `venv`: what `bin/activate` sets, and no more.

    PYTHONHOME would make the venv's interpreter load another installation's stdlib (and
    `activate` unsets it for that reason).
    """
    env = {k: v for k, v in base.items() if k != "PYTHONHOME"}
    env["VIRTUAL_ENV"] = venv
    env["PATH"] = _first_on_path(os.path.join(venv, "bin"), base.get("PATH"))
    return env


def host_python_env(python: str, base: Mapping[str, str]) -> dict[str, str]:
    """The environment of a task of a job without requirements: the directory of the host's
    `python` comes first on PATH, so the task's `python3` is the one preflight checked.

    `python` is the configured path as given (a venv's bin/python is a symlink to the base
    interpreter: its directory, not the link's target's, is the venv's bin/).
    """
    env = dict(base)
    directory = os.path.dirname(python)
    if directory:  # a bare "python3" is found on PATH already
        env["PATH"] = _first_on_path(directory, base.get("PATH"))
    return env


def task_env(venv: str | None, python: str | None, base: Mapping[str, str]) -> dict[str, str]:
    """A task's (or setup command's) environment: in the job's venv when it has one, else with
    the host's `python` first on PATH; as it is when neither is given."""
    if venv:
        return venv_env(venv, base)
    if python:
        return host_python_env(python, base)
    return dict(base)


def _first_on_path(directory: str, path: str | None) -> str:
    rest = [p for p in (path or os.defpath).split(os.pathsep) if p and p != directory]
    return os.pathsep.join([directory, *rest])


def is_python_word(word: str) -> bool:
    """True for python, python3, python3.X, and paths ending in one of those."""
    return bool(_PYTHON_WORD.fullmatch(os.path.basename(word)))


def first_word(command: str) -> str | None:
    """The program a shell command line runs first (None when it cannot be split)."""
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    # `env` prefixes and assignments (`FOO=1 python x.py`) come before the program.
    while words and ("=" in words[0] and not words[0].startswith(("/", "."))):
        words = words[1:]
    return words[0] if words else None


def resolve_command(word: str, path: str | None, cwd: str | None = None) -> str | None:
    """The real path of the program `word` names, looked up on `path` as the task's shell would
    (`os.path.realpath` of `shutil.which`); None when nothing is found.

    A word with a slash is taken relative to `cwd`, as the shell takes it.
    """
    if "/" in word:
        full = os.path.join(cwd or os.getcwd(), os.path.expanduser(word))
        found = shutil.which(full, path="")
    else:
        found = shutil.which(word, path=path if path is not None else os.defpath)
    return os.path.realpath(found) if found else None


def identity(word: str, path: str | None, cwd: str | None = None) -> tuple[str, str] | None:
    """(real path, venv or "") of the interpreter `word` names on `path`; None when not found.

    The real path alone cannot tell a venv from its base: `<venv>/bin/python` is a symlink to
    the base interpreter, yet it imports the venv's packages. So the venv a program's directory
    belongs to (the one holding `pyvenv.cfg`) is part of its identity.
    """
    real = resolve_command(word, path, cwd)
    if real is None:
        return None
    found = (
        word if "/" in word else shutil.which(word, path=path if path is not None else os.defpath)
    )
    directory = os.path.realpath(os.path.dirname(os.path.join(cwd or os.getcwd(), str(found))))
    root = os.path.dirname(directory)
    return real, root if os.path.isfile(os.path.join(root, "pyvenv.cfg")) else ""


def answer(
    python: str, words: Sequence[str], path: str | None, cwd: str | None = None
) -> protocol.InterpretersShape:
    """What preflight compares (PROTOCOL.md, `interpreters`): the identity of the interpreter it
    checked (`python`) and of each task's first word, each looked up on the task's `path`."""

    def ident(word: str) -> list[str] | None:
        found = identity(word, path, cwd)
        return list(found) if found is not None else None

    return {"checked": ident(python), "found": {w: ident(w) for w in dict.fromkeys(words)}}
