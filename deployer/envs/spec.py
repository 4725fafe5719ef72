"""An environment's inputs: the requirements as pip reads them, and the hash that names them.

The requirements go to pip unchanged (pip parses markers, hashes, URLs and options itself), so
this module reads them only for what the controller must know before pip runs:

- every file they reach (`-r`, `-c`, local paths), whose contents are part of the environment:
  a changed constraints file or rebuilt local wheel is a different environment;
- `-e` / `--editable` in every spelling pip accepts (reqline.py), refused: an editable install
  points into a source tree on this machine, which no host has.

`EnvSpec.text` is the canonical text the cache key and the environment hash are made of.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from packaging.markers import InvalidMarker, Marker

from deployer.core.errors import ExitStatus, TfdeployError
from deployer.envs import reqline
from deployer.envs.platform import HostPlatform

# A line that names a local file or folder (pip: "./pkg", "../x.whl", "/abs/dir", "file:...").
_LOCAL = re.compile(r"^(\.{1,2}/|/|file:)")
_ARCHIVE = (".whl", ".tar.gz", ".zip", ".tar.bz2", ".tgz")


class RequirementsError(TfdeployError):
    """The requirements cannot be used as written; the message names the file and line.
    Exit 2, as a wrong inventory."""

    exit_status = ExitStatus.USAGE


@dataclass(frozen=True)
class EnvSpec:
    """The requirements of one environment.

    `lines`: what pip is given, one requirement or option per line, nested `-r` files inlined
    and `-c` files named by absolute path; relative local paths resolve from `base` (pip's
    working directory). `text`: every line of every file they reach, each file named, plus the
    sha256 of each local path, in reading order: what the environment depends on.
    """

    base: Path
    lines: tuple[str, ...]
    text: str

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()

    def for_target(self, target: HostPlatform) -> str:
        """The requirements as the host's pip would read them: each environment marker
        evaluated for the host (pip itself evaluates a requirement's markers against this
        machine's interpreter, whatever `--python-version` and `--platform` say)."""
        environment = target.marker_environment()
        kept = (_evaluated(line, environment) for line in self.lines)
        return "".join(f"{line}\n" for line in kept if line is not None)


def from_file(path: Path, *, base: Path | None = None) -> EnvSpec:
    """A requirements file (the inventory's `requirements = "requirements.txt"`)."""
    path = path.resolve()
    if not path.is_file():
        raise RequirementsError(
            f"{path}: requirements file not found",
            hint="`requirements` names a file relative to the job's `code` directory",
        )
    root = (base or path.parent).resolve()
    lines: list[str] = []
    text = _read_tree(path, root, set(), lines)
    return EnvSpec(root, tuple(lines), text)


def from_lines(lines: Sequence[str], *, base: Path) -> EnvSpec:
    """A list of requirement strings (`requirements = ["numpy<3", "-r extra.txt"]`)."""
    body = "".join(f"{line}\n" for line in lines)
    base = base.resolve()
    out: list[str] = []
    text = _read_text(body, "<requirements list>", base, base, set(), out)
    return EnvSpec(base, tuple(out), text)


def env_hash(spec: EnvSpec, target: HostPlatform, installer: str = "pip") -> str:
    """The environment's name: its requirements, as they read for the target platform, and
    the installer that builds the venv (a uv venv has no pip of its own). pip's names are
    those of before the installer counted, so venvs built then are still found."""
    text = f"{spec.digest}\n{spec.for_target(target)}\n{target.key()}"
    text += "" if installer == "pip" else f"\ninstaller {installer}"
    return hashlib.sha256(text.encode()).hexdigest()


def _read_tree(path: Path, base: Path, seen: set[Path], out: list[str]) -> str:
    if path in seen:
        return ""  # pip follows a loop of -r files once too
    seen.add(path)
    try:
        body = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise RequirementsError(f"{path}: cannot read: {e}") from None
    return _read_text(body, str(path), path.parent, base, seen, out)


def _read_text(
    body: str, name: str, here: Path, base: Path, seen: set[Path], out: list[str]
) -> str:
    text = [f"# file {name}\n"]
    for number, line in _logical_lines(body):
        text.append(line + "\n")
        text.extend(_follow(line, f"{name}:{number}", here, base, seen, out))
    return "".join(text)


def _evaluated(line: str, environment: dict[str, str]) -> str | None:
    """The line without its marker if the marker holds for the host, None if it does not."""
    if line.startswith("-"):
        return line
    requirement, sep, options = line.partition(" --")
    # pip: after a URL the marker's ";" must follow a space (a URL may hold ";").
    url = "://" in requirement
    match = re.search(r"\s;" if url else ";", requirement)
    if match is None:
        return line
    marker = requirement[match.end() :].strip()
    try:
        holds = Marker(marker).evaluate(environment)
    except InvalidMarker as e:
        raise RequirementsError(f"`{line}`: not an environment marker: {e}") from None
    if not holds:
        return None
    return requirement[: match.start()].rstrip() + (f" --{options}" if sep else "")


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


def _follow(
    line: str, where: str, here: Path, base: Path, seen: set[Path], out: list[str]
) -> list[str]:
    """What a line reaches (a nested file's lines, or a local path's content hash); the line,
    or the nested file's lines, appended to `out` for pip. The line is read as pip reads it
    (reqline.py): every spelling of an option pip accepts is seen here too."""
    try:
        parsed = reqline.read(line)
    except reqline.LineError as exc:
        raise RequirementsError(f"{where}: `{line}`: pip cannot read this line: {exc}") from None
    if parsed.editables:
        raise RequirementsError(
            f"{where}: `{line}`: editable requirements (-e) are not supported",
            hint="an editable install points into a folder on this machine, which no host has: "
            "name the project without -e (a local path is built into a wheel here), or put its "
            "code in the job's `code` directory",
        )
    if not parsed.requirement and (parsed.requirements or parsed.constraints):
        # pip follows the first file a line names (a -r before a -c), and no other
        kind, target = (
            ("requirement", parsed.requirements[0])
            if parsed.requirements
            else ("constraint", parsed.constraints[0])
        )
        nested = (here / target).resolve()
        if not nested.is_file():
            raise RequirementsError(f"{where}: {kind}s file {target} not found ({nested})")
        if kind == "constraint":
            out.append(f"-c {nested}")
            return [_read_tree(nested, base, seen, [])]
        return [_read_tree(nested, base, seen, out)]
    out.append(line)
    first = parsed.requirement.split(" ", 1)[0]
    if _LOCAL.match(first) or (first.endswith(_ARCHIVE) and not re.match(r"^\w+://", first)):
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
