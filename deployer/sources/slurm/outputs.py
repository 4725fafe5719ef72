"""What Slurm's commands print, read into typed values, or a clear error naming the command.

Only output forms Slurm 22.05 (Debian 12) already has: `sbatch --parsable`, `squeue -h -o` with
fields tfdeploy names, `scontrol show ... -o` (one `Key=Value` line per record). Anything else
(a field missing, a state this module does not know, a count that is no number) is an
`UnreadableOutput` naming the command and the line: a changed Slurm shows as that error, never
as a wrong state.

The login node is untrusted (a wrapper earlier on its PATH prints what it likes): every answer is
bounded in size and line length before it is read, every number is ASCII digits of a bounded
length (`int()` alone takes `²`'s neighbours and 5,000-digit words), a hostlist's count is known
before it is expanded, and every text that reaches a person (a reason, a partition, a node's
state) is cleaned by the one output filter here, so each consumer gets clean text.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from enum import StrEnum

from deployer.core.errors import ExitStatus, TfdeployError
from deployer.core.lines import clean

SEP = "|"  # between squeue fields: no job id, state, count, partition or node name holds one
# squeue fields tfdeploy reads, the free-text reason last (it may hold spaces and commas); %k is
# the job's comment, where tfdeploy writes what it asked for (batch.request_comment).
QUEUE_FIELDS = ("%i", "%T", "%M", "%L", "%D", "%P", "%N", "%k", "%r")
QUEUE_FORMAT = SEP.join(QUEUE_FIELDS)
# What one command's answer may be before it is read: squeue lists a job's allocations (a few
# lines), scontrol one record per node asked (about 1 kB each, at most MAX_HOSTS of them).
MAX_OUTPUT = 16 * 1024 * 1024  # characters
MAX_LINE = 1024 * 1024  # one record (`scontrol show job -d -o` of a large allocation)
MAX_TEXT = 300  # a free text kept from a line (a reason, a state, a partition name)
MAX_COMMENT = 4000  # a job's comment (tfdeploy's own is a few hundred characters)
# A hostlist's names, counted before any is made. The inventory's own bound on nodes (a group
# has at most 100,000): no allocation tfdeploy asks for has more, and the caller passes the count
# it asked for as the real bound.
MAX_HOSTS = 100_000
MAX_DIGITS = 10  # a job id (uint32), a count, a range bound, a duration's field
MAX_GPUS = 1024  # GPU indices one node may grant
_DIGITS = re.compile(f"[0-9]{{1,{MAX_DIGITS}}}")  # ASCII only: \d takes every script's digits
# A node's name and address as tfdeploy hands them to srun and SSH: a hostname or an IP.
MAX_NAME = 255  # a hostname's length
_NAME = re.compile(r"[A-Za-z0-9._-]{1,255}")
_ADDRESS = re.compile(r"[A-Za-z0-9._:-]{1,255}")


class UnreadableOutput(TfdeployError):
    """A Slurm command answered in a form tfdeploy does not read (another Slurm version?)."""

    exit_status = ExitStatus.UNREACHABLE

    def __init__(self, command: str, problem: str, text: str) -> None:
        shown = [short(line) for line in text[: MAX_TEXT * 3].strip().splitlines()[:3]]
        super().__init__(
            f"`{short(command)}` printed what tfdeploy cannot read ({short(problem)}): "
            + (" / ".join(shown) if shown else "nothing"),
            hint="tfdeploy reads the output forms of Slurm 22.05 and later; tell us the Slurm "
            "version (`sinfo -V`) and this output",
        )
        self.command = command


def bounded(text: str, command: str) -> str:
    """`text` once it is known to be of a size and line length a Slurm command prints; an
    UnreadableOutput before anything reads it otherwise."""
    if len(text) > MAX_OUTPUT:
        raise UnreadableOutput(command, f"{len(text)} characters, over {MAX_OUTPUT}", "")
    longest = max((len(line) for line in text.splitlines()), default=0)
    if longest > MAX_LINE:
        raise UnreadableOutput(command, f"a line of {longest} characters, over {MAX_LINE}", "")
    return text


def number(word: str, command: str, what: str, line: str) -> int:
    """A count or id as Slurm prints it: ASCII digits, at most MAX_DIGITS of them."""
    if not _DIGITS.fullmatch(word):
        raise UnreadableOutput(command, f"{what} {short(word)!r}", line)
    return int(word)


def short(text: str) -> str:
    """A text from the login node as it may be shown or kept: cleaned, at most MAX_TEXT long."""
    text = clean(text)
    return text if len(text) <= MAX_TEXT else text[: MAX_TEXT - 1] + "\u2026"


class JobState(StrEnum):
    """Slurm's job states (squeue %T), as 22.05 names them."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUSPENDED = "SUSPENDED"
    COMPLETING = "COMPLETING"
    COMPLETED = "COMPLETED"
    CONFIGURING = "CONFIGURING"
    CANCELLED = "CANCELLED"
    FAILED = "FAILED"
    TIMEOUT = "TIMEOUT"
    PREEMPTED = "PREEMPTED"
    NODE_FAIL = "NODE_FAIL"
    BOOT_FAIL = "BOOT_FAIL"
    DEADLINE = "DEADLINE"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    REQUEUED = "REQUEUED"
    REQUEUE_HOLD = "REQUEUE_HOLD"
    REQUEUE_FED = "REQUEUE_FED"
    RESIZING = "RESIZING"
    REVOKED = "REVOKED"
    SIGNALING = "SIGNALING"
    SPECIAL_EXIT = "SPECIAL_EXIT"
    STAGE_OUT = "STAGE_OUT"
    STOPPED = "STOPPED"
    RESV_DEL_HOLD = "RESV_DEL_HOLD"

    @property
    def ended(self) -> bool:
        return self in _ENDED

    @property
    def waiting(self) -> bool:
        """Not running yet, or again: it holds no nodes for tfdeploy to use."""
        return self in _WAITING


