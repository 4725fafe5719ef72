"""The fake host and the real agent answer the same requests with the same shapes.

tests/support/fakehost.py stands in for remote/agent.py under every in-process test of the
control side; a fake that answers what the agent no longer does (a renamed field, a state it
spells itself) lets those tests pass against a protocol nobody speaks. Here one script of
requests goes to a real agent (a local process, as tests/support/agent.py runs it) and to the
fake; each reply must be its op's shape in remote/protocol.py (checked by the control side's
own edge, deployer/hosts/replies.py), name no field the shape lacks, and have the same keys and
value types on both sides. A field changed on one side fails here until the other side, the
shape and the fake follow.
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path
from typing import Any

from deployer.hosts.replies import Edge, _hints, failure
from deployer.push.sync import CodeFile, HostRecord, Manifest
from remote import protocol
from tests.support.agent import call, ok, status, wait_for
from tests.support.fakehost import FakeClock, FakeHost
from tests.support.helpers import free_port

TASK = "worker:0"


def _script(run_id: str, port: int) -> list[tuple[str, Any, dict[str, Any]]]:
    """(op, reply shape, request fields), in the order a deploy sends them."""
    # The materialize requests as the control side builds them (deployer/push/sync.py).
    record = HostRecord(run_id, "demo", 30.0, "me@here", (("local", "127.0.0.1"),), 0.0)
    lacking = Manifest(Path("."), (CodeFile("a.txt", "0" * 64, 0o644, 1),))
    return [
        (protocol.OP_HELLO, protocol.HelloReply, {"ports": [port], "run_id": run_id}),
        (protocol.OP_HAVE, protocol.HaveReply, {"hashes": ["0" * 64]}),
        (
            protocol.OP_MATERIALIZE,
            protocol.MaterializeReply,
            dict(record.materialize(lacking, "local", or_missing=True)),
        ),
        (
            protocol.OP_MATERIALIZE,
            protocol.MaterializeReply,
            dict(record.materialize(Manifest(Path("."), ()), "local")),
        ),
        (
            protocol.OP_SETUP,
            protocol.SetupReply,
            {"run_id": run_id, "commands": [], "env": {}, "fingerprint": "f0"},
        ),
        (
            protocol.OP_START,
            protocol.TasksReply,
            {
                "run_id": run_id,
                "tasks": [{"name": TASK, "command": "echo hi > out.txt; echo hi", "env": {}}],
                "grace": 1,
            },
        ),
        (
            protocol.OP_POLL,
            protocol.PollReply,
            {"run_id": run_id, "offsets": {TASK: 0}, "ports": [port], "heartbeat": True},
        ),
        (protocol.OP_GPUS, protocol.GpusReply, {}),
        (
            protocol.OP_NETCHECK,
            protocol.ProbeReply,
            {
                "action": protocol.NETCHECK_PROBE,
                "run_id": run_id,
                "targets": [["127.0.0.1", port]],
                "wait": 0.5,
            },
        ),
        (
            protocol.OP_COLLECT,
            protocol.CollectReply,
            {"run_id": run_id, "patterns": ["out.txt"], "tasks": None, "hash": True},
        ),
        (
            protocol.OP_FETCH,
            protocol.FetchReply,
            {
                "run_id": run_id,
                "task": TASK,
                "path": "out.txt",
                "patterns": ["out.txt"],
                "offset": 0,
                "hash": True,
            },
        ),
        (protocol.OP_DETACH, protocol.DetachReply, {"run_id": run_id}),
        (protocol.OP_STOP, protocol.StopReply, {"run_id": run_id, "grace": 0, "tasks": None}),
        (protocol.OP_RUNS, protocol.RunsReply, {}),
        (protocol.OP_RELEASE, protocol.ReleaseReply, {"run_id": run_id}),
        (protocol.OP_PRUNE, protocol.PruneReply, {"keep": 1, "dry_run": True, "grace": 0}),
        (protocol.OP_IDLE, protocol.IdleReply, {"minutes": 0}),
        (
            protocol.OP_PEERS,
            protocol.ClosedReply,
            {"action": protocol.PEERS_CLOSE, "run_id": run_id},
        ),
    ]


def _ended(workdir: Path, run_id: str) -> bool:
    return bool(status(workdir, TASK, run_id)["state"] == protocol.STATE_EXITED)


def _fake_call(host: FakeHost, op: str, fields: dict[str, Any]) -> dict[str, Any]:
    line = json.dumps({"v": protocol.PROTOCOL_VERSION, "op": op, "workdir": "~/w", **fields})
    reply: dict[str, Any] = json.loads(host.answer(line.encode(), 5).partition(b"\n")[0])
    return reply


def _kind(value: object) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    return type(value).__name__


def differences(real: object, fake: object, where: str = "") -> list[str]:
    """Where the two replies' shapes differ: keys, and the types of values both give (null
    stands for any type: a task's pid is null on one side and a number on the other)."""
    if real is None or fake is None:
        return []
    if isinstance(real, dict) and isinstance(fake, dict) and where.endswith(KEYED_BY_DATA):
        return differences(next(iter(real.values()), None), next(iter(fake.values()), None), where)
    if isinstance(real, dict) and isinstance(fake, dict):
        found = [f"{where}{k}: only the agent's" for k in real.keys() - fake.keys()]
        found += [f"{where}{k}: only the fake's" for k in fake.keys() - real.keys()]
        for key in real.keys() & fake.keys():
            found += differences(real[key], fake[key], f"{where}{key}.")
        return found
    if isinstance(real, list) and isinstance(fake, list):
        return differences(real[0], fake[0], f"{where}[0].") if real and fake else []
    if _kind(real) != _kind(fake):
        return [f"{where}: the agent's is {_kind(real)}, the fake's {_kind(fake)}"]
    return []


