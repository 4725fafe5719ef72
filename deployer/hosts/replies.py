"""The edge where what a host says becomes typed values: a host is untrusted input.

Whoever owns the login account of one fleet machine can change the agent installed there and
answer anything. So every name, path, mode and text of a reply is checked here, once, before
the rest of the control side sees it: a task name is `ROLE:INDEX` of a known role (and one the
run asked for, where the caller knows them), a relative path stays inside its folder, a mode
keeps only its permission bits, and a text is cleaned of control characters and escape
sequences before it can be printed. A reply that breaks the protocol (a wrong type, a missing
field, a bad name) is a HostError naming the host, the op and the field, never a traceback.
The writers add their own check against the run's folder right before each write
(deployer/results/pull/, archive.py): two checks, so one mistake is not a hole.
"""

from __future__ import annotations

import functools
import math
import re
import types
import typing
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from deployer.config.roles import ROLES
from deployer.core import boundedjson
from deployer.core.errors import HostError
from deployer.core.lines import clean
from deployer.hosts import reply_bounds
from remote import protocol

# A decimal index without sign, leading zeros or more digits than any plan has.
TASK_NAME = re.compile(r"([a-z]+):(0|[1-9][0-9]{0,8})")
_SHA256 = re.compile(r"[0-9a-f]{64}")
# A metrics record (TFDEPLOY_METRICS, written by the task: the task's word, not the agent's):
# names a label can print, finite numbers a table can show, a bounded count of both.
METRIC_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.:/-]{0,39}")
METRIC_KEYS = 24
METRIC_LINE = 2048
METRIC_DEPTH = 8  # a record is one flat object: a value nested deeper is no number anyway
METRIC_ABS = 1e15
STEP_MAX = 10**12
PERMISSIONS = 0o777  # no setuid, setgid or sticky bit from a host
Shape = TypeVar("Shape")


def task_name_ok(name: object) -> bool:
    """Whether `name` is a task name a plan can have: `ROLE:INDEX`, a known role."""
    if not isinstance(name, str):
        return False
    match = TASK_NAME.fullmatch(name)
    return match is not None and match.group(1) in ROLES


def text(value: object) -> str:
    """A host's text as it may be printed: split on newlines, each line cleaned of C0 (but
    tab) and C1 controls and escape sequences (deployer/core/lines.py)."""
    said = value if isinstance(value, str) else str(value)
    return "\n".join(clean(line) for line in said.split("\n"))


def mode(value: int) -> int:
    """A file mode from a host, as a local file may get it: permission bits only."""
    return value & PERMISSIONS


def path_problem(path: str, *, absolute: bool = False) -> str | None:
    """Why `path` could leave the folder it is relative to, or None. With `absolute`, one
    leading / is allowed (an absolute pattern's match, which lands in its own folder)."""
    if not path:
        return "is empty"
    if "\0" in path:
        return "holds a NUL byte"
    rest = path[1:] if absolute and path.startswith("/") else path
    if rest.startswith("/"):
        return "is absolute"
    parts = rest.split("/")
    if any(p in ("", ".", "..") for p in parts):
        return "has an empty, '.' or '..' component"
    return None