_ENDED = frozenset(
    {
        JobState.COMPLETED,
        JobState.CANCELLED,
        JobState.FAILED,
        JobState.TIMEOUT,
        JobState.PREEMPTED,
        JobState.NODE_FAIL,
        JobState.BOOT_FAIL,
        JobState.DEADLINE,
        JobState.OUT_OF_MEMORY,
        JobState.REVOKED,
        JobState.SPECIAL_EXIT,
    }
)
_WAITING = frozenset(
    {
        JobState.PENDING,
        JobState.CONFIGURING,
        JobState.REQUEUED,
        JobState.REQUEUE_HOLD,
        JobState.REQUEUE_FED,
        JobState.RESV_DEL_HOLD,
    }
)
# Pending reasons no wait resolves: the request exceeds what the partition or account allows.
NEVER_REASONS = frozenset(
    {
        "PartitionConfig",
        "PartitionNodeLimit",
        "PartitionTimeLimit",
        "BadConstraints",
        "InvalidAccount",
        "InvalidQOS",
        "AccountNotAllowed",
        "QOSNotAllowed",
        "ReqNodeNotAvail, Reserved for maintenance",
    }
)


@dataclass(frozen=True)
class QueuedJob:
    """One line of `squeue -h -o QUEUE_FORMAT`."""

    id: str
    state: JobState
    elapsed: int | None  # seconds it has run (None: Slurm said INVALID or NOT_SET)
    left: int | None  # seconds before its time limit (None: UNLIMITED)
    nodes: int
    partition: str
    nodelist: str  # hostlist expression ("bh[2-3]"); empty while pending
    reason: str  # "None" while running
    comment: str = ""  # what tfdeploy asked for (batch.request_comment); "" when none


def parse_queue(text: str, command: str) -> list[QueuedJob]:
    """Every line of squeue's answer; an empty answer is no job."""
    jobs = []
    for line in bounded(text, command).splitlines():
        if not line.strip():
            continue
        parts = line.split(SEP, len(QUEUE_FIELDS) - 1)
        if len(parts) != len(QUEUE_FIELDS):
            raise UnreadableOutput(command, f"expected {len(QUEUE_FIELDS)} fields", line)
        job_id, state, elapsed, left, nodes, partition, nodelist, comment, reason = parts
        if not _JOB_ID.fullmatch(job_id):
            raise UnreadableOutput(command, f"a job id {short(job_id)!r}", line)
        nodelist = "" if nodelist in ("", "(null)") else nodelist
        hostlist_count(nodelist, command)  # of a form tfdeploy reads, and not too long
        jobs.append(
            QueuedJob(
                id=job_id,
                state=_state(state, command, line),
                elapsed=_duration(elapsed, command, line),
                left=_duration(left, command, line),
                nodes=number(nodes, command, "a node count", line),
                partition=short(partition),
                nodelist=nodelist,
                reason=short(reason.strip()),
                comment="" if comment == "(null)" else clean(comment)[:MAX_COMMENT],
            )
        )
    return jobs


_JOB_ID = re.compile(r"[0-9]{1,10}(?:_[0-9]{1,10})?")


