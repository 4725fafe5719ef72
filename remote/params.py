"""Request parameters and names checked before they touch the host: sentences, not tracebacks."""

from __future__ import annotations

import re
from pathlib import PurePosixPath
from typing import Any

import protocol

_NAME_RE = re.compile(r"[A-Za-z0-9._-]+")
_TASK_RE = re.compile(r"[A-Za-z0-9._-]+(:[0-9]+)?")
_HASH_RE = re.compile(r"[0-9a-f]{64}")
_MISSING: Any = object()


class AgentError(Exception):
    """A request the agent cannot honour; the message becomes the reply's error sentence, and
    `code` (protocol.FAIL_*) what the control side matches."""

    def __init__(
        self, message: str, code: str = protocol.FAIL_REFUSED, subject: str | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.subject = subject


class StreamError(AgentError):
    """The raw bytes after the request line could not be read to their end: what is left on
    stdin is not a request, so the session answers this one and ends."""

    @classmethod
    def of(cls, exc: BaseException) -> StreamError:
        """`exc` (an AgentError keeps its code and subject) as the error that ends the stream."""
        if isinstance(exc, AgentError):
            return cls(str(exc), exc.code, exc.subject)
        return cls(str(exc))


class CallerGone(StreamError):
    """The controller left while its request was handled (caller.py): the op stops and the
    session ends, since nobody reads the reply."""


def param(
    req: dict[str, Any], key: str, kind: type | tuple[type, ...], default: Any = _MISSING
) -> Any:
    """One request parameter, type-checked so a bad request gets a sentence, not a traceback."""
    if key not in req or (req[key] is None and default is not _MISSING):
        if default is _MISSING:
            raise AgentError(f"op {req.get('op')!r} needs the parameter {key!r}")
        return default
    value = req[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    # bool is an int subclass; a JSON true must not pass as a port number or a byte count.
    if isinstance(value, bool) and bool not in kinds:
        raise AgentError(f"parameter {key!r} must be {_kind_name(kinds)}, got a boolean")
    if not isinstance(value, kinds):
        raise AgentError(f"parameter {key!r} must be {_kind_name(kinds)}, got {value!r:.60}")
    return value


def _kind_name(kinds: tuple[type, ...]) -> str:
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}
    names.update({list: "a list", dict: "an object"})
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def check_name(value: Any, what: str) -> str:
    """Run ids and fingerprints become directory names, so only a tame alphabet passes."""
    if not isinstance(value, str) or not _NAME_RE.fullmatch(value) or value in {".", ".."}:
        raise AgentError(f"{what} {value!r} is not allowed: use letters, digits, '.', '_', '-'")
    return value


def task_dirname(name: Any) -> str:
    """Task "worker:1" lives in tasks/worker-1."""
    if not isinstance(name, str) or not _TASK_RE.fullmatch(name) or name in {".", ".."}:
        raise AgentError(f"task name {name!r} is not allowed: use ROLE or ROLE:INDEX")
    return name.replace(":", "-")


def check_hash(value: Any) -> str:
    if not isinstance(value, str) or not _HASH_RE.fullmatch(value):
        raise AgentError(f"{value!r:.80} is not a sha256 hex digest (64 lowercase hex digits)")
    return value


def check_relpath(value: Any) -> PurePosixPath:
    """A path under code/: never absolute, never climbing out with '..'."""
    path = PurePosixPath(value) if isinstance(value, str) and value and "\0" not in value else None
    if path is None or path.is_absolute() or ".." in path.parts or not path.parts:
        raise AgentError(f"unsafe relative path {value!r}: it must stay inside the run's code/")
    return path


def check_env(env: dict[str, Any]) -> dict[str, str]:
    """Env values reach execve as-is, so only string keys/values without NUL or '=' in keys."""
    for key, value in env.items():
        if not key or "=" in key or "\0" in key or not isinstance(value, str) or "\0" in value:
            raise AgentError(f"environment variable {key!r} needs a name and a string value")
    return env
