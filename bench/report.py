"""A bench's output, also written to the docs file that is the one home of its figures.

The docs state a measured figure only in `docs/bench/<name>.md`, which the bench writes itself with
`--out` (tests/meta/test_docs.py keeps the prose from restating one), so a figure cannot be
hand-copied twice with two values.
"""

from __future__ import annotations

import contextlib
import datetime
import io
import os
import platform
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path


class _Tee(io.TextIOBase):
    """Writes to the real stdout and keeps a copy."""

    def __init__(self, real: io.TextIOBase) -> None:
        self.real, self.copy = real, io.StringIO()

    def write(self, text: str) -> int:
        self.copy.write(text)
        return self.real.write(text)

    def flush(self) -> None:
        self.real.flush()


def header(module: str) -> str:
    """The line every docs/bench file starts with: which command wrote it, and when."""
    argv = " ".join(shlex.quote(a) for a in sys.argv[1:])
    day = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")
    command = f"python -m {module} {argv}".strip()
    return f"Written by `{command}` on {day}: the bench's last recorded output (run it again).\n"


@contextlib.contextmanager
def tee_to(out: Path | None, module: str) -> Iterator[None]:
    """Everything printed to stdout inside also goes to `out`, once the bench has finished."""
    if out is None:
        yield
        return
    tee = _Tee(sys.stdout)  # type: ignore[arg-type]
    with contextlib.redirect_stdout(tee):  # type: ignore[type-var]
        yield
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(header(module) + "\n" + tee.copy.getvalue().strip("\n") + "\n")


def machine() -> str:
    """The machine a bench ran on, for the line under its table."""
    cpu = "?"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    mem = int(Path("/proc/meminfo").read_text().split()[1]) // 1024 // 1024
    system = f"Linux {platform.release()}, Python {platform.python_version()}"
    return f"{os.cpu_count()} CPUs ({cpu}), {mem} GiB RAM, {system}"


def load() -> str:
    """The load averages (1, 5, 15 min): other work on the cores skews every cell."""
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


BYTECODE_NOTE = "deployer/ and remote/ compiled to bytecode first, as an installed tfdeploy is"


def compile_tfdeploy(root: Path | None = None) -> None:
    """Bytecode for deployer/ and remote/, as pip leaves an installed tfdeploy: a checkout run
    under PYTHONDONTWRITEBYTECODE=1 (container images often set it) would otherwise compile
    about 70 modules, a tenth of a second, in every command a bench times."""
    import compileall

    root = root or Path(__file__).resolve().parent.parent
    for package in ("deployer", "remote"):
        compileall.compile_dir(root / package, quiet=1)
