"""A bench's output, also written to the docs file that is the one home of its figures.

The docs state a measured figure only in `docs/bench/<name>.md`, which the bench writes itself with
`--out` (tests/unit/test_docs.py keeps the prose from restating one), so a figure cannot be
hand-copied twice with two values.
"""

from __future__ import annotations

import contextlib
import datetime
import io
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