# Fields that map names the host found to their values (HelloFacts.frameworks: what its Python
# has installed), not shapes: only their values' kinds are compared. A venv without Keras (the
# unit tier's `pip install -e '.[dev]'`) says {} where the fake says {"keras": "3.15.1"}.
KEYED_BY_DATA = ("frameworks.",)


def beyond(value: object, shape: Any, where: str = "") -> list[str]:
    """Fields a reply holds that its shape does not name (the edge ignores them: a field one
    side added and the shape lacks would pass there unseen)."""
    if not isinstance(value, dict):
        return []
    hints = _hints(shape)
    found = [f"{where}{k}" for k in value.keys() - hints.keys() - {"v", "ok"}]
    for key, kind in hints.items():
        inner = kind
        while getattr(inner, "__args__", None) and not hasattr(inner, "__required_keys__"):
            inner = next((a for a in inner.__args__ if a is not type(None)), None)
        if hasattr(inner, "__required_keys__"):
            items = value.get(key)
            if isinstance(items, dict) and kind is inner:
                found += beyond(items, inner, f"{where}{key}.")
            for item in items.values() if isinstance(items, dict) and kind is not inner else []:
                found += beyond(item, inner, f"{where}{key}[].")
            for item in items if isinstance(items, list) else []:
                found += beyond(item, inner, f"{where}{key}[].")
    return found


def test_the_fake_host_and_a_real_agent_answer_with_the_same_shapes(
    workdir: Path, run_id: str
) -> None:
    fake = FakeHost("a", FakeClock())
    port = free_port()
    problems: list[str] = []
    for op, shape, fields in _script(run_id, port):
        if op == protocol.OP_POLL:  # both tasks have written their line and ended
            wait_for(lambda: _ended(workdir, run_id), step=0.05)
            fake.write(TASK, "hi\n")
            fake.exit(TASK, 0)
        if op == protocol.OP_COLLECT:  # the file the real task wrote
            fake.files[TASK] = {"out.txt": b"hi\n"}
        real = ok(call(workdir, op, **fields))
        real.pop("_raw", None)
        said = _fake_call(fake, op, fields)
        assert said["ok"] is True, (op, said)
        for side, reply in (("agent", real), ("fake", said)):
            Edge(f"the {side}", op).reply(reply, shape)  # missing or mistyped: raises
            problems += [f"{op}: the {side} says {f}" for f in beyond(reply, shape)]
        problems += [f"{op}: {d}" for d in differences(real, said)]
    assert not problems, "\n".join(problems)