@dataclass(frozen=True)
class Edge:
    """Reads one reply of one host's op; each check's error names both and the field."""

    host: str
    op: str

    def error(self, field: str, why: str) -> HostError:
        return HostError(
            self.host,
            f"its agent's {self.op} reply is not valid: {field} {text(why)}",
            hint="the tfdeploy agent on that host was changed or damaged: remove its agent "
            "folder (WORKDIR/agent) so the next `up` installs it again, and find out who can "
            "write to that account",
        )

    def reply(self, value: object, shape: Callable[..., Shape]) -> Shape:
        """A reply as its op's shape in remote/protocol.py, rebuilt from what the host sent:
        every required field present, every field of its declared type down to the items of its
        lists, every number finite and within its field's bounds, every text within its length
        (and a version's pattern) and cleaned for the terminal (deployer/hosts/reply_bounds.py).
        Fields the shape does not name are dropped; an `Any` field is its reader's to check.
        The per-value checks (names, paths, modes) come after, in the op's reader."""
        return typing.cast(Shape, self._shaped(value, shape, "the reply"))

    def _shaped(self, value: object, shape: Any, field: str) -> dict[str, Any]:
        d = self.obj(value, field)
        required, fields = _plan(shape)
        for key in required:
            if key not in d:
                raise self.error(_joined(field, key), "is missing")
        out: dict[str, Any] = {}
        for key, kind, leaf in fields:
            if key not in d:
                continue
            item = d[key]
            # Most fields are a text, a number or null: checked here without building the
            # field's name, which only an error needs (every field of every poll comes here).
            if leaf is not None and ((item is None and leaf[1]) or _is(item, leaf[0])):
                out[key] = None if item is None else self._leaf(item, field, key)
            else:
                out[key] = self._typed(item, kind, _joined(field, key), key)
        return out

    def _leaves(
        self, items: list[Any], leaf: tuple[Any, bool], kind: Any, field: str, name: str
    ) -> list[Any]:
        """A list's texts or numbers, as `_typed` reads each: a clean item passes without its
        field's name being made; any other goes the long way, to its error."""
        out: list[Any] = []
        versioned = name in reply_bounds.VERSIONS
        for i, item in enumerate(items):
            if item is None and leaf[1]:
                out.append(None)
            elif (
                isinstance(item, str)
                and leaf[0] is str
                and not versioned
                and len(item) <= reply_bounds.MAX_TEXT
                and item.isprintable()
            ):
                out.append(item.rstrip())
            else:
                out.append(self._typed(item, kind, f"{field}[{i}]", name))
        return out

    def _leaf(self, value: object, field: str, name: str) -> object:
        """`_bounded` for a field of a shape, its name made only for an error."""
        if isinstance(value, str):
            if len(value) <= reply_bounds.MAX_TEXT and name not in reply_bounds.VERSIONS:
                return value.rstrip() if value.isprintable() else text(value)
            return self._bounded(value, _joined(field, name), name)
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if number and reply_bounds.number_problem(name, value) is not None:  # type: ignore[arg-type]
            return self._bounded(value, _joined(field, name), name)
        return value

    def _typed(self, value: object, kind: Any, field: str, name: str) -> Any:
        """`value` checked as `kind` and bounded as the field `name`; its cleaned copy."""
        form, inner = _form(kind)
        if form == "any":
            return value
        if form == "shape":
            return self._shaped(value, inner, field)
        if form == "optional":
            return None if value is None else self._typed(value, inner, field, name)
        if form == "list":
            items = self.items(value, field)
            leaf = _leaf_of(inner)
            if leaf is not None:  # a list of texts or numbers (a run's host list: N per host)
                return self._leaves(items, leaf, inner, field, name)
            return [self._typed(item, inner, f"{field}[{i}]", name) for i, item in enumerate(items)]
        if form == "dict":
            return {
                self._typed(key, str, f"{field} key {key!r:.40}", ""): self._typed(
                    item, inner, f"{field}[{key!r:.40}]", name
                )
                for key, item in self.obj(value, field).items()
            }
        if not _is(value, kind):
            raise self.error(field, f"is {value!r:.40}, not {_KIND_NAMES.get(kind, kind)}")
        return self._bounded(value, field, name)

    def _bounded(self, value: object, field: str, name: str) -> object:
        if isinstance(value, str):
            problem = reply_bounds.text_problem(name, value)
            if problem is not None:
                raise self.error(field, problem)
            return text(value)
        if isinstance(value, int | float) and not isinstance(value, bool):
            problem = reply_bounds.number_problem(name, value)
            if problem is not None:
                raise self.error(field, problem)
        return value

    def obj(self, value: object, field: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.error(field, f"is {type(value).__name__}, not an object")
        return value

    def items(self, value: object, field: str) -> list[Any]:
        if not isinstance(value, list):
            raise self.error(field, f"is {type(value).__name__}, not a list")
        return value

    def get(self, reply: Mapping[str, Any], key: str, field: str | None = None) -> Any:
        if key not in reply:
            raise self.error(field or key, "is missing")
        return reply[key]

    def integer(self, value: object, field: str, *, optional: bool = False, name: str = "") -> Any:
        """An integer within the bounds of the field `name` (reply_bounds), else 64 bits."""
        if value is None and optional:
            return None
        if not isinstance(value, int) or isinstance(value, bool):
            raise self.error(field, f"is {value!r:.40}, not an integer")
        return self._bounded(value, field, name)

    def count(self, value: object, field: str) -> int:
        """A size or an offset: a non-negative integer."""
        number: int = self.integer(value, field)
        if number < 0:
            raise self.error(field, f"is negative ({number})")
        return number

    def number(self, value: object, field: str, name: str = "") -> float | None:
        """A finite number within the bounds of the field `name` (reply_bounds): a time of
        1e20 or NaN is the host's error here, not an OverflowError where it is printed."""
        if value is None:
            return None
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise self.error(field, f"is {value!r:.40}, not a number")
        self._bounded(value, field, name)
        return float(value)

    def choice(self, value: object, field: str, allowed: Collection[str]) -> str:
        if not isinstance(value, str) or value not in allowed:
            raise self.error(field, f"is {value!r:.40}, not one of {', '.join(allowed)}")
        return value

    def task(self, value: object, field: str, known: Collection[str] | None = None) -> str:
        """A task name: `ROLE:INDEX` of a known role, and one of `known` when given (the run's
        own tasks, or those the request named). It becomes a folder and a file name here."""
        if not task_name_ok(value):
            raise self.error(field, f"{value!r:.60} is not a task name (ROLE:INDEX)")
        assert isinstance(value, str)
        if known is not None and value not in known:
            raise self.error(field, f"{value!r} is not a task this run asked for")
        return value

    def path(self, value: object, field: str, *, absolute: bool = False) -> str:
        if not isinstance(value, str):
            raise self.error(field, f"is {value!r:.40}, not a path")
        problem = path_problem(value, absolute=absolute)
        if problem is not None:
            raise self.error(field, f"{value!r:.120} {problem}")
        return value

    def sha256(self, value: object, field: str) -> str | None:
        if value is None:
            return None
        if not isinstance(value, str) or not _SHA256.fullmatch(value):
            raise self.error(field, f"is {value!r:.80}, not a sha256")
        return value

    def texts(self, value: object, field: str) -> tuple[str, ...]:
        return tuple(text(t) for t in self.items(value, field))


class MetricRecords(tuple[dict[str, float], ...]):
    """The records of a batch of metrics lines, and `dropped`: how many of its lines were no
    record (not JSON, over METRIC_LINE, nested deeper than METRIC_DEPTH, no whole `step`). A
    tuple, so every reader of a poll's records reads it as before; the count rides with it to
    the store (results/metricstore.py), where `runs` and `report` say it."""

    dropped: int

    def __new__(cls, records: Iterable[dict[str, float]] = (), dropped: int = 0) -> MetricRecords:
        batch = super().__new__(cls, records)
        batch.dropped = dropped
        return batch


def metric_records(lines: Iterable[object]) -> MetricRecords:
    """A poll's metrics lines of one task as records, the lines that are none counted."""
    records, dropped = [], 0
    for line in lines:
        record = metric_record(line)
        if record is None:
            dropped += 1
        else:
            records.append(record)
    return MetricRecords(records, dropped)


def metric_record(line: object) -> dict[str, float] | None:
    """One line of a task's metrics file as numbers, or None when it is not a record: at most
    METRIC_LINE characters of JSON nested at most METRIC_DEPTH deep (measured before it is
    decoded: deployer/core/boundedjson.py), an object that `metric_fields` keeps.
    Not a HostError: a task may write what it likes there, and a bad line is skipped."""
    if not isinstance(line, str) or len(line) > METRIC_LINE:
        return None
    try:
        raw = boundedjson.loads(line, limit=METRIC_DEPTH)
    except ValueError:
        return None
    return metric_fields(raw)


def metric_fields(raw: object) -> dict[str, float] | None:
    """A decoded record as the edge keeps it, or None when it is none: an object with a whole
    `step` from 0 to STEP_MAX; other keys kept when their name matches METRIC_NAME and their
    value is a finite number within METRIC_ABS (at most METRIC_KEYS). The one rule for a
    record, whether it comes from a task now or from this machine's store later."""
    if not isinstance(raw, dict):
        return None
    step = _finite(raw.get("step"))
    if step is None or step < 0 or step > STEP_MAX or step != int(step):
        return None
    record: dict[str, float] = {"step": float(int(step))}
    for key, value in raw.items():
        if len(record) >= METRIC_KEYS:
            break
        number = _finite(value)
        if key != "step" and number is not None and METRIC_NAME.fullmatch(str(key)):
            record[str(key)] = number
    return record


def _finite(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, int) and abs(value) > METRIC_ABS:
        return None  # before float(): an integer of 400 digits is an OverflowError there
    number = float(value)
    return number if math.isfinite(number) and abs(number) <= METRIC_ABS else None


_KIND_NAMES: dict[object, str] = {
    int: "an integer",
    float: "a number",
    str: "a string",
    bool: "true or false",
    type(None): "null",
}


def _is(value: object, kind: object) -> bool:
    """JSON's types as Python reads them: true is no integer, an integer is a number."""
    if kind is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind is type(None):
        return value is None
    return isinstance(kind, type) and isinstance(value, kind)


@functools.cache
def _form(kind: Any) -> tuple[str, Any]:
    """How a declared type is read, worked out once per type (every field of every poll asks):
    ("any" | "shape" | "optional" | "list" | "dict" | "leaf", the inner type)."""
    if kind is Any:
        return "any", None
    if typing.is_typeddict(kind):
        return "shape", kind
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (types.UnionType, typing.Union):
        kinds = [k for k in args if k is not type(None)]
        if type(None) in args and len(kinds) == 1:
            return "optional", kinds[0]
    if origin is list:
        return "list", args[0]
    if origin is dict:
        return "dict", args[1]
    return "leaf", kind


@functools.cache
def _leaf_of(kind: Any) -> tuple[Any, bool] | None:
    """(the leaf type, whether null is allowed) for a text, number or flag type, else None."""
    form, inner = _form(kind)
    if form == "leaf":
        return (kind, False)
    if form == "optional" and _form(inner)[0] == "leaf":
        return (inner, True)
    return None


def _joined(field: str, key: str) -> str:
    return key if field == "the reply" else f"{field}.{key}"


@functools.cache
def _plan(
    shape: Any,
) -> tuple[tuple[str, ...], tuple[tuple[str, Any, tuple[Any, bool] | None], ...]]:
    """A shape's required keys (sorted) and its fields: (key, type, leaf), leaf being (the
    leaf type, whether null is allowed) for a text, number or flag field, else None."""
    fields = tuple((key, kind, _leaf_of(kind)) for key, kind in _hints(shape).items())
    return tuple(sorted(shape.__required_keys__)), fields


@functools.cache
def _hints(shape: Any) -> dict[str, Any]:
    """A shape's fields and their types (remote/protocol.py keeps them as strings)."""
    return typing.get_type_hints(shape)


def failure(host: str, reply: Mapping[str, Any]) -> HostError:
    """An ok:false reply as the HostError the rest of the control side matches by its code
    (protocol.FAIL_*). A code this side does not know counts as a plain refusal; a subject is
    kept only where it is what its code says it is (a content's sha256)."""
    code = reply.get("code")
    if code not in protocol.FAIL_CODES:
        code = protocol.FAIL_REFUSED
    subject = reply.get("subject")
    if not (
        code == protocol.FAIL_DAMAGED and isinstance(subject, str) and _SHA256.fullmatch(subject)
    ):
        subject = None
    cause = text(reply.get("error", "the agent refused the request"))
    return HostError(host, cause, code=str(code), subject=subject)
