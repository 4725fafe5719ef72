"""An environment's inputs: the requirements as pip reads them, and the hash that names them.

The requirements go to pip unchanged (pip parses markers, hashes, URLs and options itself), so
this module reads them only for what the controller must know before pip runs:

- every file they reach (`-r`, `-c`, local paths), whose contents are part of the environment:
  a changed constraints file or rebuilt local wheel is a different environment;
- `-e` / `--editable`, refused: an editable install points into a source tree on this machine,
  which no host has.

`EnvSpec.text` is the canonical text the cache key and the environment hash are made of.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from deployer.core.errors import TfdeployError

_NESTED = {
    "-r": "requirement",
    "--requirement": "requirement",
    "-c": "constraint",
    "--constraint": "constraint",
}
_EDITABLE = ("-e", "--editable")
# A line that names a local file or folder (pip: "./pkg", "../x.whl", "/abs/dir", "file:...").
_LOCAL = re.compile(r"^(\.{1,2}/|/|file:)")
_ARCHIVE = (".whl", ".tar.gz", ".zip", ".tar.bz2", ".tgz")


class RequirementsError(TfdeployError):
    """The requirements cannot be used as written; the message names the file and line."""


@dataclass(frozen=True)
class EnvSpec:
    """The requirements of one environment.

    `main`: the requirements file pip is given (`-r main`), relative paths in it resolved from
    `base` (pip's working directory). `text`: every line of every file it reaches, each file
    named, plus the sha256 of each local path, in reading order.
    """

    main: Path
    base: Path
    text: str
    generated: str | None = None  # a list's lines, written to `main` by the resolver

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()


def from_file(path: Path, *, base: Path | None = None) -> EnvSpec:
    """A requirements file (the inventory's `requirements = "requirements.txt"`)."""
    path = path.resolve()
    if not path.is_file():
        raise RequirementsError(
            f"{path}: requirements file not found",
            hint="`requirements` names a file relative to the job's `code` directory",
        )
    root = (base or path.parent).resolve()
    return EnvSpec(main=path, base=root, text=_read_tree(path, root, set()))


def from_lines(lines: Sequence[str], *, base: Path) -> EnvSpec:
    """A list of requirement strings (`requirements = ["numpy<3", "-r extra.txt"]`)."""
    body = "".join(f"{line}\n" for line in lines)
    base = base.resolve()
    text = _read_text(body, "<requirements list>", base, base, set())
    return EnvSpec(main=base / "<requirements list>", base=base, text=text, generated=body)


def env_hash(spec: EnvSpec, platform_key: str) -> str:
    """The environment's name: its requirements and the host platform they resolve for."""
    return hashlib.sha256(f"{spec.digest}\n{platform_key}".encode()).hexdigest()


def _read_tree(path: Path, base: Path, seen: set[Path]) -> str:
    if path in seen:
        return ""  # pip follows a loop of -r files once too
    seen.add(path)
    try:
        body = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise RequirementsError(f"{path}: cannot read: {e}") from None
    return _read_text(body, str(path), path.parent, base, seen)


def _read_text(body: str, name: str, here: Path, base: Path, seen: set[Path]) -> str:
    out = [f"# file {name}\n"]
    for number, line in _logical_lines(body):
        out.append(line + "\n")
        out.extend(_follow(line, f"{name}:{number}", here, base, seen))
    return "".join(out)


def _logical_lines(body: str) -> list[tuple[int, str]]:
    """pip's reading: backslash continuations joined, comments and blank lines dropped."""
    lines: list[tuple[int, str]] = []
    pending, start = "", 0
    for number, raw in enumerate(body.splitlines(), 1):
        if not pending:
            start = number
        if raw.endswith("\\"):
            pending += raw[:-1] + " "
            continue
        line = re.sub(r"(^|\s)#.*$", "", pending + raw).strip()
        pending = ""
        if line:
            lines.append((start, line))
    return lines


def _follow(line: str, where: str, here: Path, base: Path, seen: set[Path]) -> list[str]:
    """What a line reaches: a nested file's lines, or a local path's content hash."""
    try:
        words = shlex.split(line)
    except ValueError:
        words = line.split()
    first = words[0]
    option, _, inline = first.partition("=")
    if option in _EDITABLE:
        raise RequirementsError(
            f"{where}: `{line}`: editable requirements (-e) are not supported",
            hint="an editable install points into a folder on this machine, which no host has: "
            "name the project without -e (a local path is built into a wheel here), or put its "
            "code in the job's `code` directory",
        )
    if option in _NESTED:
        target = inline or (words[1] if len(words) > 1 else "")
        if not target:
            raise RequirementsError(f"{where}: `{line}` names no file")
        nested = (here / target).resolve()
        if not nested.is_file():
            raise RequirementsError(
                f"{where}: {_NESTED[option]}s file {target} not found ({nested})"
            )
        return [_read_tree(nested, base, seen)]
    if _LOCAL.match(first) or first.endswith(_ARCHIVE) and not re.match(r"^\w+://", first):
        return [_local_path(first, where, base)]
    return []


def _local_path(word: str, where: str, base: Path) -> str:
    """A local file or folder: its content hash, so a rebuilt wheel is a new environment."""
    path = Path(word.removeprefix("file://").removeprefix("file:").split("#", 1)[0])
    path = path if path.is_absolute() else (base / path)
    if not path.exists():
        raise RequirementsError(f"{where}: local path {word} not found ({path.resolve()})")
    digest = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for f in files:
        if "/.git/" in f"/{f.relative_to(path.parent)}/" or "__pycache__" in f.parts:
            continue
        digest.update(os.fsencode(f.relative_to(path.parent)) + b"\0" + f.read_bytes())
    return f"# local {word} sha256 {digest.hexdigest()}\n"
