"""`sudo /opt/tfdeploy/venv/bin/python -m bench.env [--cells small@4,tf@4,capped:tf@4]
[--reps 1] [--rate 100mbit] [--only by-hand|tfdeploy] [--dry-run] [--out docs/bench/env.md]`

A job's Python environment, from nothing on the hosts to every worker's first training step, on
lab hosts with no route out (like a private subnet without a NAT gateway), side by side:

  by hand      what a user does without tfdeploy: `pip download` here (once), the wheelhouse and
               the code to every host with parallel `rsync`, `python -m venv` + `pip install
               --no-index --find-links` on every host at once, then each task started over SSH;
  tfdeploy     `tfdeploy up` of the same job with `[job] requirements`, on hosts with no
               workdir and with an empty cache here (cold);
  warm         the same `tfdeploy up` again: the environment is unchanged;
  no reqs      the same job without `requirements`, on hosts that already hold the packages
               (the lab's own venv, which every host sees): what `warm` adds is the difference.

A cell is SET@N (uncapped) or capped:SET@N (this machine's uplink into the lab shaped to --rate
with tbf, checked by measurement first; then "one uplink copy", a single `scp -r` of the
wheelhouse to one host over the same link, is timed too). Sets: small (a few small wheels), sklearn
(scikit-learn with NumPy and SciPy), tf (examples/digits/requirements.txt: tensorflow-cpu and
scikit-learn). Every task is a worker; the tf set runs examples/digits/mwms.py (one epoch, no
checkpoints), the others a few lines that import the set and take one step. Phases end at:
preflight (tfdeploy's `preflight ok`), resolve (the wheels are here), send (on every host),
install (a venv on every host), running (every task printed its first line), first step (every
worker printed `first step done`). Uplink bytes are what this machine sent into the lab during
the arm (tx_bytes of the lab's bridge: frames, SSH included; what hosts pass to each other is
not in it). CPU here: this machine's busy core-seconds (/proc/stat, every process: the lab's
hosts too) until every worker's first step, and their share of all cores over that time.
Peak RSS: tfdeploy's own process; by hand, the largest process the arm ran here.
The lab's hosts share this machine's cores: installing N
venvs at once is CPU-bound here, which a real fleet is not.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from bench import report
from bench.__main__ import _fmt_bytes
from bench.dataplane import CORES
from bench.env_arms import WORKDIR, Arms, Sample, pip_download, wheelhouse_bytes
from bench.fanout import check_cap
from bench.report import tee_to
from bench.tools import BenchError, make_tmp
from deployer.core.digest import sha256_file
from tests.lab import Lab, LabHost, start_lab

ROOT = Path(__file__).resolve().parent.parent
DIGITS = ROOT / "examples" / "digits"

_STEP = """import os
print("tfdeploy-env TFDEPLOY_TASK=" + os.environ.get("TFDEPLOY_TASK", "?"), flush=True)
{body}
print(os.environ.get("TFDEPLOY_TASK", "?") + ": first step done", flush=True)
"""
SMALL = "import requests, rich, yaml  # the environment's packages"
SKLEARN = """from sklearn.datasets import load_digits
from sklearn.linear_model import SGDClassifier

