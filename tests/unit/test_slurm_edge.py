"""What a Slurm login node prints is untrusted (issue 58): a wrapper earlier on its PATH prints
what it likes. Every parse path of deployer/sources/slurm/outputs.py is walked with hostile
values put into each field of a real answer (captured on the lab's Slurm 22.05.8): it must
raise the documented UnreadableOutput or hand on values that are bounded and clean (no control
character, no escape sequence, no text over MAX_TEXT); never another exception, never a
hostlist expanded before it is counted.

The hostile values are generated from the shapes (a number's, a duration's, a hostlist's, a
free text's), not listed for one field by hand: a field added to a parser is walked by the same
values. The parser's agreement with Slurm's own `scontrol show hostnames` is checked on the lab
(tests/integration/test_slurm_lab.py).
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from deployer.core.errors import InventoryError
from deployer.sources import load_inventory
from deployer.sources.slurm import batch, nodes, outputs
from deployer.sources.slurm.allocation import AllocationLost
from deployer.sources.slurm.cluster import Cluster
from deployer.sources.slurm.outputs import (
    MAX_HOSTS,
    MAX_LINE,
    MAX_OUTPUT,
    MAX_TEXT,
    UnreadableOutput,
    expand_hostlist,
    hostlist_count,
)
from deployer.sources.slurm.sbatch_options import LONG_OPTIONS, resolve
from deployer.sources.slurm.settings import OWN_OPTIONS, SlurmSettings
from tests.support.slurm_outputs import BASE, JOB_DETAIL, NODES, PARTITION

CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")

# ---- hostile values, from the shapes ---------------------------------------------------------

ESCAPES = (
    "\x1b]0;owned\x07",  # a terminal title
    "\x1b[2J\x1b[H",  # clear the screen
    "\x1b]52;c;ZWNobyBvd25lZA==\x07",  # OSC 52: write the clipboard
    "\x9b31m",  # C1 CSI
    "\x9d0;t\x9c",  # C1 OSC ... ST
    "\u202e",  # right-to-left override
    "\x00",
    "\r",
)


def numbers() -> Iterator[str]:
    """What a number's field may hold on a hostile node: nothing, signs, other scripts' digits
    (which int() takes), superscripts (which isdigit() takes and int() refuses), huge ones."""
    yield from ("", "-", "-1", "+1", " 1", "1 ", "1.5", "1e3", "0x10", "NaN", "²", "٣", "１")
    yield from ("9" * 11, "1" * 5000, "9" * 4301)
    yield from (f"1{e}" for e in ESCAPES)


def durations() -> Iterator[str]:
    yield from numbers()
    yield from (f"{n}:00" for n in ("²", "٣", "1" * 5000, "-1"))
    yield from ("1-", "-1:00", "1-2-3:00", "1:2:3:4:5", ":", "1" * 5000 + "-00:00:00", "0:60x")


def hostlists() -> Iterator[str]:
    """Every place of a hostlist's grammar with something wrong in it, and huge counts."""
    yield from ("h[-]", "h[]", "h[5-3]", "h[²]", "h[٣]", "h[1-²]", "h[1 -2]", "h[+1-2]", "h[-1]")
    yield from ("h[0-9999999999]", "h[0-99999999999999999999]", "h[1-2", "h[1-2]]", "h]1[")
    yield from ("h[[1-2]]", "h[1-3]x", "a-[1-2]-b", "a b", "h[1,]", "h[,1]", "h[1--2]")
    yield from ("[0-99999]" * 3, "a[0-999],b[0-99999999]", "h[" + "1," * 60000 + "1]")
    yield from (f"h{e}1" for e in ESCAPES)
    yield from (f"h[1-2{e}]" for e in ESCAPES)
    yield from (f"h[{n}]" for n in numbers())


def texts() -> Iterator[str]:
    yield from ESCAPES
    yield from (f"Resources{e}more" for e in ESCAPES)
    yield "R" * (MAX_TEXT * 10)
    yield "\x1b]0;" + "x" * 5000 + "\x07"


HOSTILE = {"number": numbers, "duration": durations, "hostlist": hostlists, "text": texts}

# ---- the answers, as fields of a shape -------------------------------------------------------

QUEUE_SHAPE = {  # squeue -o QUEUE_FORMAT, in its order
    "id": ("19", "number"),
    "state": ("RUNNING", "text"),
    "elapsed": ("0:28", "duration"),
    "left": ("9:32", "duration"),
    "nodes": ("2", "number"),
    "partition": ("gpu", "text"),
    "nodelist": ("h2-ec7e,h3-ec7e", "hostlist"),
    "comment": ("(null)", "text"),
    "reason": ("None", "text"),
}


