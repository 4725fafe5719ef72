"""What Slurm's commands print, read into typed values, or a clear error naming the command.

Only output forms Slurm 22.05 (Debian 12) already has: `sbatch --parsable`, `squeue -h -o` with
fields tfdeploy names, `scontrol show ... -o` (one `Key=Value` line per record). Anything else
(a field missing, a state this module does not know, a count that is no number) is an
`UnreadableOutput` naming the command and the line: a changed Slurm shows as that error, never
as a wrong state.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from deployer.core.errors import ExitStatus, TfdeployError

SEP = "|"  # between squeue fields: no job id, state, count, partition or node name holds one
# squeue fields tfdeploy reads, the free-text reason last (it may hold spaces and commas).
QUEUE_FIELDS = ("%i", "%T", "%M", "%L", "%D", "%P", "%N", "%r")
QUEUE_FORMAT = SEP.join(QUEUE_FIELDS)


class UnreadableOutput(TfdeployError):
    """A Slurm command answered in a form tfdeploy does not read (another Slurm version?)."""

    exit_status = ExitStatus.UNREACHABLE

    def __init__(self, command: str, problem: str, text: str) -> None:
        shown = text.strip().splitlines()[:3]
        super().__init__(
            f"`{command}` printed what tfdeploy cannot read ({problem}): "
            + (" / ".join(shown) if shown else "nothing"),
            hint="tfdeploy reads the output forms of Slurm 22.05 and later; tell us the Slurm "
            "version (`sinfo -V`) and this output",
        )
        self.command = command


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


def parse_queue(text: str, command: str) -> list[QueuedJob]:
    """Every line of squeue's answer; an empty answer is no job."""
    jobs = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split(SEP, len(QUEUE_FIELDS) - 1)
        if len(parts) != len(QUEUE_FIELDS):
            raise UnreadableOutput(command, f"expected {len(QUEUE_FIELDS)} fields", line)
        job_id, state, elapsed, left, nodes, partition, nodelist, reason = parts
        if not re.fullmatch(r"\d+(_\d+)?", job_id):
            raise UnreadableOutput(command, f"a job id {job_id!r}", line)
        jobs.append(
            QueuedJob(
                id=job_id,
                state=_state(state, command, line),
                elapsed=_duration(elapsed, command, line),
                left=_duration(left, command, line),
                nodes=_count(nodes, command, line),
                partition=partition,
                nodelist="" if nodelist in ("", "(null)") else nodelist,
                reason=reason.strip(),
            )
        )
    return jobs


def _state(word: str, command: str, line: str) -> JobState:
    # squeue may add a suffix of its own to some states ("CANCELLED by 0" is sacct's, not
    # squeue's %T; still, read the first word only).
    head = word.split()[0] if word.split() else word
    try:
        return JobState(head)
    except ValueError:
        raise UnreadableOutput(command, f"an unknown job state {word!r}", line) from None


def _count(word: str, command: str, line: str) -> int:
    if not word.isdigit():
        raise UnreadableOutput(command, f"a node count {word!r}", line)
    return int(word)


_DURATION = re.compile(r"^(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)$")


def _duration(word: str, command: str, line: str) -> int | None:
    if word in ("UNLIMITED", "INVALID", "NOT_SET", "N/A"):
        return None
    seconds = output_seconds(word)
    if seconds is None:
        raise UnreadableOutput(command, f"a duration {word!r}", line)
    return seconds


def output_seconds(word: str) -> int | None:
    """A duration as squeue and scontrol print it (M:SS, H:MM:SS, D-HH:MM:SS); None: not one."""
    match = _DURATION.match(word)
    if match is None:
        return None
    days, hours, minutes, seconds = (int(g) if g else 0 for g in match.groups())
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


def limit_seconds(word: str) -> int | None:
    """A time limit as sbatch reads it (MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS);
    None: not one."""
    days, dash, rest = word.rpartition("-")
    parts = rest.split(":")
    if (dash and not days.isdigit()) or not all(p.isdigit() for p in parts) or len(parts) > 3:
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
    line = text.strip().splitlines()[-1] if text.strip() else ""
    job_id = line.split(";")[0]
    if not job_id.isdigit():
        raise UnreadableOutput(command, "expected the job id", text)
    return job_id


