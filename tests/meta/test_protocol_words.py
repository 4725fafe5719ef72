"""The protocol's words are spelled once, in remote/protocol.py, and imported by both sides.

Op names, actions, task states, exit reasons, probe verdicts and environment names travel
between the control side and the agent as strings. A copy typed elsewhere drifts silently: a
renamed reason no longer matches, and a task stopped on purpose gets restarted. The guard reads
the sources (ast) and flags a protocol word where the code *uses* it as one: as an op or action
of a request, compared with or assigned to a task's `state`/`reason`, as a key of a table of
states or verdicts, compared as a probe verdict, or as a literal that is exactly an environment
name. Prose that happens to hold a common word ("running", "stop") or names a variable in a
message is not flagged, nor are other vocabularies such as EC2's instance states (compared with
a plain variable, not a task status).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from remote import protocol

ROOT = Path(__file__).resolve().parents[2]
PROTOCOL_FILE = ROOT / "remote" / "protocol.py"
# tests/support too: the fake host and the lab helpers stand in for the agent, and a word they
# spell themselves drifts from it as silently as the control side's would.
SOURCES = sorted(
    p
    for p in [
        *ROOT.glob("deployer/**/*.py"),
        *ROOT.glob("remote/*.py"),
        *ROOT.glob("tests/support/*.py"),
    ]
    if p != PROTOCOL_FILE
)


def words(prefix: str = "", suffix: str = "") -> set[str]:
    """Values of protocol's str constants named PREFIX..., or ...SUFFIX."""
    return {
        value
        for name, value in vars(protocol).items()
        if name.isupper()
        and isinstance(value, str)
        and name.startswith(prefix)
        and name.endswith(suffix)
    }


OPS = set(protocol.OPS)
ACTIONS = words("FIREWALL_") | words("NETCHECK_") | words("PEERS_")
STATES = set(protocol.TASK_STATES) | set(protocol.EXIT_REASONS)
VERDICTS = words("PROBE_")
ENV_NAMES = words(suffix="_ENV")
# Words no code writes on their own but as a reason: flagged as any literal outside docstrings.
UNAMBIGUOUS = {protocol.REASON_LEASE_EXPIRED, protocol.REASON_PREEMPTED}
# A table keyed by states or verdicts has two keys or more of them; one alone is a field of a
# reply (collect's "refused"). "signal" is a reason and a field of a task's status, "ok" a verdict
# and a field of every reply: they never make a dict a table.
FIELD_NAMES = {protocol.REASON_SIGNAL, protocol.PROBE_OK}
STATUS_FIELDS = {"state", "reason"}


def strings(node: ast.AST | None) -> Iterator[ast.Constant]:
    """The str constants a value expression may evaluate to (a literal, a tuple of them, ...)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        yield node
    elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        for element in node.elts:
            yield from strings(element)
    elif isinstance(node, ast.IfExp):
        yield from strings(node.body)
        yield from strings(node.orelse)
    elif isinstance(node, ast.BoolOp):
        for value in node.values:
            yield from strings(value)


def is_status_field(node: ast.AST) -> bool:
    """`x.state`, `x["reason"]`, `x.get("state")`: a task status's state or reason."""
    if isinstance(node, ast.Attribute):
        return node.attr in STATUS_FIELDS
    if isinstance(node, ast.Subscript):
        key = node.slice
        return isinstance(key, ast.Constant) and key.value in STATUS_FIELDS
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        first = node.args[0] if node.func.attr == "get" and node.args else None
        return isinstance(first, ast.Constant) and first.value in STATUS_FIELDS
    return False