def _queue_line(**values: str) -> str:
    fields = {k: values.get(k, v) for k, (v, _) in QUEUE_SHAPE.items()}
    return outputs.SEP.join(fields.values()) + "\n"


def _replaced(text: str, key: str, value: str) -> str:
    """A Key=Value answer with `key`'s value replaced (the field's first occurrence)."""
    return re.sub(rf"(?<!\S){re.escape(key)}=\S*", lambda _: f"{key}={value}", text, count=1)


SCONTROL_SHAPES: dict[str, tuple[str, dict[str, str]]] = {
    "nodes": (NODES, {"NodeName": "hostlist", "NodeAddr": "hostlist", "State": "text"}),
    "partition": (
        PARTITION,
        {
            "PartitionName": "text",
            "TotalNodes": "number",
            "MaxNodes": "number",
            "MaxTime": "duration",
            "State": "text",
        },
    ),
}


def _cases() -> Iterator[tuple[str, str, str]]:
    """(parser, field, hostile answer) for every field of every answer."""
    for key, (_, kind) in QUEUE_SHAPE.items():
        for value in HOSTILE[kind]():
            yield "queue", key, _queue_line(**{key: value})
    for parser, (text, fields) in SCONTROL_SHAPES.items():
        for key, kind in fields.items():
            for value in HOSTILE[kind]():
                yield parser, key, _replaced(text, key, value)
    for value in itertools.chain(hostlists(), numbers()):
        yield "gpus", "Nodes", _replaced(JOB_DETAIL, "Nodes", value)
        yield "gpus", "IDX", JOB_DETAIL.replace("IDX:0", f"IDX:{value}")
        yield "hostlist", "-", value
    for value in itertools.chain(numbers(), texts()):
        yield "submitted", "-", f"{value}\n"


PARSERS: dict[str, Callable[[str], Any]] = {
    "queue": lambda text: outputs.parse_queue(text, "squeue"),
    "nodes": lambda text: outputs.parse_nodes(text, "scontrol show node"),
    "partition": lambda text: outputs.parse_partition(text, "scontrol show partition"),
    "gpus": lambda text: outputs.parse_granted_gpus(text, "scontrol", ["h2-ec7e", "h3-ec7e"]),
    "hostlist": lambda text: expand_hostlist(text, "squeue", limit=MAX_HOSTS),
    "submitted": lambda text: outputs.parse_submitted(text, "sbatch --parsable"),
}


