"""Every field of every reply shape, walked with hostile values (issue 47).

The shapes come from remote/protocol.py itself (every TypedDict a `...Reply` reaches), so a
field added to a shape tomorrow is walked the day it is added. For each field (and each list
item and dict key under it) the walk puts values a compromised host could send: the wrong JSON
type, huge, negative, NaN and infinite numbers, control and escape sequences, an over-long
text, a bad version. The edge (deployer/hosts/replies.py) must either refuse the reply with a
HostError that names the host, the op and the field, or hand on a value that is cleaned and
bounded: no control character, at most MAX_TEXT characters, numbers finite, times that
`time.localtime` can print, sizes and counts not negative. Anything else (an exception of another
type, a raw value) fails here.
"""

from __future__ import annotations

import copy
import json
import math
import os
import re
import subprocess
import sys
import time
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from deployer.core.errors import HostError
from deployer.envs.platform import HostPlatform
from deployer.hosts import reply_bounds
from deployer.hosts.replies import Edge, _hints
from remote import protocol
from tests.support.gpus import FAKE, STATE_NAME, state

REMOTE = Path(protocol.__file__).parent

HOST = "h-hostile"
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
# A valid value of each field whose text has a form (reply_bounds.VERSIONS): the baseline reply.
EXAMPLES = {"python": "3.11.7", "glibc": "2.36", "tensorflow": "2.16.1", "machine": "x86_64"}
# Fields that are times, and fields that are never negative (sizes, counts, pids, ports).
TIMES = {"created", "started", "ended", "hosts_at"}
NEVER_NEGATIVE = TIMES | {
    "disk_free",
    "log_bytes",
    "restarts",
    "released",
    "removed",
    "contents",
    "bytes",
    "size",
    "raw",
    "offset",
    "files",
    "pid",
    "pgid",
    "listening",
    "busy_ports",
    "index",
    "memory_total",
    "memory_used",
    "used_memory",
    "utilization",
    "seconds",
    "minutes",
}

HOSTILE_NUMBERS: list[object] = [
    -1,
    -1.5,
    1e20,
    -1e300,
    2**64,
    10**30,
    float("nan"),
    float("inf"),
    float("-inf"),
]
HOSTILE_TEXTS: list[object] = [
    "\x1b]52;c;ZWNobw==\x1b\\",  # OSC 52: writes the user's clipboard
    "\x1b[2Jcleared",
    "\x9b2J\x9d0;title\x9c",  # C1 CSI, OSC, ST
    "a\x00b\rc\x07",
    "x" * (reply_bounds.MAX_TEXT + 1),
    "3",
    "2.999999999",
    "",
]
WRONG_TYPES: list[object] = [None, True, "1", 1, 1.5, [], {}]


def reply_shapes() -> dict[str, Any]:
    """Each op's reply shape in remote/protocol.py, by name."""
    return {
        name: shape
        for name, shape in vars(protocol).items()
        if typing.is_typeddict(shape) and name.endswith("Reply")
    }


def reached(shape: Any, seen: set[str]) -> set[str]:
    """The TypedDicts `shape` holds, itself included, at any depth."""
    if shape.__name__ in seen:
        return seen
    seen.add(shape.__name__)
    for kind in _hints(shape).values():
        for inner in _inner_kinds(kind):
            if typing.is_typeddict(inner):
                reached(inner, seen)
    return seen


def _inner_kinds(kind: Any) -> Iterator[Any]:
    yield kind
    for arg in typing.get_args(kind):
        yield from _inner_kinds(arg)


def valid(kind: Any, name: str) -> Any:
    """A value of `kind` the edge accepts, for the field `name`; a nested shape in full."""
    if kind is Any:
        return []
    if typing.is_typeddict(kind):
        return {key: valid(k, key) for key, k in _hints(kind).items()}
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin is list:
        return [valid(args[0], name)]
    if origin is dict:
        return {"key": valid(args[1], name)}
    if args:  # a union: X | None, the X, to walk inside it
        return valid(next(a for a in args if a is not type(None)), name)
    if kind is str:
        return EXAMPLES.get(name, "text")
    return {int: 1, float: 1.5, bool: True}[kind]


At = tuple[str | int, ...]


def fields(kind: Any, name: str, path: At) -> Iterator[tuple[At, Any, str]]:
    """(path, kind, field name) of every field, list item and dict value under `kind`."""
    if typing.is_typeddict(kind):
        for key, k in _hints(kind).items():
            yield (*path, key), k, key
            yield from fields(k, key, (*path, key))
        return
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin is list:
        yield (*path, 0), args[0], name
        yield from fields(args[0], name, (*path, 0))
    elif origin is dict:
        yield (*path, "key"), args[1], name
        yield from fields(args[1], name, (*path, "key"))
    elif args:
        yield from fields(next(a for a in args if a is not type(None)), name, path)


