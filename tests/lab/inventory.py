"""A tiny TOML writer and the inventory shape tfdeploy reads (the project's contract)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tests.lab.model import LabHost

_ESCAPES = {
    '"': '\\"',
    "\\": "\\\\",
    "\b": "\\b",
    "\t": "\\t",
    "\n": "\\n",
    "\f": "\\f",
    "\r": "\\r",
}


def toml_key(key: str) -> str:
    """A bare key when TOML allows one, else a quoted key."""
    if key and all(c.isascii() and (c.isalnum() or c in "-_") for c in key):
        return key
    return toml_value(key)


def toml_value(value: Any) -> str:
    """Format one value: str, bool, int, float, Path, list, or dict as an inline table."""
    if isinstance(value, bool):  # before int: bool is an int subclass
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, Path):
        value = str(value)
    if isinstance(value, str):
        out = []
        for c in value:
            if c in _ESCAPES:
                out.append(_ESCAPES[c])
            elif ord(c) < 0x20 or ord(c) == 0x7F:
                out.append(f"\\u{ord(c):04X}")
            else:
                out.append(c)
        return '"' + "".join(out) + '"'
    if isinstance(value, Mapping):
        items = ", ".join(f"{toml_key(str(k))} = {toml_value(v)}" for k, v in value.items())
        return "{ " + items + " }" if items else "{}"
    if isinstance(value, Sequence):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} as TOML: {value!r}")


def _table(header: str, data: Mapping[str, Any]) -> list[str]:
    return [header] + [f"{toml_key(k)} = {toml_value(v)}" for k, v in data.items() if v is not None]


def render_inventory(
    *,
    job: Mapping[str, Any],
    ssh: Mapping[str, Any],
    hosts: Sequence[LabHost],
    tasks: Sequence[Sequence[Mapping[str, Any]]],
    per_host: Mapping[str, Mapping[str, Any]] | None = None,
) -> str:
    """The inventory text: [job], [ssh], then one [[hosts]] per host with its tasks.

    `per_host` gives extra keys of a host's entry by host name (`python`, `workdir`, ...).
    """
    if len(tasks) != len(hosts):
        raise ValueError(f"{len(tasks)} task lists for {len(hosts)} hosts")
    per_host = per_host or {}
    unknown = set(per_host) - {h.name for h in hosts}
    if unknown:
        raise ValueError(f"per_host names hosts not in the inventory: {sorted(unknown)}")
    lines = [*_table("[job]", job), "", *_table("[ssh]", ssh)]
    for host, host_tasks in zip(hosts, tasks, strict=True):
        lines += ["", "[[hosts]]"]
        lines += [f"name = {toml_value(host.name)}", f"address = {toml_value(host.address)}"]
        # A host's own `port` is its first TF port in the inventory contract; SSH's goes in `ssh`.
        extra = dict(per_host.get(host.name, {}))
        lines += [f"ssh = {toml_value({'port': host.port} | dict(extra.pop('ssh', {})))}"]
        lines += [f"{toml_key(k)} = {toml_value(v)}" for k, v in extra.items()]
        lines += [f"tasks = {toml_value(list(host_tasks))}"]
    return "\n".join(lines) + "\n"