def _walk(value: Any) -> Iterator[Any]:
    """Every leaf of a parsed answer (dataclasses, dicts, lists, tuples)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            yield from _walk(getattr(value, f.name))
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _walk(k)
            yield from _walk(v)
    elif isinstance(value, list | tuple):
        for v in value:
            yield from _walk(v)
    else:
        yield value


CASES = list(_cases())


def test_the_walk_covers_every_parser_and_field() -> None:
    assert {parser for parser, _, _ in CASES} == set(PARSERS)
    assert len(CASES) > 800


@pytest.mark.parametrize("parser", sorted(PARSERS))
def test_every_hostile_value_is_refused_or_handed_on_clean_and_bounded(parser: str) -> None:
    refused = 0
    for _, key, text in (c for c in CASES if c[0] == parser):
        try:
            parsed = PARSERS[parser](text)
        except UnreadableOutput as e:  # the documented error, and only it
            refused += 1
            assert "printed what tfdeploy cannot read" in e.message
            assert CONTROL.search(e.message) is None, (key, e.message)
            assert len(e.message) < MAX_TEXT * 6, (key, len(e.message))
            continue
        for leaf in _walk(parsed):
            if isinstance(leaf, str):
                assert CONTROL.search(leaf) is None, (parser, key, leaf)
                assert "\u202e" not in leaf, (parser, key, leaf)
                # a free text is cut to MAX_TEXT (test_..._texts_are_cut); a node list of a form
                # Slurm prints is kept whole, within the line bound
                assert len(leaf) <= MAX_LINE, (parser, key, len(leaf))
            if isinstance(leaf, int):
                assert 0 <= leaf < 10**12, (parser, key, leaf)
    assert refused, f"no hostile value was refused by {parser}"


@pytest.mark.parametrize("value", ["h[-]", "²", "1" * 5000, "٣"])
def test_the_issues_malformed_numbers_are_the_documented_error(value: str) -> None:
    for key in ("nodes", "id", "elapsed"):
        with pytest.raises(UnreadableOutput, match="printed what tfdeploy cannot read"):
            outputs.parse_queue(_queue_line(**{key: value}), "squeue")
    with pytest.raises(UnreadableOutput):
        expand_hostlist(f"h[{value}]" if "[" not in value else value)


def test_a_hostlist_is_counted_before_it_is_expanded() -> None:
    # 10**10 names: refused by the count, in no time and no memory (it took 3.9 GB before).
    with pytest.raises(UnreadableOutput, match="more than 100000 names"):
        outputs.parse_queue(_queue_line(nodelist="h[0-9999999999]"), "squeue")
    assert hostlist_count("rack[1-2]-n[01-04],x[1-3,5]") == 12
    with pytest.raises(UnreadableOutput, match="more than 2 names"):
        expand_hostlist("h[1-3]", "squeue", limit=2)
    with pytest.raises(UnreadableOutput, match="more than 100 names"):
        hostlist_count("[0-9999999999]" * 3, "squeue", limit=100)


def test_a_running_allocations_list_is_counted_against_the_request_before_any_name(
    tmp_path: Path,
) -> None:
    # 50,000 names where 2 were asked: refused by the count; the cluster is never asked.
    path = tmp_path / "inv.toml"
    path.write_text(BASE.format(extra="", group=""))
    (source,) = load_inventory(path).pending
    settings: SlurmSettings = source.settings  # type: ignore[attr-defined]
    line = _queue_line(nodelist="h[1-50000]")
    (job,) = outputs.parse_queue(line, "squeue")
    with pytest.raises(AllocationLost, match=r"has 50000 nodes \(h\[1-50000\]\), the inventory"):
        nodes.allocated(cast(Cluster, None), settings, job)


def test_an_answer_over_the_size_or_line_bound_is_refused_before_it_is_read() -> None:
    with pytest.raises(UnreadableOutput, match="over"):
        outputs.parse_queue(_queue_line() * (MAX_OUTPUT // 30), "squeue")
    with pytest.raises(UnreadableOutput, match="a line of"):
        outputs.parse_nodes(NODES.replace("Arch=", "X=" + "x" * MAX_LINE + " Arch="), "scontrol")


def test_a_hostile_reason_reaches_status_clean() -> None:
    reason = "Resources\x1b]0;owned\x07\x1b[2J\x1b]52;c;ZWNobw==\x07\x9b31mred"
    (job,) = outputs.parse_queue(_queue_line(state="PENDING", nodelist="", reason=reason), "sq")
    assert job.reason == "Resourcesred"
    settings = SlurmSettings(login="local", partition="gpu", time="10", groups=())
    shown = nodes.without_hosts(settings, [job])
    assert shown.table is not None
    cells = [cell for row in shown.table.rows for cell in row]
    assert "pending (Resourcesred)" in cells
    assert not any(CONTROL.search(str(v)) for v in _walk(list(shown.table.documents)))


def test_free_texts_are_cut_to_a_bound() -> None:
    line = _queue_line(reason="R" * 10_000, partition="p" * 10_000, comment="c" * 10_000)
    (job,) = outputs.parse_queue(line, "squeue")
    assert len(job.reason) == len(job.partition) == MAX_TEXT
    assert len(job.comment) == outputs.MAX_COMMENT


def test_a_node_name_or_address_of_another_form_is_refused() -> None:
    for key in ("NodeName", "NodeAddr"):
        with pytest.raises(UnreadableOutput, match=key):
            outputs.parse_nodes(_replaced(NODES, key, "h2;rm\x1b[2J"), "scontrol show node")


# ---- sbatch_options, as sbatch reads them ----------------------------------------------------


def _with_options(tmp_path: Path, *options: str) -> None:
    path = tmp_path / "inv.toml"
    listed = ", ".join(f'"{o}"' for o in options)
    path.write_text(BASE.format(extra=f"sbatch_options = [{listed}]\n", group=""))
    load_inventory(path)


@pytest.mark.parametrize(
    "option,taken_for",
    [
        ("--job-n=x", "--job-name"),
        ("--parti=urgent", "--partition"),
        ("--ntasks-per-n=2", "--ntasks-per-node"),
        ("--tasks-per-n=2", "--tasks-per-node"),
        ("--j=x", "--job-name"),
        ("--comm=x", "--comment"),
        ("--test-o", "--test-only"),
        ("--clusters=b", "--clusters"),
    ],
)
def test_an_abbreviation_of_an_own_option_is_refused_as_what_sbatch_reads(
    tmp_path: Path, option: str, taken_for: str
) -> None:
    with pytest.raises(InventoryError, match="is set by tfdeploy") as info:
        _with_options(tmp_path, option)
    assert f"sbatch reads it as {taken_for}" in info.value.message or option.startswith(
        taken_for + "="
    )


def test_an_ambiguous_prefix_is_refused_as_sbatch_refuses_it(tmp_path: Path) -> None:
    with pytest.raises(InventoryError, match=r"--n is ambiguous to sbatch .*--nodes"):
        _with_options(tmp_path, "--n=2")
    with pytest.raises(InventoryError, match=r"--mem-per is ambiguous"):
        _with_options(tmp_path, "--mem-per=1G")


def test_a_value_is_asked_after_equals_and_refused_where_sbatch_takes_none(
    tmp_path: Path,
) -> None:
    # Alone, sbatch would take the next word for its value: `--test-only`, in the check.
    with pytest.raises(InventoryError, match=r"--comme \(sbatch reads it as --comment\)"):
        _with_options(tmp_path, "--comme")
    with pytest.raises(InventoryError, match="takes a value"):
        _with_options(tmp_path, "--mem")
    with pytest.raises(InventoryError, match="takes no value"):
        _with_options(tmp_path, "--overc=1")
    _with_options(tmp_path, "--mem=64G", "--exclusive", "--exclusive=user", "--overc", "--zzz=1")


def test_the_prefix_rule_is_getopt_longs_over_the_whole_table() -> None:
    for name in LONG_OPTIONS:
        assert resolve(name).name == name  # an exact name wins over a longer one
        for end in range(1, len(name)):
            found = resolve(name[:end])
            prefix = name[:end]
            others = [n for n in LONG_OPTIONS if n.startswith(prefix)]
            if prefix in LONG_OPTIONS:  # `--bb` is --bb, though --bbf starts with it
                assert found.name == prefix and not found.ambiguous
                continue
            assert found.name == (others[0] if len(others) == 1 else None)
            assert found.ambiguous == (len(others) > 1)
    assert all(o[2:] in LONG_OPTIONS for o in OWN_OPTIONS)


# ---- a kept allocation, by what it was asked for ---------------------------------------------


def test_a_kept_allocation_matches_only_the_request_it_was_asked_with(tmp_path: Path) -> None:
    def settings(extra: str = "", group: str = "") -> SlurmSettings:
        path = tmp_path / "inv.toml"
        path.write_text(BASE.format(extra=extra, group=group))
        (source,) = load_inventory(path).pending
        found: SlurmSettings = source.settings  # type: ignore[attr-defined]
        return found

    kept = batch.request_comment(settings())
    assert f"--comment={kept}" in batch.sbatch_argv(settings())
    assert " " not in kept  # one Key=Value word for scontrol
    assert batch.request_differences(settings(), kept) == []
    # Another command, tasks or roles on the same nodes: that is what a kept allocation is for.
    tasks = BASE.replace('tasks = [{{ role = "worker" }}]', 'tasks = [{{ role = "chief" }}]')
    (tmp_path / "inv.toml").write_text(tasks.format(extra="", group=""))
    (source,) = load_inventory(tmp_path / "inv.toml").pending
    assert batch.request_differences(source.settings, kept) == []  # type: ignore[attr-defined]
    other = dataclasses.replace(settings(), partition="urgent", time="00:10:00")
    assert batch.request_differences(other, kept) == [
        "partition gpu (this inventory: urgent)",
        "time 02:00:00 (this inventory: 00:10:00)",
    ]
    (said,) = batch.request_differences(settings('sbatch_options = ["--mem=1G"]\n'), kept)
    assert said.startswith("sbatch_options - (this inventory: ")
    assert "no request comment" in batch.request_differences(settings(), "")[0]
    hostile = kept.replace("partition=gpu", "partition=%1B%5D0%3Bx%07")
    (shown,) = batch.request_differences(settings(), hostile)
    assert CONTROL.search(shown) is None


@pytest.mark.parametrize(
    "extra,key",
    [
        ('time = "٣٠"', "time"),  # Arabic-Indic digits: \d took them
        ('time = "' + "1" * 5000 + '"', "time"),
        ('signal = "USR1@' + "1" * 5000 + '"', "signal"),  # int() raised ValueError
        ('signal = "USR1@٣٠٠"', "signal"),
    ],
)
def test_the_tables_own_numbers_are_ascii_and_bounded(tmp_path: Path, extra: str, key: str) -> None:
    text = BASE.format(extra=extra + "\n", group="")
    if key == "time":  # the hostile time in place of the table's own
        text = text.replace('time = "02:00:00"\n', "")
    path = tmp_path / "inv.toml"
    path.write_text(text)
    with pytest.raises(InventoryError, match=rf"slurm\.{key}"):
        load_inventory(path)