def put(reply: Any, path: At, value: object) -> None:
    for step in path[:-1]:
        reply = reply[step]
    reply[path[-1]] = value


def get(reply: Any, path: At) -> Any:
    for step in path:
        reply = reply[step]
    return reply


def spelled(path: At) -> str:
    """A path as the edge names it in errors: runs[0].tasks[0].name, reserved_by['key']."""
    said = ""
    for step in path:
        if isinstance(step, int):
            said += f"[{step}]"
        elif step == "key" and said:
            said += "['key']"
        else:
            said += f".{step}" if said else step
    return said


def cases() -> Iterator[Any]:
    for shape_name, shape in sorted(reply_shapes().items()):
        for path, _, name in fields(shape, "", ()):
            yield pytest.param(shape, path, name, id=f"{shape_name}:{spelled(path)}")


def check_bounded(value: Any, name: str, where: str) -> None:
    """What the edge hands on: cleaned texts, finite and sane numbers, all the way down."""
    if isinstance(value, str):
        assert not CONTROL.search(value), f"{where}: control characters passed: {value!r:.80}"
        assert len(value) <= reply_bounds.MAX_TEXT, f"{where}: {len(value)} characters passed"
        if name in EXAMPLES:
            assert value == EXAMPLES[name] or value, f"{where}: {value!r} passed"
    elif isinstance(value, bool) or value is None:
        pass
    elif isinstance(value, int | float):
        assert math.isfinite(value) and abs(value) < 2**63, f"{where}: {value!r} passed"
        if name in NEVER_NEGATIVE:
            assert value >= 0, f"{where}: negative {value!r} passed"
        if name in TIMES:
            time.localtime(value)  # what status prints: no OverflowError, no ValueError
    elif isinstance(value, list):
        for item in value:
            check_bounded(item, name, where)
    elif isinstance(value, dict):
        for key, item in value.items():
            check_bounded(key, "", f"{where} key")
            check_bounded(item, name, where)


def walk_result(value: Any, kind: Any, name: str, where: str) -> None:
    """Every typed value of a result checked as check_bounded checks it (Any: its reader's)."""
    if kind is Any:
        return
    if typing.is_typeddict(kind):
        assert isinstance(value, dict), f"{where}: {value!r:.40} passed as an object"
        for key, k in _hints(kind).items():
            if key in value:
                walk_result(value[key], k, key, f"{where}.{key}")
        return
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin is list:
        assert isinstance(value, list), f"{where}: {value!r:.40} passed as a list"
        for item in value:
            walk_result(item, args[0], name, f"{where}[]")
    elif origin is dict:
        assert isinstance(value, dict), f"{where}: {value!r:.40} passed as an object"
        for key, item in value.items():
            check_bounded(key, "", f"{where} key")
            walk_result(item, args[1], name, f"{where}[]")
    elif args:
        if value is not None:
            walk_result(value, next(a for a in args if a is not type(None)), name, where)
    else:
        assert value is not None or kind is type(None), f"{where}: null passed"
        check_bounded(value, name, where)


def test_every_reply_shape_is_walked() -> None:
    """Every TypedDict of protocol.py is reached from a reply shape or is a request's: a shape
    outside both would be a reply nobody walks here."""
    replies: set[str] = set()
    for shape in reply_shapes().values():
        reached(shape, replies)
    requests: set[str] = set()
    for name, shape in vars(protocol).items():
        request = name.endswith(("Request", "Base")) or name in ("Envelope", "ContainerShape")
        if typing.is_typeddict(shape) and request:
            reached(shape, requests)
    every = {n: s for n, s in vars(protocol).items() if typing.is_typeddict(s)}
    # a base of a shape (HelloFacts of HelloReply) is walked as that shape's fields
    bases = {
        name
        for name, base in every.items()
        for shape in replies
        if name != shape and _hints(base).items() <= _hints(every[shape]).items()
    }
    assert set(every) - replies - requests - bases == set()
    assert {"HelloReply", "TaskStatusShape", "RunShape", "GpuShape", "PruneReply"} <= replies
    assert set(reply_bounds.VERSIONS) == set(EXAMPLES)  # each version field has an example


@pytest.mark.parametrize("shape", sorted(reply_shapes().values(), key=lambda s: s.__name__))
def test_a_valid_reply_passes_the_edge(shape: Any) -> None:
    reply = valid(shape, "")
    assert Edge(HOST, "op").reply(copy.deepcopy(reply), shape) == reply