def test_a_failure_is_the_same_code_and_shape_from_the_fake_and_a_real_agent(
    workdir: Path, run_id: str
) -> None:
    """A start after `down` stopped the run: both sides answer ok:false with the code the
    control side matches (protocol.FAIL_RUN_STOPPED), never only a sentence."""
    fake = FakeHost("a", FakeClock())
    script = {op: fields for op, _, fields in _script(run_id, free_port())}
    for op in (protocol.OP_HELLO, protocol.OP_MATERIALIZE):
        ok(call(workdir, op, **script[op]))
        _fake_call(fake, op, script[op])
    for ask in (lambda op, f: ok(call(workdir, op, **f)), functools.partial(_fake_call, fake)):
        ask(protocol.OP_STOP, {"run_id": run_id, "grace": 0, "tasks": None})
    real = call(workdir, protocol.OP_START, **script[protocol.OP_START])
    said = _fake_call(fake, protocol.OP_START, script[protocol.OP_START])
    for side, reply in (("agent", real), ("fake", said)):
        assert reply["ok"] is False, (side, reply)
        Edge(f"the {side}", protocol.OP_START).reply(reply, protocol.FailureReply)
        assert not beyond(reply, protocol.FailureReply), (side, reply)
        assert reply["code"] == protocol.FAIL_RUN_STOPPED, (side, reply)
    error = failure("h1", real)
    assert (error.code, error.host) == (protocol.FAIL_RUN_STOPPED, "h1")


def test_a_failure_code_the_control_side_does_not_know_is_a_plain_refusal() -> None:
    error = failure("h1", {"ok": False, "error": "\x1b]52;c;ZWNobw==\x07no", "code": "x" * 99})
    assert error.code == protocol.FAIL_REFUSED and "\x1b" not in error.cause
    damaged = {"ok": False, "error": "e", "code": protocol.FAIL_DAMAGED}
    assert failure("h1", {**damaged, "subject": "../../etc"}).subject is None
    assert failure("h1", {**damaged, "subject": "ab" * 32}).subject == "ab" * 32


def test_a_reply_that_lacks_a_field_of_its_shape_is_a_protocol_error_naming_it() -> None:
    edge = Edge("web1", protocol.OP_POLL)
    try:
        edge.reply({"tasks": [], "logs": []}, protocol.PollReply)
    except Exception as exc:
        assert (
            "web1" in str(exc) and "poll reply" in str(exc) and "listening is missing" in str(exc)
        )
    else:
        raise AssertionError("a poll reply without `listening` was taken")


def _section(doc: str, op: str) -> str:
    start = doc.index(f"### `{op}`\n")
    return doc[start : doc.index("\n### ", start + 1)]