def word(node: ast.AST | None) -> object:
    """The value of a str literal or of a `protocol.NAME` constant; None for anything else."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Attribute) and is_named(node.value, "protocol"):
        return getattr(protocol, node.attr, None)
    return None


def is_named(node: ast.AST, name: str) -> bool:
    return (isinstance(node, ast.Name) and node.id == name) or (
        isinstance(node, ast.Attribute) and node.attr == name
    )


def docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def offenders(source: str, where: str = "<snippet>") -> list[str]:
    """Each protocol word that `source` spells itself, as 'where:line: word (how it is used)'."""
    tree = ast.parse(source)
    found: dict[tuple[int, int], str] = {}

    def flag(const: ast.Constant, vocabulary: set[str], how: str) -> None:
        if const.value in vocabulary:
            key = (const.lineno, const.col_offset)
            found.setdefault(key, f"{where}:{const.lineno}: {const.value!r} ({how})")

    skipped = docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            if is_named(node.func, "call") and node.args:  # Agent.call(op, ...)
                for const in strings(node.args[0]):
                    flag(const, OPS, "an op")
            for keyword in node.keywords:
                for const in strings(keyword.value):
                    if keyword.arg == "op":
                        flag(const, OPS, "an op")
                    elif keyword.arg == "action":
                        flag(const, ACTIONS, "an action")
                    elif keyword.arg in STATUS_FIELDS:
                        flag(const, STATES, f"a task's {keyword.arg}")
        elif isinstance(node, ast.Dict):
            for vocabulary in (STATES, VERDICTS):
                keys = [k for k in node.keys if word(k) in vocabulary - FIELD_NAMES]
                for const in (c for k in keys if len(keys) > 1 for c in strings(k)):
                    flag(const, vocabulary, "a key of a table of states or verdicts")
            for key, value in zip(node.keys, node.values, strict=True):
                if isinstance(key, ast.Constant) and key.value in ("op", "action"):
                    for const in strings(value):
                        flag(
                            const, OPS if key.value == "op" else ACTIONS, f"a request's {key.value}"
                        )
                if isinstance(key, ast.Constant) and key.value in STATUS_FIELDS:
                    for const in strings(value):
                        flag(const, STATES, f"a task's {key.value}")
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            status = any(is_status_field(side) for side in sides)
            action = any(is_named(side, "action") for side in sides)
            for side in sides:
                for const in strings(side):
                    if status:
                        flag(const, STATES, "compared with a task's state or reason")
                    if action:
                        flag(const, ACTIONS, "compared with an action")
                    flag(const, VERDICTS, "compared as a probe verdict")
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(is_named(t, field) for t in targets for field in STATUS_FIELDS):
                for const in strings(node.value):
                    flag(const, STATES, "assigned to a task's state or reason")
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in skipped
        ):
            flag(node, ENV_NAMES, "an environment name")
            flag(node, UNAMBIGUOUS, "a reason")
    return [found[k] for k in sorted(found)]


def test_no_source_spells_a_protocol_word_itself() -> None:
    found = []
    for path in SOURCES:
        found += offenders(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))
    assert not found, (
        "use the constants of remote/protocol.py (`from remote import protocol` on the control "
        "side, `import protocol` in remote/):\n" + "\n".join(found)
    )


@pytest.mark.parametrize(
    ("source", "count"),
    [
        ('agent.call("stop", run_id=run_id)', 1),
        ('self.call("materialize", timeout=5)', 1),
        ('request = {"v": 1, "op": "hello"}', 1),
        ('agent.call(protocol.OP_PEERS, action="close")', 1),
        ('if action == "listen":\n    pass', 1),
        ('done = task.state in ("exited", "lost")', 2),
        ('if status.reason not in ("stopped", protocol.REASON_PREEMPTED):\n    pass', 1),
        ('ok = reply["state"] == "running"', 1),
        ('ok = t.get("reason") == "stopped"', 1),
        ('self.reason = "stopped"', 1),
        ('reason = "signal" if sig is not None else "exited"', 2),
        ('record = {"code": None, "reason": "stopped"}', 1),
        ('status = TaskStatus(name="w", state="lost")', 1),
        ('STYLES = {"running": "green", "lost": "red", "other": "blue"}', 2),
        ('STYLES = {"running": "green", protocol.STATE_LOST: "red"}', 1),
        ('WHY = {"timed out": "a firewall?", protocol.PROBE_REFUSED: "rejected?"}', 1),
        ('failed = [s for s in said if s != "ok"]', 1),
        ('env = {"TFDEPLOY_TASK": name, protocol.RUN_ID_ENV: run_id}', 1),
        ('value = os.environ.get("TFDEPLOY_SERVE_IDLE_S")', 1),
        ('self._begin_stop("lease expired")', 1),
        ('def f():\n    """Docstring."""\n    return x if y else "preempted"', 1),
    ],
)
def test_the_guard_flags_a_retyped_word(source: str, count: int) -> None:
    assert len(offenders(source)) == count, offenders(source)


@pytest.mark.parametrize(
    "source",
    [
        'view.step("stopping the rest: running tasks are stopped")',  # prose
        'return "lost (its supervisor vanished: host crash or kill -9)"',
        'return f"{self.reason} by tfdeploy"',
        'if state == "running":\n    pass',  # EC2's instance state, a plain variable
        'found = discover(client, states=("pending", "running", "stopping", "stopped"))',
        'rows = {"setup": list(job.setup), "gpus": list(t.gpus)}',  # fields of JSON output
        'out = {"ok": True, "signal": 9}',
        'reply = {"files": files, "refused": refused}',  # a field, not a table of verdicts
        "result = subprocess.call(argv)",
        'parser.add_parser("check", help="preflight only")',
        'def f():\n    """Every task\'s env holds TFDEPLOY_RUN_ID; a lease expired ... """',
        'msg = f"restart 1 (TFDEPLOY_ATTEMPT={attempt})"',  # a message naming it, not a use
        "agent.call(protocol.OP_STOP, action=protocol.PEERS_CLOSE)",
        "ok = task.state == protocol.STATE_LOST",
    ],
)
def test_the_guard_leaves_other_words_alone(source: str) -> None:
    assert offenders(source) == []