x, y = load_digits(return_X_y=True)
SGDClassifier().partial_fit(x[:64], y[:64], classes=list(range(10)))"""


@dataclass(frozen=True)
class EnvSet:
    label: str
    requirements: str  # requirements.txt's text
    body: str | None  # the program's step; None: examples/digits/mwms.py


SETS = {
    "small": EnvSet("requests, pyyaml, rich", "requests\npyyaml\nrich\n", SMALL),
    "sklearn": EnvSet("scikit-learn (NumPy, SciPy)", "scikit-learn\n", SKLEARN),
    "tf": EnvSet("examples/digits/requirements.txt (tensorflow-cpu, scikit-learn)", "", None),
    # Wheels for every platform (the local index has x86_64 builds only): a mixed cell's i686
    # hosts can resolve it; uv's wheel is the one content of one platform.
    "pure": EnvSet("rich (pure Python)", "rich\n", "import rich  # the environment's package"),
}
ARMS = {  # name: the row's label, in the order they run
    "by-hand": "by hand (download, rsync, pip install --no-index)",
    "tfdeploy": "tfdeploy up, cold (uv, the default)",
    "warm": "tfdeploy up, warm (unchanged environment)",
    "changed": "tfdeploy up, one small requirement added (warm hosts)",
    "no-reqs": "tfdeploy up, no requirements (packages already on the hosts)",
    "tfdeploy-pip": 'tfdeploy up, cold, installer = "pip"',
}
ONLY = {
    "by-hand": ["by-hand"],
    "tfdeploy": ["tfdeploy", "warm", "changed", "no-reqs", "tfdeploy-pip"],
}
CHANGED = "six==1.17.0"  # the requirement the `changed` arm adds: one small pure wheel
DEFAULT_CELLS = "small@1,small@4,tf@4,capped:sklearn@16,capped:tf@4,mixed:pure@2"
MWMS_ARGS = "mwms.py --epochs 1 --checkpoint-dir="


@dataclass(frozen=True)
class Cell:
    set: str
    hosts: int
    capped: bool
    mixed: bool = False  # the second half of the hosts' Pythons report i686 (setarch)

    @property
    def title(self) -> str:
        link = "uplink capped" if self.capped else "uncapped"
        mixed = ", the second half's Python under `setarch i686`" if self.mixed else ""
        return f"{SETS[self.set].label}, {self.hosts} host(s){mixed}, {link}"


def parse_cells(text: str) -> list[Cell]:
    cells = []
    for item in text.split(","):
        kind, _, rest = item.rpartition(":")
        name, _, n = rest.partition("@")
        if kind not in ("", "capped", "mixed") or name not in SETS or not n.isdigit():
            raise BenchError(
                f"bad cell {item!r}: SET@N, capped:SET@N or mixed:SET@N, SET one of {list(SETS)}"
            )
        cells.append(Cell(name, int(n), kind == "capped", kind == "mixed"))
    return cells


def make_code(tmp: Path, name: str) -> tuple[Path, str]:
    """The job's code directory (requirements.txt and the program) and its command."""
    code = tmp / f"code-{name}"
    shutil.rmtree(code, ignore_errors=True)
    env = SETS[name]
    if env.body is None:
        shutil.copytree(DIGITS, code, ignore=shutil.ignore_patterns("__pycache__"))
        return code, f"python3 {MWMS_ARGS}"
    code.mkdir()
    (code / "requirements.txt").write_text(env.requirements)
    (code / "train.py").write_text(_STEP.format(body=env.body))
    return code, "python3 train.py"


def add_changed(code: Path) -> None:
    """requirements-changed.txt: the set's requirements and one small package more."""
    text = (code / "requirements.txt").read_text()
    (code / "requirements-changed.txt").write_text(text.rstrip("\n") + f"\n{CHANGED}\n")


# -- running a cell -------------------------------------------------------------------------------


@dataclass
class CellResult:
    samples: dict[str, list[Sample]]
    wheels: int  # the wheelhouse's bytes
    count: int  # its wheels
    one_copy: list[float]
    cap: str
    imports: list[str] = field(default_factory=list)  # the tf set's import-time diagnosis
    stores: list[str] = field(default_factory=list)  # a mixed cell's table: what each host holds


# What the first step waits on before training: the imports of examples/digits, timed by the
# interpreter itself (-X importtime), and whether its bytecode is written or found.
IMPORTS = (
    "import sys, time; t = time.monotonic(); import keras, tensorflow, sklearn; "
    "print(round(time.monotonic() - t, 2), sys.flags.dont_write_bytecode)"
)