def test_every_field_of_every_shape_is_in_its_ops_section_of_the_protocol_doc() -> None:
    """docs/PROTOCOL.md says per op what the shapes hold: a field added to a shape and not to
    its section (or a section left with a field the shape lost) is found here."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "PROTOCOL.md").read_text()
    missing = []
    for op, *shapes in WIRE:
        section = _section(doc, op)
        for shape in shapes:
            missing += [
                f"{op}: {shape.__name__}.{f}"
                for f in _hints(shape)
                if f"`{f}`" not in section and f'"{f}"' not in section
            ]
    status = doc[doc.index("A task status is") :][:600]
    missing += [
        f"task status: {f}" for f in _hints(protocol.TaskStatusShape) if f'"{f}"' not in status
    ]
    assert not missing, (
        "fields the protocol doc does not name in their op's section:\n" + "\n".join(missing)
    )


P = protocol
# Each op with its request shape and every reply shape it may answer.
WIRE: list[tuple[Any, ...]] = [
    (P.OP_HELLO, P.HelloRequest, P.HelloFacts, P.HelloReply, P.AbsentReply),
    (P.OP_HAVE, P.HaveRequest, P.HaveReply),
    (P.OP_MATERIALIZE, P.MaterializeBase, P.MaterializeRequest, P.MaterializeReply),
    (P.OP_SETUP, P.SetupRequest, P.SetupReply),
    (
        P.OP_START,
        P.StartBase,
        P.StartRequest,
        P.StartTaskBase,
        P.StartTask,
        P.SpotShape,
        P.ContainerShape,
        P.TasksReply,
    ),
    (P.OP_POLL, P.PollBase, P.PollRequest, P.PollBody, P.PollReply, P.LogShape),
    (P.OP_STOP, P.StopBase, P.StopRequest, P.StopReply, P.EscapedShape),
    (P.OP_RUNS, P.RunsRequest, P.RunsReply, P.RunShape),
    (P.OP_RELEASE, P.RunRequest, P.ReleaseReply),
    (P.OP_DETACH, P.RunRequest, P.DetachReply),
    (P.OP_GPUS, P.GpusReply, P.GpuShape, P.GpuAppShape),
    (P.OP_FIREWALL, P.FirewallBase, P.FirewallRequest, *P.FirewallReply.__args__),
    (P.OP_NETCHECK, P.NetcheckBase, P.NetcheckRequest, *P.NetcheckReply.__args__),
    (P.OP_COLLECT, P.CollectBase, P.CollectRequest, P.CollectReply, P.CollectedShape),
    (P.OP_FETCH, P.FetchBase, P.FetchRequest, P.FetchReply),
    (P.OP_IDLE, P.IdleBase, P.IdleRequest, P.IdleReply),
    (
        P.OP_PEERS,
        P.PeersBase,
        P.PeersRequest,
        *P.PeersReply.__args__,
        P.ChainEntryBase,
        P.ChainEntry,
    ),
    (P.OP_PRUNE, P.PruneBase, P.PruneRequest, P.PruneReply),
    (P.OP_ENVIRONMENT, P.EnvBase, P.EnvRequest, P.EnvReply),
    (P.OP_IMAGE, P.ImageBase, P.ImageRequest, P.ImageReply),
    (P.OP_ENV_PROGRESS, P.EnvProgressRequest, P.EnvProgressReply),
    (P.OP_KEEP, P.KeepBase, P.KeepRequest, *P.KeepReply.__args__),
    (P.OP_PROFILE, P.ProfileBase, P.ProfileRequest, P.ProfileReply, P.ProfiledShape),
]


def test_every_op_has_its_shapes() -> None:
    assert [w[0] for w in WIRE] == list(protocol.OPS)


def test_a_damaged_content_is_named_by_its_code_and_digest_through_the_stream(
    workdir: Path, run_id: str
) -> None:
    """A content whose bytes are not its hash ends the stream (remote/store.py): the failure
    still carries FAIL_DAMAGED and the content's sha256, which the push matches to name the
    file (push/sync.py `_changed`), never the sentence."""
    from tests.support.agent import raw_call

    data = b"what the manifest hashed"
    digest = hashlib.sha256(data).hexdigest()
    request = {
        "v": protocol.PROTOCOL_VERSION,
        "op": protocol.OP_MATERIALIZE,
        "workdir": str(workdir),
        "run_id": run_id,
        "job": "demo",
        "files": [["a.txt", digest, 0o644]],
        "blobs": [[digest, len(data)]],
    }
    damaged = bytes([data[0] ^ 0xFF]) + data[1:]
    reply = raw_call(json.dumps(request).encode() + b"\n" + damaged)
    assert reply["ok"] is False and reply["code"] == protocol.FAIL_DAMAGED, reply
    error = failure("h1", reply)
    assert (error.code, error.subject) == (protocol.FAIL_DAMAGED, digest)