# ---- scontrol show ... -o: one record per line, Key=Value words ------------------------------

_PAIR = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_:/]*)=(\S*)")


def records(text: str) -> list[dict[str, str]]:
    """`scontrol show node|partition -o`: each line's Key=Value words (the first of a key wins;
    free-text values such as Reason are cut at their first space, which no field read here has)."""
    found = []
    for line in text.splitlines():
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


@dataclass(frozen=True)
class Node:
    """An allocated node: its Slurm name, the address Slurm reaches it at, its state."""

    name: str
    address: str
    state: str  # e.g. "ALLOCATED", "MIXED", "DOWN*+DRAIN"


def parse_nodes(text: str, command: str) -> dict[str, Node]:
    nodes = {}
    for record in records(text):
        name = field(record, "NodeName", command)
        nodes[name] = Node(
            name, field(record, "NodeAddr", command), field(record, "State", command)
        )
    return nodes


@dataclass(frozen=True)
class Partition:
    """What `scontrol show partition NAME -o` says that decides whether a request can ever run."""

    name: str
    total_nodes: int
    max_nodes: int | None  # None: UNLIMITED
    max_time: int | None  # seconds; None: UNLIMITED
    state: str


def parse_partition(text: str, command: str) -> Partition:
    found = records(text)
    if len(found) != 1:
        raise UnreadableOutput(command, "expected one partition", text)
    record = found[0]

    def number(key: str) -> int | None:
        word = field(record, key, command)
        if word == "UNLIMITED":
            return None
        if not word.isdigit():
            raise UnreadableOutput(command, f"{key}={word}", text)
        return int(word)

    total = number("TotalNodes")
    max_time = field(record, "MaxTime", command)
    seconds = None if max_time == "UNLIMITED" else output_seconds(max_time)
    if max_time != "UNLIMITED" and seconds is None:
        raise UnreadableOutput(command, f"MaxTime={max_time}", text)
    return Partition(
        name=field(record, "PartitionName", command),
        total_nodes=total or 0,
        max_nodes=number("MaxNodes"),
        max_time=seconds,
        state=field(record, "State", command),
    )


_GRES = re.compile(r"Nodes=(\S+) CPU_IDs=\S+ Mem=\S+ GRES=(\S*)")
_IDX = re.compile(r"gpu(?::[^:(]+)?:\d+\(IDX:([0-9,\-]+)\)")


def parse_granted_gpus(text: str, command: str, nodes: Sequence[str]) -> dict[str, tuple[int, ...]]:
    """`scontrol show job -d -o J`: which GPU indices each node granted the job
    ("Nodes=bh2 CPU_IDs=0-1 Mem=0 GRES=gpu:2(IDX:0-1)"); a node without a GRES entry got none.
    `nodes`: the job's nodes (a detail entry may name several at once, as a hostlist)."""
    if "JobId=" not in text:
        raise UnreadableOutput(command, "no JobId=", text)
    granted: dict[str, tuple[int, ...]] = {n: () for n in nodes}
    for names, gres in _GRES.findall(text):
        indices = tuple(i for m in _IDX.findall(gres) for i in index_list(m))
        for name in expand_hostlist(names):
            if name in granted:
                granted[name] = indices
    return granted


def index_list(text: str) -> list[int]:
    """ "0-1,3" -> [0, 1, 3]."""
    out: list[int] = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        out += range(int(first), int(last or first) + 1)
    return out


_RANGE = re.compile(r"^([^\[\],]*)\[([0-9,\-]+)\]([^\[\],]*)$")


def expand_hostlist(text: str) -> list[str]:
    """A Slurm hostlist ("bh[2-3],gpu01") as names, in order; one bracket per name, as Slurm
    prints lists of plain numbered nodes (zero padding kept)."""
    names: list[str] = []
    for part in _split_top(text):
        match = _RANGE.match(part)
        if match is None:
            names.append(part)
            continue
        prefix, ranges, suffix = match.groups()
        for piece in ranges.split(","):
            first, _, last = piece.partition("-")
            width = len(first)
            for n in range(int(first), int(last or first) + 1):
                names.append(f"{prefix}{n:0{width}d}{suffix}")
    return names


def _split_top(text: str) -> list[str]:
    """Splits at the commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p for p in parts if p]