def _state(word: str, command: str, line: str) -> JobState:
    # squeue may add a suffix of its own to some states ("CANCELLED by 0" is sacct's, not
    # squeue's %T; still, read the first word only).
    head = word.split()[0] if word.split() else word
    try:
        return JobState(head)
    except ValueError:
        raise UnreadableOutput(command, f"an unknown job state {short(word)!r}", line) from None


# M:SS, H:MM:SS, D-HH:MM:SS: ASCII digits, each field bounded (no 5,000-digit day count).
_DURATION = re.compile(r"(?:([0-9]{1,6})-)?(?:([0-9]{1,6}):)?([0-9]{1,6}):([0-9]{1,2})")


def _duration(word: str, command: str, line: str) -> int | None:
    if word in ("UNLIMITED", "INVALID", "NOT_SET", "N/A"):
        return None
    seconds = output_seconds(word)
    if seconds is None:
        raise UnreadableOutput(command, f"a duration {short(word)!r}", line)
    return seconds


def output_seconds(word: str) -> int | None:
    """A duration as squeue and scontrol print it (M:SS, H:MM:SS, D-HH:MM:SS); None: not one."""
    match = _DURATION.fullmatch(word)
    if match is None:
        return None
    days, hours, minutes, seconds = (int(g) if g else 0 for g in match.groups())
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


_LIMIT_FIELD = re.compile(r"[0-9]{1,6}")


def limit_seconds(word: str) -> int | None:
    """A time limit as sbatch reads it (MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS);
    None: not one."""
    days, dash, rest = word.rpartition("-")
    parts = rest.split(":")
    fields = [*parts, days] if dash else parts
    if len(parts) > 3 or not all(_LIMIT_FIELD.fullmatch(p) for p in fields):
        return None
    numbers = [int(p) for p in parts]
    if dash:  # D-HH, D-HH:MM, D-HH:MM:SS
        hours, minutes, seconds = [*numbers, 0, 0][:3]
        return ((int(days) * 24 + hours) * 60 + minutes) * 60 + seconds
    if len(numbers) == 1:
        return numbers[0] * 60
    if len(numbers) == 2:
        return numbers[0] * 60 + numbers[1]
    return (numbers[0] * 60 + numbers[1]) * 60 + numbers[2]


def say_duration(seconds: float) -> str:
    """1m40s, 2h05m: how the wait and time left read in a line."""
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def parse_submitted(text: str, command: str) -> str:
    """`sbatch --parsable`: the job id, maybe followed by ';cluster'."""
    text = bounded(text, command)
    line = text.strip().splitlines()[-1] if text.strip() else ""
    job_id = line.split(";")[0]
    if not _DIGITS.fullmatch(job_id):
        raise UnreadableOutput(command, "expected the job id", text)
    return job_id


# ---- scontrol show ... -o: one record per line, Key=Value words ------------------------------

_PAIR = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_:/]*)=(\S*)")


def records(text: str, command: str) -> list[dict[str, str]]:
    """`scontrol show node|partition -o`: each line's Key=Value words (the first of a key wins;
    free-text values such as Reason are cut at their first space, which no field read here has)."""
    found = []
    for line in bounded(text, command).splitlines():
        if not line.strip():
            continue
        record: dict[str, str] = {}
        for key, value in _PAIR.findall(line):
            record.setdefault(key, value)
        found.append(record)
    return found


def field(record: dict[str, str], key: str, command: str) -> str:
    if key not in record:
        raise UnreadableOutput(
            command, f"no {key}=", " ".join(f"{k}={v}" for k, v in record.items())
        )
    return record[key]


def _named(record: dict[str, str], key: str, command: str, form: re.Pattern[str]) -> str:
    """A name or address tfdeploy hands on (to srun, to SSH): of that form, or an error."""
    value = field(record, key, command)
    if not form.fullmatch(value):
        raise UnreadableOutput(command, f"{key}={short(value)!r}", f"{key}={value}")
    return value


@dataclass(frozen=True)
class Node:
    """An allocated node: its Slurm name, the address Slurm reaches it at, its state."""

    name: str
    address: str
    state: str  # e.g. "ALLOCATED", "MIXED", "DOWN*+DRAIN"


def parse_nodes(text: str, command: str) -> dict[str, Node]:
    nodes = {}
    for record in records(text, command):
        name = _named(record, "NodeName", command, _NAME)
        address = _named(record, "NodeAddr", command, _ADDRESS)
        nodes[name] = Node(name, address, short(field(record, "State", command)))
    return nodes


