"""The push phase of `up`: the fan-out first, then the star push for what is left, and the lines
that tell what travelled (shared workdirs, the fan-out, the bytes this machine sent).

Its own module because it drives both the star push (sync.py) and the fan-out (fanout.py),
which must not know each other.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from deployer.config.plan import Plan
from deployer.core.text import human_size, join_names, plural
from deployer.hosts.fleet import Fleet, Member
from deployer.push import fanout
from deployer.push.fanout import Spread
from deployer.push.sync import (
    ByteMeter,
    HostRecord,
    Manifest,
    PushResult,
    materialize_or_missing,
    push_all,
)


def deliver(
    fleet: Fleet,
    members: Sequence[Member],
    plan: Plan,
    manifest: Manifest,
    record: HostRecord,
    groups: Sequence[Sequence[str]] = (),
    empty_stores: Collection[str] = (),
    meter: ByteMeter | None = None,
) -> list[str]:
    """Code to `members`; hosts sharing a workdir (`groups`) get each content once, via the
    first of each group, which alone takes part in the fan-out. Hosts whose store was empty at
    the hello (`empty_stores`: a first deploy) lack every content: nobody asks them which, so
    their first request after preflight is the push itself. Returns what to print."""
    shared = [g for g in groups if len(g) > 1]
    later = {h for g in shared for h in g[1:]}  # they find what their group's first stored
    spread = None
    run_id = record.run_id
    code = {f.sha256 for f in manifest.files}
    # host -> what it lacks, where that answer still holds. A group's later hosts find what
    # its first stored; an empty code directory builds the run dir in the asking materialize.
    firsts = [m for m in members if m.name not in later]
    known = {
        m.name: every
        for m in firsts
        if m.name in empty_stores and (every := sorted(code | set(manifest.extras_for([m.name]))))
    }
    done: dict[str, PushResult] = {}  # hosts that had every content: their run dir is built
    if plan.job.fanout:
        missing = dict(known) | fleet.each(
            lambda m: materialize_or_missing(m.agent, manifest, record),
            [m for m in firsts if m.name not in known],
            what="pushing the code failed",
        )
        files = len(manifest.files)
        done = {h: PushResult(files, 0, 0) for h, lack in missing.items() if not lack}
        spread = fanout.spread(fleet, firsts, plan, manifest, run_id, missing, meter)
        # The star push need not ask again (one round trip per host) where nothing changed
        # since: no chain ran.
        known = {h: lack for h, lack in missing.items() if lack} if spread is None else {}
    rest = [m for m in members if m.name not in done]
    results = done | push_all(fleet, rest, manifest, record, shared, known, meter)
    return push_summary(results, manifest, run_id, shared, spread)


def _some_were_there(
    results: dict[str, PushResult], manifest: Manifest, groups: Sequence[Sequence[str]]
) -> bool:
    """Whether a host already had some of the contents: a first push sends every content to
    each host it pushes to itself (a host sharing a workdir finds its group's, sent just now)."""
    later = {h for g in groups for h in g[1:]}
    contents = len(manifest.by_hash())
    return any(r.sent_files < contents for name, r in results.items() if name not in later)


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
        seed = human_size(spread.uplink_bytes)
        news = f"{human_size(sent)} sent from here ({seed} to the fan-out's seed)"
    else:
        news = f"{human_size(sent)} sent ({plural(sent_files, 'file')})"
        if _some_were_there(results, manifest, groups):
            news += ", the rest already there"
    files = plural(len(manifest.files), "file")
    lines.append(f"pushed {files} to {plural(len(results), 'host')}: {news} (run {run_id})")
    return lines
