"""The lines `up` prints about a push: shared workdirs, the fan-out, the bytes this machine sent.

Its own module because it reads both the star push's results (sync.py) and the fan-out's
(fanout.py), which must not know each other.
"""

from __future__ import annotations

from collections.abc import Sequence

from deployer.core.text import join_names, plural
from deployer.push.fanout import Spread
from deployer.push.sync import Manifest, PushResult


def push_summary(
    results: dict[str, PushResult],
    manifest: Manifest,
    run_id: str,
    groups: Sequence[Sequence[str]] = (),
    spread: Spread | None = None,
) -> list[str]:
    """What a push did, in the words `up` prints: shared workdirs first, the fan-out, then what
    the controller sent (to the fan-out's seed and directly)."""
    lines = [f"{join_names(list(g))} share one workdir: each file is sent once" for g in groups]
    lines += spread.lines() if spread is not None else []
    direct = sum(r.sent_bytes for r in results.values())
    sent = direct + (spread.uplink_bytes if spread else 0)
    sent_files = sum(r.sent_files for r in results.values())
    if not sent:
        news = "0 bytes sent, every file was already there"
    elif spread is not None:
        news = f"{sent} bytes sent from here ({spread.uplink_bytes} to the fan-out's seed)"
    else:
        news = f"{sent} bytes sent ({plural(sent_files, 'file')}), the rest already there"
    files = plural(len(manifest.files), "file")
    lines.append(f"pushed {files} to {plural(len(results), 'host')}: {news} (run {run_id})")
    return lines