# `scontrol show config`'s line `ProctrackType = proctrack/cgroup` (22.05 and later print it so).
@dataclass(frozen=True)
class Partition:
    """What `scontrol show partition NAME -o` says that decides whether a request can ever run."""

    name: str
    total_nodes: int
    max_nodes: int | None  # None: UNLIMITED
    max_time: int | None  # seconds; None: UNLIMITED
    state: str


def parse_partition(text: str, command: str) -> Partition:
    found = records(text, command)
    if len(found) != 1:
        raise UnreadableOutput(command, "expected one partition", text)
    record = found[0]

    def count(key: str) -> int | None:
        word = field(record, key, command)
        return None if word == "UNLIMITED" else number(word, command, f"{key}=", text)

    total = count("TotalNodes")
    max_time = field(record, "MaxTime", command)
    seconds = None if max_time == "UNLIMITED" else output_seconds(max_time)
    if max_time != "UNLIMITED" and seconds is None:
        raise UnreadableOutput(command, f"MaxTime={short(max_time)}", text)
    return Partition(
        name=short(field(record, "PartitionName", command)),
        total_nodes=total or 0,
        max_nodes=count("MaxNodes"),
        max_time=seconds,
        state=short(field(record, "State", command)),
    )


_GRES = re.compile(r"Nodes=(\S+) CPU_IDs=\S+ Mem=\S+ GRES=(\S*)")
_IDX = re.compile(r"gpu(?::[^:(]+)?:[0-9]+\(IDX:([0-9,\-]+)\)")


def parse_granted_gpus(text: str, command: str, nodes: Sequence[str]) -> dict[str, tuple[int, ...]]:
    """`scontrol show job -d -o J`: which GPU indices each node granted the job
    ("Nodes=bh2 CPU_IDs=0-1 Mem=0 GRES=gpu:2(IDX:0-1)"); a node without a GRES entry got none.
    `nodes`: the job's nodes (a detail entry may name several at once, as a hostlist)."""
    if "JobId=" not in bounded(text, command):
        raise UnreadableOutput(command, "no JobId=", text)
    granted: dict[str, tuple[int, ...]] = {n: () for n in nodes}
    for names, gres in _GRES.findall(text):
        found = [i for m in _IDX.findall(gres) for i in index_list(m, command)]
        if len(found) > MAX_GPUS:
            raise UnreadableOutput(command, f"{len(found)} GPUs on one node", gres)
        for name in expand_hostlist(names, command, limit=len(nodes)):
            if name in granted:
                granted[name] = tuple(found)
    return granted


def index_list(text: str, command: str = "scontrol show job -d") -> list[int]:
    """ "0-1,3" -> [0, 1, 3]; at most MAX_GPUS of them, counted before any is listed."""
    ranges = [_range(part, command, text) for part in text.split(",")]
    if sum(last - first + 1 for first, last in ranges) > MAX_GPUS:
        raise UnreadableOutput(command, f"more than {MAX_GPUS} GPU indices", text)
    return [i for first, last in ranges for i in range(first, last + 1)]


# ---- hostlists ---------------------------------------------------------------------------------
#
# Slurm 22.05's forms, as `scontrol show hostnames` reads them (tested against it on the lab,
# tests/integration/test_slurm_lab.py): names split by commas outside brackets (empty ones
# skipped), each a name without brackets or a run of `piece[ranges]` (`rack[1-2]-n[01-04]`,
# `h[1-2][3-4]`), expanded in Slurm's order (`_product`); nothing may follow the last bracket.
# A range is `N` or `LO-HI` with LO <= HI, zero-padded to LO's width (`n[08-10]`: n08 n09
# n10). Forms Slurm reads but never prints (spaces or `+` inside a bracket) are refused.

_PIECE = re.compile(r"[A-Za-z0-9._-]*")


def _range(piece: str, command: str, text: str) -> tuple[int, int]:
    first, dash, last = piece.partition("-")
    if not _DIGITS.fullmatch(first) or (dash and not _DIGITS.fullmatch(last)):
        raise UnreadableOutput(command, f"a range {short(piece)!r}", text)
    lo, hi = int(first), int(last) if dash else int(first)
    if lo > hi:
        raise UnreadableOutput(command, f"a range {short(piece)!r} that runs backwards", text)
    return lo, hi