@pytest.mark.parametrize(("shape", "path", "name"), list(cases()))
def test_a_hostile_field_is_refused_or_cleaned(shape: Any, path: At, name: str) -> None:
    wrong = []
    for value in [*WRONG_TYPES, *HOSTILE_NUMBERS, *HOSTILE_TEXTS]:
        try:
            hostile(shape, path, name, value)
        except AssertionError as exc:
            wrong.append(f"{value!r:.30}: {exc}")
    assert not wrong, "\n".join(wrong)


def hostile(shape: Any, path: At, name: str, value: object) -> None:
    """`value` at `path` of a valid reply: refused naming host, op and field, or bounded."""
    reply = valid(shape, "")
    if path[-1] == "key" and isinstance(value, str):
        holder = get(reply, path[:-1])
        holder[value] = holder.pop("key")  # the hostile text as the dict's key
    else:
        put(reply, path, value)
    op = f"op-of-{shape.__name__}"
    try:
        result = Edge(HOST, op).reply(reply, shape)
    except HostError as exc:
        said = str(exc)
        assert said.startswith(f"{HOST}: its agent's {op} reply is not valid: "), said
        field = spelled(path[:-1] if path[-1] == "key" else path)
        assert field in said, f"the error does not name {field}: {said}"
        assert not CONTROL.search(said), said
        return
    walk_result(result, shape, "", shape.__name__)


@pytest.mark.parametrize(
    ("field", "value", "why"),
    [
        ("python", "3", "not a Python version"),
        ("glibc", "2.999999999", "not a glibc version"),
        ("glibc", "2.101", "101 is over 100"),
        ("tensorflow", "2.16\x1b[2J", "not a package version"),
        ("machine", "x86_64 --index-url http://evil", "not a machine name"),
        ("disk_free", -5, "not a count or size"),
    ],
)
def test_hello_version_facts_are_parsed_and_bounded(field: str, value: object, why: str) -> None:
    """`python = "3"` was an IndexError, glibc "2.999999999" a billion platform tags."""
    reply = valid(protocol.HelloReply, "")
    reply[field] = value
    with pytest.raises(HostError, match=f"{HOST}: its agent's hello reply is not valid: {field}"):
        try:
            Edge(HOST, "hello").reply(reply, protocol.HelloReply)
        except HostError as exc:
            assert why in str(exc), exc
            raise


def test_negative_prune_counts_are_refused() -> None:
    reply = valid(protocol.PruneReply, "")
    reply["bytes"] = -(2**40)
    with pytest.raises(HostError, match="prune reply is not valid: bytes is -1099511627776"):
        Edge(HOST, "prune").reply(reply, protocol.PruneReply)


def test_platform_tags_stay_bounded_whoever_builds_the_platform() -> None:
    """The edge refuses the glibc first; a platform built from elsewhere (the facts cache) lists
    no more tags than a real glibc has minors."""
    with pytest.raises(ValueError, match="not a glibc version"):
        HostPlatform.of("3.11.7", "x86_64", "2.999999999")
    with pytest.raises(ValueError, match="not a Python version"):
        HostPlatform.of("3", "x86_64", "2.36")
    huge = HostPlatform((3, 11), "x86_64", (2, 999_999_999))
    assert len(huge.platform_tags()) < 100


def test_the_gpus_op_reads_hostile_nvidia_smi_numbers_as_unreported(tmp_path: At) -> None:
    """`inf`, `1e400` and `²` from nvidia-smi were `the agent failed: OverflowError` (the
    agent's whole gpus op); now such a value is not reported, and the other GPUs are read."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").symlink_to(FAKE)
    odd = {"memory.total": "inf", "memory.used": "1e400", "utilization.gpu": "²"}
    (bin_dir / STATE_NAME).write_text(state(3, gpus={1: odd, 2: {"index": "²"}}))
    code = (
        f"import sys, json; sys.path.insert(0, {str(REMOTE)!r}); import agent; "
        'print(json.dumps(agent.handle(b\'{"v": 1, "op": "gpus", "workdir": "/tmp"}\')))'
    )
    env = os.environ | {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    reply = json.loads(done.stdout)
    assert reply["ok"], reply
    checked = Edge(HOST, "gpus").reply(reply, protocol.GpusReply)
    assert [g["index"] for g in checked["gpus"]] == [0, 1]  # "²" is no index: not a GPU
    assert checked["gpus"][1]["memory_total"] is None
    assert checked["gpus"][1]["memory_used"] is None
    assert checked["gpus"][1]["utilization"] is None
