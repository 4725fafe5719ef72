"""One requirements line as pip itself reads it: the requirement part and the options part.

pip splits a line at its first word that starts with "-" and hands the rest to optparse, whose
grammar accepts far more spellings than `-e x` and `--editable x`: a value glued to a short
option (`-e./pkg`, `-egit+https://...`, `-rmore.txt`), `--editable=./x`, any unique prefix of a
long option (`--edit ./x`, `--req more.txt`), several options on one line. Matching the first word
against a list misses most of them (an `-e./pkg` went to pip as an option, pip installed nothing
from it, and the environment resolved to "0 wheels"). So the options are read here with an
optparse parser holding exactly the options pip's own requirements-file parser holds
(pip._internal.req.req_file.build_parser, pip 26.3): the same prefixes are unique or ambiguous,
the same values are glued. tests/unit/test_reqline.py checks every spelling against pip's parser.
"""

from __future__ import annotations

import optparse
import shlex
from dataclasses import dataclass
from typing import NoReturn

# (short, long, takes a value): pip's requirements-file options. A missing one would change
# which prefixes are unique (`--pre` and `--prefer-binary`, `--e` is ambiguous in pip).
_OPTIONS = (
    ("-i", "--index-url", True),
    ("", "--pypi-url", True),
    ("", "--extra-index-url", True),
    ("", "--no-index", False),
    ("-c", "--constraint", True),
    ("-r", "--requirement", True),
    ("-e", "--editable", True),
    ("-f", "--find-links", True),
    ("", "--no-binary", True),
    ("", "--only-binary", True),
    ("", "--prefer-binary", False),
    ("", "--require-hashes", False),
    ("", "--no-require-hashes", False),
    ("", "--pre", False),
    ("", "--all-releases", True),
    ("", "--only-final", True),
    ("", "--trusted-host", True),
    ("", "--use-feature", True),
    ("", "--hash", True),
    ("-C", "--config-settings", True),
)
_DEST = {"-c": "constraint", "-r": "requirement", "-e": "editable"}


class LineError(ValueError):
    """pip would refuse the line's options; the message is optparse's, as pip says it."""


@dataclass(frozen=True)
class Line:
    """A logical line: `requirement` (text before the first option, "" for an option line),
    and the files and editables its options name, in the order given."""

    requirement: str
    requirements: tuple[str, ...]
    constraints: tuple[str, ...]
    editables: tuple[str, ...]


class _Parser(optparse.OptionParser):
    def error(self, msg: str) -> NoReturn:
        raise LineError(msg)

    def exit(self, status: int = 0, msg: str | None = None) -> NoReturn:
        raise LineError(msg or "cannot parse the line")


def _parser() -> _Parser:
    parser = _Parser(add_help_option=False)
    for short, long, value in _OPTIONS:
        names = [n for n in (short, long) if n]
        dest = _DEST.get(short)
        if dest is not None:
            parser.add_option(*names, dest=dest, action="append", default=[])
        elif value:
            parser.add_option(*names, action="store", type="string")
        else:
            parser.add_option(*names, action="store_true")
    return parser


def read(line: str) -> Line:
    """The line split as pip's `break_args_options` splits it, its options parsed as pip's."""
    tokens = line.split(" ")
    args: list[str] = []
    for token in tokens:
        if token.startswith("-"):
            break
        args.append(token)
    rest = " ".join(tokens[len(args) :])
    try:
        words = shlex.split(rest)
    except ValueError as exc:
        raise LineError(f"cannot split the options: {exc}") from None
    opts, _ = _parser().parse_args(words)
    return Line(
        " ".join(args).strip(),
        tuple(opts.requirement),
        tuple(opts.constraint),
        tuple(opts.editable),
    )
