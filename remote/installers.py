"""The two ways a venv is filled offline from a directory of wheels; their errors in a few lines.

uv, when its wheel travels with the environment and its binary runs here, else pip (from the
venv's own ensurepip). Measured on this machine type from a local wheelhouse, cold: the
TensorFlow set (38 wheels, 363 MB) 40 s with pip against 7.3 s with uv; see docs for the small
and scikit-learn sets. Neither touches a network: `--no-index` (and uv's `--offline`), and the
host's own pip/uv configuration is ignored (`--isolated`, `--no-config`), so a host's
`PIP_INDEX_URL` or `uv.toml` cannot send the install elsewhere.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import subprocess
import zipfile
from pathlib import Path
from typing import Callable, Sequence

TAIL = 12  # lines of an installer's error shown to the user
ENOSPC_TEXT = os.strerror(errno.ENOSPC)  # "No space left on device"
_UV_MEMBER = re.compile(r"[^/]+\.data/scripts/uv")
# Lines that explain pip/uv in general rather than this failure.
_NOISE = (
    "To fix this you could try to",
    "ERROR: ResolutionImpossible",
    "hint: ",
    "[notice]",
)


class InstallFailed(Exception):
    """An installer exited non-zero; `lines` is its error, cut to what says why."""

    def __init__(self, tool: str, code: int, output: str) -> None:
        self.tool, self.code, self.output = tool, code, output
        self.lines = cut(output)
        super().__init__(f"{tool} exited {code}: " + " | ".join(self.lines))

    @property
    def disk_full(self) -> bool:
        return ENOSPC_TEXT in self.output


def cut(output: str) -> list[str]:
    """The installer's own words for the failure: from its first error line on, without blank
    lines and generic advice, at most TAIL lines (the last ones when there is no error line)."""
    lines = [ln.rstrip() for ln in output.splitlines() if ln.strip()]
    starts = [i for i, ln in enumerate(lines) if _is_error_start(ln)]
    kept = lines[starts[0] :] if starts else lines[-TAIL:]
    kept = [ln for ln in kept if not ln.lstrip().startswith(_NOISE)]
    return kept[:TAIL] if starts else kept


def _is_error_start(line: str) -> bool:
    # pip: "ERROR: ...", uv: "error: ..." or "× No solution found ..."
    return line.lstrip().startswith(("ERROR:", "error:", "\u00d7 "))


def run(
    argv: Sequence[str], env: dict[str, str], on_start: Callable[[int], None] | None = None
) -> str:
    """Runs one installer step in its own process group; its output, or InstallFailed.

    `on_start` learns the pid (= process group) at once: a builder killed mid-way leaves the
    installer running, and the next builder on this host ends it before cleaning up.
    """
    tool = os.path.basename(argv[0]) if argv[1:2] != ["-m"] else str(argv[2])
    try:
        proc = subprocess.Popen(
            list(argv),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    except OSError as exc:
        raise InstallFailed(tool, 127, f"error: cannot run {argv[0]}: {exc}") from exc
    if on_start is not None:
        on_start(proc.pid)
    out, _ = proc.communicate()
    text = out.decode("utf-8", errors="replace")
    if proc.returncode != 0:
        raise InstallFailed(tool, proc.returncode, text)
    return text


def uv_binary(wheels: Path, dest: Path) -> Path | None:
    """The `uv` binary of a uv wheel among `wheels`, unpacked into `dest`, if one runs here.

    A wheel for another platform (the controller resolved for another machine, or a host of
    another architecture shares the workdir) does not run: pip is used then.
    """
    for wheel in sorted(wheels.glob("uv-*.whl")):
        try:
            with zipfile.ZipFile(str(wheel)) as archive:
                member = next((n for n in archive.namelist() if _UV_MEMBER.fullmatch(n)), None)
                if member is None:
                    continue
                dest.mkdir(parents=True, exist_ok=True)
                target = dest / "uv"
                target.write_bytes(archive.read(member))
        except (OSError, zipfile.BadZipFile):
            continue
        target.chmod(target.stat().st_mode | stat.S_IXUSR)
        try:
            done = subprocess.run([str(target), "--version"], capture_output=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue  # ENOEXEC: another platform's binary
        if done.returncode == 0:
            return target
    return None


def uv_install(
    uv: Path, venv: Path, wheels: Path, reqs: Path, cache: Path, on_start: Callable[[int], None]
) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("UV_")}
    # This host's own cache (venvs.uv_cache), on the venv's file system so uv hard-links from
    # it: wheels an earlier environment unpacked are linked, not unpacked again.
    env.update(UV_CACHE_DIR=str(cache), UV_PYTHON_DOWNLOADS="never", UV_NO_PROGRESS="1")
    argv = [str(uv), "pip", "install", "--offline", "--no-index", "--no-config"]
    # No `--compile-bytecode`: compiling every module of TensorFlow's set was most of a new
    # venv's build even when every wheel was linked from the cache (docs/environments.md), and a
    # task imports about half of them, compiled at its first import into the venv's
    # __pycache__ (the venv is the user's, so Python writes them) and read from there after.
    argv += ["--link-mode", "hardlink"]
    argv += ["--find-links", str(wheels), "--python", str(venv / "bin" / "python")]
    argv += ["-r", str(reqs)]
    return run(argv, env, on_start)


def pip_install(
    venv: Path, wheels: Path, reqs: Path, on_start: Callable[[int], None], online: bool = False
) -> str:
    """`online` (wheels_from = "hosts"): the host's own pip configuration (its index or mirror,
    PIP_* variables) decides where the packages come from; else only the local wheels."""
    env = (
        dict(os.environ)
        if online
        else {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    )
    argv = [str(venv / "bin" / "python"), "-m", "pip", "install"]
    argv += [] if online else ["--isolated", "--no-index", "--no-cache-dir"]
    argv += ["--disable-pip-version-check", "--no-input", "--no-warn-script-location"]
    argv += ["--no-compile"]  # as uv: modules are compiled when a task first imports them
    argv += [] if online else ["--find-links", str(wheels)]
    argv += ["-r", str(reqs)]
    return run(argv, env, on_start)
