"""The nvidia-smi stand-in (tests/fakes/nvidia-smi), the GPU UUIDs it prints, and its state.

The stand-in reads nvidia-smi.json next to itself (its docstring says what the file may hold);
`state(...)` builds one: GPU entries are field overrides over its defaults (4 A10G GPUs).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

FAKE = Path(__file__).resolve().parent.parent / "fakes" / "nvidia-smi"
STATE_NAME = "nvidia-smi.json"


def uuid(i: int) -> str:
    return f"GPU-fa4e0000-0000-4000-8000-00000000000{i}"


def state(
    n: int = 4,
    *,
    util: Sequence[int] = (),
    used: int = 0,
    gpus: Mapping[int, Mapping[str, Any]] | None = None,
    **rest: Any,
) -> str:
    """The stand-in's state as JSON: n GPUs with these utilizations and memory.used, `gpus`
    overrides per index (e.g. {1: {"retired_pages.pending": "Yes"}}), and the file's other keys
    (apps, lost, unsupported, fail) as given."""
    entries = [
        {"utilization.gpu": util[i] if i < len(util) else 0, "memory.used": used}
        | dict((gpus or {}).get(i, {}))
        for i in range(n)
    ]
    return json.dumps({"gpus": entries, **rest})


def install(lab: Any, host: Any, state_json: str | None = None) -> None:
    """The stand-in in a lab host's /root/bin (the agent looks in ~/bin), reading `state_json`
    (default: `state()`); again on the same host: the new state only. Each namespace-lab host
    has a private /root, so hosts can differ."""
    script = [
        "mkdir -p /root/bin",
        f"printf %s {shlex.quote(FAKE.read_text())} > /root/bin/nvidia-smi",
        "chmod +x /root/bin/nvidia-smi",
        f"printf %s {shlex.quote(state_json or state())} > /root/bin/{STATE_NAME}",
    ]
    done = lab.run(host, " && ".join(script))
    assert done.returncode == 0, done.stderr