def import_times(lab: Lab, host: LabHost) -> list[str]:
    """One host, nothing else running: `import keras, tensorflow, sklearn` with the lab's
    shared venv (the no-requirements arm's python) and with the job's venv, twice each (the
    first pays the page cache), and the slowest imports of the second."""
    venvs = lab.run(host, f"ls -d {WORKDIR}/envs/*/bin/python 2>/dev/null").stdout.split()
    said = []
    for label, python in (("shared /opt venv", lab.python), ("the job's venv", venvs[:1])):
        if not python:
            continue
        py = python if isinstance(python, str) else python[0]
        runs = [lab.run(host, f"{py} -c {shlex.quote(IMPORTS)}", timeout=600) for _ in range(2)]
        first, second = (r.stdout.strip() or r.stderr.strip()[-200:] for r in runs)
        top = lab.run(
            host,
            f"{py} -X importtime -c 'import keras, tensorflow, sklearn' 2>&1 | "
            "sort -t'|' -k2 -n | tail -3 | cut -c1-120",
            timeout=600,
        ).stdout.strip()
        said.append(
            f"{label} ({py}): import keras, tensorflow, sklearn {first.split()[0]} s cold, "
            f"{second.split()[0]} s again (dont_write_bytecode {second.split()[-1]}); slowest: "
            + "; ".join(" ".join(line.split()) for line in top.splitlines())
        )
    return said