@dataclass(frozen=True)
class _Bracket:
    """One `piece[ranges]` of a name: the text before it and its (first, last, width) ranges;
    a name without brackets is one piece without ranges."""

    piece: str
    ranges: tuple[tuple[int, int, int], ...] = ()

    @property
    def count(self) -> int:
        return sum(last - first + 1 for first, last, _ in self.ranges) if self.ranges else 1

    def numbers(self) -> Iterator[str]:
        """Its numbers as they appear in names (zero-padded to their range's width)."""
        if not self.ranges:
            yield ""
        for first, last, width in self.ranges:
            for n in range(first, last + 1):
                yield f"{n:0{width}d}"


def _brackets(token: str, command: str, text: str) -> tuple[_Bracket, ...]:
    """`rack[1-2]-n[01-04]` as its brackets; a plain name as one bracket-less piece. A name
    never starts with '-' (scontrol and srun, handed it, would read an option)."""
    if token.startswith("-"):
        raise UnreadableOutput(command, f"a node name {short(token)!r}", text)
    found: list[_Bracket] = []
    at = 0
    while at < len(token):
        open_at = token.find("[", at)
        piece = token[at:] if open_at < 0 else token[at:open_at]
        if not _PIECE.fullmatch(piece):
            raise UnreadableOutput(command, f"a node name {short(token)!r}", text)
        if open_at < 0:
            if found:  # Slurm refuses text after the last bracket (`h[1-3]x`)
                raise UnreadableOutput(command, f"text after a bracket in {short(token)!r}", text)
            if len(piece) > MAX_NAME:
                raise UnreadableOutput(command, f"a node name of {len(piece)} characters", text)
            return (_Bracket(piece),)
        close_at = token.find("]", open_at)
        if close_at < 0:
            raise UnreadableOutput(command, f"an unclosed bracket in {short(token)!r}", text)
        inner = token[open_at + 1 : close_at]
        ranges = []
        for part in inner.split(","):
            first, last = _range(part, command, text)
            ranges.append((first, last, len(part.partition("-")[0])))
        found.append(_Bracket(piece, tuple(ranges)))
        at = close_at + 1
    longest = sum(len(b.piece) + max(max(w, len(str(hi))) for _, hi, w in b.ranges) for b in found)
    if longest > MAX_NAME:
        raise UnreadableOutput(command, f"a node name of {longest} characters", text)
    return tuple(found)


def _tokens(text: str, command: str) -> Iterator[tuple[_Bracket, ...]]:
    if len(text) > MAX_LINE:
        raise UnreadableOutput(command, f"a hostlist of {len(text)} characters", text)
    for token in _split_top(text, command):
        yield _brackets(token, command, text)


def hostlist_count(text: str, command: str = "hostlist", limit: int = MAX_HOSTS) -> int:
    """How many names the hostlist has, without making one; over `limit`: UnreadableOutput."""
    total = 0
    for brackets in _tokens(text, command):
        count = 1
        for bracket in brackets:
            count *= bracket.count  # each factor <= 10**MAX_DIGITS: checked once it grows
            if count > limit:
                break
        total += count
        if total > limit:
            raise UnreadableOutput(command, f"a hostlist of more than {limit} names", text)
    return total


def expand_hostlist(text: str, command: str = "hostlist", limit: int = MAX_HOSTS) -> list[str]:
    """A Slurm hostlist ("bh[2-3],gpu01") as names, in Slurm's order; counted first, so a list
    of more than `limit` names (`h[0-9999999999]`) is refused before any is made."""
    hostlist_count(text, command, limit)
    names: list[str] = []
    for brackets in _tokens(text, command):
        names += _product(brackets)
    return names


def _product(brackets: tuple[_Bracket, ...]) -> list[str]:
    """A name's brackets expanded in Slurm's order (hostlist.c, `_push_range_list`): the last
    bracket fastest, the others from the one before it outward (for `a[1-2]b[3-4]c[5-6]`, b's
    numbers slowest, then a's, then c's)."""
    last = len(brackets) - 1
    order = [*range(last - 1, -1, -1), last]  # the loops, outermost first
    names = []
    for combo in itertools.product(*(list(brackets[i].numbers()) for i in order)):
        number = dict(zip(order, combo, strict=True))
        names.append("".join(b.piece + number[i] for i, b in enumerate(brackets)))
    return names


def _split_top(text: str, command: str) -> list[str]:
    """Splits at the commas outside brackets (empty names skipped, as Slurm does)."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if depth not in (0, 1):
            raise UnreadableOutput(command, "brackets out of place", text)
        if ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise UnreadableOutput(command, "an unclosed bracket", text)
    parts.append(text[start:])
    return [p for p in parts if p]