def test_the_vocabulary_groups_are_complete_and_distinct() -> None:
    """A constant added to protocol.py without its group tuple would be invisible to the agent
    (OPS is what it dispatches) and to this guard."""
    assert set(protocol.OPS) == words("OP_")
    assert len(protocol.OPS) == len(set(protocol.OPS))
    assert set(protocol.TASK_STATES) == words("STATE_")
    assert len(protocol.TASK_STATES) == len(set(protocol.TASK_STATES))
    assert set(protocol.EXIT_REASONS) == words("REASON_")
    assert len(protocol.EXIT_REASONS) == len(set(protocol.EXIT_REASONS))
    assert all(name.startswith("TFDEPLOY_") for name in ENV_NAMES)
    assert len(ENV_NAMES) == len([n for n in vars(protocol) if n.endswith("_ENV")])


def test_the_agent_dispatches_exactly_the_protocols_ops() -> None:
    """remote/agent.py keys its OPS table with protocol's names, and serves all of them."""
    tree = ast.parse((ROOT / "remote" / "agent.py").read_text(encoding="utf-8"))
    table = next(
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.AnnAssign)
        and isinstance(node.target, ast.Name)
        and node.target.id == "OPS"
    )
    assert isinstance(table, ast.Dict)
    for key in table.keys:
        assert isinstance(key, ast.Attribute) and isinstance(key.value, ast.Name), ast.dump(key)
        assert key.value.id == "protocol" and key.attr.startswith("OP_"), ast.unparse(key)
    # As on a host: the agent's directory alone on sys.path, protocol imported top-level.
    code = (
        f"import sys, json; sys.path.insert(0, {str(ROOT / 'remote')!r}); import agent, protocol; "
        "print(json.dumps([list(agent.OPS), list(protocol.OPS)]))"
    )
    out = subprocess.run(
        [sys.executable, "-I", "-c", code], capture_output=True, text=True, check=True, timeout=30
    ).stdout
    served, named = json.loads(out)
    assert served == named == list(protocol.OPS)