def run_cell(lab: Lab, tmp: Path, cell: Cell, arms: list[str], reps: int, rate: str) -> CellResult:
    hosts = lab.hosts[: cell.hosts]
    code, command = make_code(tmp, cell.set)
    add_changed(code)
    bench = Arms(lab, tmp, code, command, tf=cell.set == "tf")
    if cell.mixed:  # what each host stores is the question: tfdeploy's cold arm answers it
        arms = [a for a in arms if a == "tfdeploy"]
        bench.per_host = {h.name: {"python": i686_python(lab)} for h in hosts[len(hosts) // 2 :]}
    wh = tmp / f"wheels-{cell.set}"  # untimed: the wheelhouse's size, and what scp copies
    if not wh.exists():
        pip_download(code / "requirements.txt", wh, time.monotonic())
    cap = ""
    if cell.capped:
        lab.cap_uplink(rate)
        cap = check_cap(lab, rate)
    else:
        lab.uncap_uplink()
    res = CellResult(defaultdict(list), wheelhouse_bytes(wh), len(list(wh.glob("*.whl"))), [], cap)
    for rep in range(reps):
        if cell.capped:
            res.one_copy.append(bench.one_copy(hosts[0], wh))
            _log(f"{cell.title}, rep {rep + 1}: one uplink copy {res.one_copy[-1]:.1f} s")
        state = tmp / f"state-{cell.set}-{cell.hosts}-{rep}"  # empty: tfdeploy resolves cold
        for arm in arms:
            s = _one(bench, arm, hosts, state, cell)
            res.samples[arm].append(s)
            _log(f"{cell.title}, rep {rep + 1}: {arm} {_fmt_sample(s)}")
        if cell.set == "tf" and rep == 0:
            res.imports = import_times(lab, hosts[0])
        if cell.mixed and rep == 0:
            res.stores = stores_table(lab, hosts, state, bench.last_output)
        bench.reset_tfdeploy(hosts)
        for used in (state, pip_state(state)):  # the next cell of this set resolves cold too
            shutil.rmtree(used, ignore_errors=True)
    return res


def pip_state(state: Path) -> Path:
    """The pip arm's own state (and so wheel cache) beside the cell's."""
    return state.with_name(state.name + "-pip")


def i686_python(lab: Lab) -> str:
    """The lab's Python under `setarch i686`: uname's machine, which the agent reports as the
    host's platform, says i686. In /var/tmp, which lab hosts see (their /tmp is their own)."""
    wrapper = Path("/var/tmp/tfdeploy-bench-i686/python3")
    wrapper.parent.mkdir(mode=0o755, exist_ok=True)
    wrapper.write_text(f'#!/bin/sh\nexec setarch i686 {lab.python} "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper)


def stores_table(
    lab: Lab, hosts: list[LabHost], state: Path, output: list[tuple[float, str]]
) -> list[str]:
    """Per host: the platform tfdeploy resolved for it, the installer that built its venv,
    and what its content store holds after the run (bytes; the wheels, by the controller's
    cache of their hashes)."""
    names = {sha256_file(w): w.name for w in state.rglob("*.whl")}
    text = "\n".join(line for _, line in output)
    platform = dict(re.findall(r"environment [0-9a-f]{12} for (\S+): CPython [\d.]+, (\S+),", text))
    rows = [
        "| host | platform | installer | store | wheels stored |",
        "| --- | --- | --- | --- | --- |",
    ]
    for host in hosts:
        held = lab.run(host, f"ls -A {WORKDIR}/store 2>/dev/null").stdout.split()
        size = lab.run(host, f"du -sb {WORKDIR}/store 2>/dev/null | cut -f1").stdout.strip()
        built = re.search(rf"environment built on .*\b{host.name}\b \((uv|pip), ", text)
        wheels = sorted(names[h] for h in held if h in names)
        rows.append(
            f"| {host.name} | {platform.get(host.name, '?')} | {built[1] if built else '?'} | "
            f"{_fmt_bytes(int(size or 0))} | {', '.join(wheels)} |"
        )
    return rows


def _one(bench: Arms, arm: str, hosts: list[LabHost], state: Path, cell: Cell) -> Sample:
    if arm == "by-hand":
        return bench.by_hand(hosts)
    name = f"{cell.set}-{cell.hosts}-{arm}"
    inventory = bench.inventory(
        hosts,
        name,
        requirements={"no-reqs": None, "changed": "requirements-changed.txt"}.get(
            arm, "requirements.txt"
        ),
        installer="pip" if arm == "tfdeploy-pip" else None,
    )
    if arm in ("tfdeploy", "tfdeploy-pip"):
        bench.reset_tfdeploy(hosts)
    if arm == "tfdeploy-pip":  # cold here too: a state (and so a wheel cache) of its own
        state = pip_state(state)
    return bench.tfdeploy(inventory, hosts, state)


def _fmt_sample(s: Sample) -> str:
    marks = " ".join(f"{k} {v:.1f}" for k, v in s.phases.items())
    return f"[{marks}] s, uplink {_fmt_bytes(s.uplink)}, peak RSS {s.rss_kb // 1024} MB"


# -- the report -----------------------------------------------------------------------------------

PHASES = ["preflight", "resolve", "send", "install", "running", "first"]
HEADS = ["preflight", "resolve", "send", "install", "start", "first step"]


def durations(s: Sample) -> list[float | None]:
    """Each phase's own seconds, from the end of the last phase seen before it (a phase the
    output did not mark is counted in the next one); None when not seen."""
    out: list[float | None] = []
    last = 0.0
    for phase in PHASES:
        end = s.phases.get(phase)
        out.append(None if end is None else end - last)
        last = last if end is None else end
    return out


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _secs(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f} s"


def _ratio(a: float | None, b: float | None) -> str:
    if a is None or not b:
        return "-"
    r = a / b
    return f"{r:.3f}x" if r < 0.1 else f"{r:.2f}x"


def _first(samples: list[Sample]) -> float | None:
    return _median([s.phases.get("first") for s in samples])


def cell_table(res: CellResult, arms: list[str]) -> str:
    head = ["arm", *HEADS, "to first step", "÷ by hand", "CPU here to first step"]
    head += ["uplink (÷ wheelhouse)", "peak RSS here"]
    rows = [head, ["---"] * len(head)]
    base = _first(res.samples.get("by-hand", []))
    for arm in arms:
        ss = res.samples[arm]
        if not ss:
            continue
        phases = [_median([durations(s)[i] for s in ss]) for i in range(len(PHASES))]
        up = statistics.median(s.uplink for s in ss)
        rss = statistics.median(s.rss_kb for s in ss) / 1024
        rows.append(
            [
                ARMS[arm],
                *(_secs(p) for p in phases),
                _secs(_first(ss)),
                _ratio(_first(ss), base),
                _cpu(_median([s.busy_first for s in ss]), _first(ss)),
                f"{_fmt_bytes(up)} ({up / res.wheels:.2f}x)",
                f"{rss:.0f} MB",
            ]
        )
    return "\n".join("| " + " | ".join(r) + " |" for r in rows)


def _cpu(busy: float | None, wall: float | None) -> str:
    """`164 core-s (90%)`: this machine's busy CPU seconds until the first step, and the share
    of all its cores over that time: near 100%, the arm's wall time is its CPU work over the
    cores, the lab's hosts all sharing them."""
    if busy is None or not wall:
        return "-"
    return f"{busy:.0f} core-s ({busy / (CORES * wall):.0%})"


def _diff(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def cell_notes(res: CellResult, cell: Cell) -> list[str]:
    """The targets' comparisons, each as its own line (medians)."""
    s = res.samples
    notes = []

    def end(arm: str, phase: str) -> float | None:
        return _median([x.phases.get(phase) for x in s.get(arm, [])])

    def span(arm: str, a: str, b: str) -> float | None:
        start, stop = end(arm, a), end(arm, b)
        return stop - start if start is not None and stop is not None else None

    if res.one_copy:
        copy = statistics.median(res.one_copy)
        notes.append(f"one uplink copy (scp -r of the wheelhouse to one host): {copy:.1f} s")
        for arm in ("by-hand", "tfdeploy", "tfdeploy-pip"):
            sent = span(arm, "resolve", "send")
            if sent is not None:
                notes.append(f"{ARMS[arm]}: send ÷ one uplink copy {_ratio(sent, copy)}")
    for arm in ("tfdeploy", "changed", "tfdeploy-pip"):
        used = {x.installer for x in s.get(arm, []) if x.installer}
        if used:
            notes.append(f"{ARMS[arm]}: installer on the hosts (its output) {'/'.join(used)}")
    for arm in ("tfdeploy", "tfdeploy-pip"):
        install = [span(a, "send", "install") for a in (arm, "by-hand")]
        if None not in install:
            notes.append(f"install, {ARMS[arm]} ÷ by hand: {_ratio(install[0], install[1])}")
    changed = span("changed", "send", "install")
    if changed is not None:
        resolving = _secs(span("changed", "preflight", "resolve"))
        notes.append(
            f"one requirement added ({CHANGED}) on warm hosts: environment ready (install "
            f"phase) in {changed:.1f} s; resolving it here {resolving}"
        )
    if s.get("warm") and s.get("no-reqs"):
        added = [_diff(end("warm", p), end("no-reqs", p)) for p in ("running", "first")]
        if None not in added:
            notes.append(
                f"warm, added against no requirements: {added[0]:+.2f} s to every task "
                f"running, {added[1]:+.2f} s to first step; uplink "
                f"{_fmt_bytes(statistics.median(x.uplink for x in s['warm']))} against "
                f"{_fmt_bytes(statistics.median(x.uplink for x in s['no-reqs']))}; "
                f"reinstalled: {'yes' if any(x.reinstalled for x in s['warm']) else 'no'}"
            )
    if res.cap:
        notes.append(f"cap checked before the runs (one TCP stream each): {res.cap}")
    notes += [f"first step's imports, {said}" for said in res.imports]
    return notes


# -- main -----------------------------------------------------------------------------------------

_STARTED = time.monotonic()


def _log(text: str) -> None:
    print(f"[{time.monotonic() - _STARTED:5.0f} s] {text}", file=sys.stderr, flush=True)


def main() -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.env",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--cells", default=DEFAULT_CELLS, help=f"({DEFAULT_CELLS})")
    p.add_argument("--reps", type=int, default=1, help="repetitions per cell (1)")
    p.add_argument("--rate", default="100mbit", help="the capped uplink, as tc says it (100mbit)")
    p.add_argument("--only", choices=sorted(ONLY), help="one side's arms only")
    p.add_argument("--dry-run", action="store_true", help="say what would run, run nothing")
    p.add_argument("--out", type=Path, help="also write the tables to this file (docs/bench/)")
    args = p.parse_args()
    cells = parse_cells(args.cells)
    arms = ONLY[args.only] if args.only else list(ARMS)
    if args.dry_run:
        for cell in cells:
            code, command = make_code(make_tmp(), cell.set)
            print(f"{cell.title}: `{command}`; arms: {', '.join(arms)}; x{args.reps}")
            shutil.rmtree(code.parent, ignore_errors=True)
        return 0
    if os.geteuid() != 0:
        print(f"the bench needs root (namespace lab): sudo {sys.executable} -m bench.env")
        return 2
    with tee_to(args.out, "bench.env"):
        return _run(args, cells, arms)


def _run(args: argparse.Namespace, cells: list[Cell], arms: list[str]) -> int:
    load_before, uptime_before = report.load(), _uptime()
    tmp = make_tmp()
    lab: Lab | None = None
    results: list[tuple[Cell, CellResult]] = []
    try:
        lab = start_lab(max(c.hosts for c in cells))
        on_hosts = lab.run(lab.hosts[0], "df -h /root | tail -1").stdout.strip()
        _log(f"lab up; a host's /root: {on_hosts}")
        for cell in cells:
            results.append((cell, run_cell(lab, tmp, cell, arms, args.reps, args.rate)))
    finally:
        if lab is not None:
            try:
                lab.uncap_uplink()
            finally:
                lab.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    for cell, res in results:
        print(f"\n### {cell.title}: {res.count} wheels, {_fmt_bytes(res.wheels)}\n")
        print(cell_table(res, arms))
        notes = cell_notes(res, cell)
        if notes:
            print("\n" + "\n".join(f"- {n}" for n in notes))
        if res.stores:
            print("\nWhat each host's content store holds after the run:\n")
            print("\n".join(res.stores))
    elapsed = time.monotonic() - _STARTED
    print(
        "\nEach phase's own seconds (start: until every task printed its first line; first "
        "step: until every worker printed `first step done`); medians"
        + (f" of {args.reps} runs" if args.reps > 1 else ", one run per arm")
        + f". Rate cap {args.rate} in capped cells.\n\n"
        f"tfdeploy: {_tree()}. Machine: {report.machine()}. Load average before/after: "
        f"{load_before} / {report.load()}; uptime before: {uptime_before}. "
        f"Bench wall time {elapsed / 60:.1f} min."
    )
    return 0


def _tree() -> str:
    """Which tfdeploy ran: the checkout's commit (and whether it had changes), where known."""
    git = ["git", "-C", str(ROOT)]
    head = subprocess.run([*git, "log", "-1", "--format=%h %p"], capture_output=True, text=True)
    if head.returncode != 0:
        return "a tree outside git"
    commit, *parents = head.stdout.split()
    merged = f" (a merge of {' and '.join(parents)})" if len(parents) > 1 else ""
    dirty = subprocess.run(
        [*git, "status", "--porcelain", "--", "deployer", "remote", "bench"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    return f"commit {commit}{merged}" + (" with local changes" if dirty else "")


def _uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as exc:
        print(f"bench failed: {exc}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print("interrupted: the lab is stopped", file=sys.stderr)
        sys.exit(130)
