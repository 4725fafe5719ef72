"""`sudo python -m bench.scale --sizes 16,64,128,256 --out docs/bench/scale.md`: cost per host.

For each N, a namespace lab of N hosts (one sleeping task per host) and the four verbs run as a
user runs them: a `tfdeploy` process (this interpreter, `-m deployer`) per verb. Each run is
measured by `os.wait4` on that process: wall seconds, controller CPU (user + sys) and peak RSS.
Next to them, pdsh (`-R exec`: one OpenSSH client per host) runs a command on every host, the
comparable work of one round of SSH to the fleet. The markdown table goes to --out; the slope
columns say what one more host costs the controller.

`--baseline REV` runs each verb of an earlier commit too, on the same lab, round by round beside
this checkout's (a git worktree of REV, its own state): its figures and the ratio to them are
measured under the same load, which a figure from another day is not.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench import report
from tests.lab import Lab, start_lab

REPO = Path(__file__).resolve().parent.parent
VERBS = ("check", "up --detach", "status", "down")
PDSH = "pdsh (ssh per host)"
TARGET_MS = 5.0  # marginal controller CPU per host per verb (issue 27)
TARGET_RSS_MB = 200.0


class ScaleError(RuntimeError):
    """A verb failed: the bench stops rather than report a number for work not done."""


@dataclass(frozen=True)
class Sample:
    """One process: wall seconds, CPU seconds (user + sys, its waited children too), peak RSS."""

    wall: float
    cpu: float
    rss_mb: float


def measure(
    argv: Sequence[str], *, env: dict[str, str], timeout: float = 600, cwd: Path = REPO
) -> Sample:
    """Runs argv to its end (in `cwd`: `-m deployer` imports the deployer found there first);
    raises ScaleError with its output when it fails."""
    with tempfile.TemporaryFile() as out:
        t0 = time.monotonic()
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd)
        try:
            _, status, usage = _wait4(proc, timeout)
        except BaseException:
            proc.kill()  # Ctrl-C or a timeout: the lab's stop follows, nothing may hold it
            proc.wait()
            raise
        wall = time.monotonic() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            out.seek(0)
            tail = out.read().decode(errors="replace")[-2000:]
            raise ScaleError(f"{' '.join(argv[2:])} failed (exit {proc.returncode}):\n{tail}")
    # ru_maxrss is in KiB on Linux: the largest resident set of the process (or a waited child)
    return Sample(wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024)


def _wait4(proc: subprocess.Popen[bytes], timeout: float) -> tuple[int, int, os.struct_rusage]:
    deadline = time.monotonic() + timeout
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            return pid, status, usage
        if time.monotonic() > deadline:
            raise ScaleError(f"{proc.args!r} ran past {timeout:g} s")
        time.sleep(0.01)


class Runner:
    """The four verbs and pdsh against one lab; `tree`: the checkout whose tfdeploy runs."""

    def __init__(self, lab: Lab, tmp: Path, tree: Path = REPO) -> None:
        self.lab, self.tree = lab, tree
        code = tmp / "code"
        code.mkdir(exist_ok=True)
        (code / "train.py").write_text("print('never run: the task is a sleep')\n")
        self.inventory = lab.write_inventory(
            tmp / f"scale-{len(lab.hosts)}.toml",
            tasks=[[{"role": "worker"}]] * len(lab.hosts),
            job={"code": str(code), "command": "sleep 1000", "name": "scale", "stop_grace": 10},
        )
        pythonpath = os.pathsep.join(filter(None, [str(tree), os.environ.get("PYTHONPATH")]))
        self.env = os.environ | {
            "TFDEPLOY_STATE_DIR": str(tmp / f"state-{tree.name}"),
            "PYTHONPATH": pythonpath,
            "NO_COLOR": "1",
        }

    def verb(self, verb: str) -> Sample:
        argv = [sys.executable, "-m", "deployer", *verb.split(), str(self.inventory)]
        return measure(argv, env=self.env, cwd=self.tree)

    def pdsh(self) -> Sample:
        """One OpenSSH client per host, all at once: `pgrep` of the task, like a status round."""
        names = ",".join(h.name for h in self.lab.hosts)
        argv = ["pdsh", "-S", "-R", "exec", "-f", str(len(self.lab.hosts)), "-w", names]
        argv += ["ssh", "-F", str(self.lab.ssh_config), "%h", "pgrep -c sleep || true"]
        return measure(argv, env=self.env | {"PDSH_RCMD_TYPE": "exec"})


def run_size(
    n: int, reps: int, tmp: Path, log: Callable[[str], None], baseline: Baseline | None = None
) -> dict[str, list[Sample]]:
    """A lab of n hosts; a warm-up round, then `reps` timed rounds of every verb and pdsh (and
    of the baseline's verbs, each round right after this checkout's)."""
    t0 = time.monotonic()
    lab = start_lab(n)
    log(f"N={n}: lab up in {time.monotonic() - t0:.1f} s")
    out: dict[str, list[Sample]] = defaultdict(list)
    try:
        arms = [("", Runner(lab, tmp))]
        if baseline is not None:
            arms.append((baseline.suffix, Runner(lab, tmp, baseline.tree)))
        for _, runner in arms:
            for verb in VERBS:  # untimed: installs the agent and pushes the code once
                runner.verb(verb)
        for rep in range(reps):
            for suffix, runner in arms:
                for verb in VERBS:
                    out[verb + suffix].append(runner.verb(verb))
                    log(f"N={n} rep {rep + 1}: {verb}{suffix}: {_fmt(out[verb + suffix][-1])}")
            out[PDSH].append(arms[0][1].pdsh())
            log(f"N={n} rep {rep + 1}: pdsh: {_fmt(out[PDSH][-1])}")
        left = [f"{h.name}: {x}" for h in lab.hosts for x in lab.leftovers(h)]
        if left:
            raise ScaleError(f"leftovers after down at N={n}: {left[:5]}")
    finally:
        t1 = time.monotonic()
        lab.stop()
        log(f"N={n}: lab down in {time.monotonic() - t1:.1f} s")
    return out


@dataclass(frozen=True)
class Baseline:
    """An earlier commit's checkout (a git worktree), compiled to bytecode like this one."""

    rev: str
    tree: Path

    @property
    def suffix(self) -> str:
        return f" @ {self.rev}"

    @classmethod
    def add(cls, rev: str, where: Path) -> Baseline:
        commit = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", rev],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        tree = where / f"baseline-{commit}"
        subprocess.run(
            ["git", "-C", str(REPO), "worktree", "add", "--detach", str(tree), commit],
            check=True,
            capture_output=True,
        )
        report.compile_tfdeploy(tree)
        return cls(commit, tree)

    def remove(self) -> None:
        subprocess.run(
            ["git", "-C", str(REPO), "worktree", "remove", "--force", str(self.tree)],
            capture_output=True,
        )


def _fmt(s: Sample) -> str:
    return f"wall {s.wall:.2f} s, cpu {s.cpu:.2f} s, rss {s.rss_mb:.0f} MB"


def _cell(values: list[float], unit: str, digits: int = 2) -> str:
    med = statistics.median(values)
    if len(values) == 1:
        return f"{med:.{digits}f} {unit}"
    return f"{med:.{digits}f} {unit} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def _cpu(res: dict[tuple[str, int], list[Sample]], what: str, n: int) -> float:
    return statistics.median(s.cpu for s in res[what, n])


def slope_ms(res: dict[tuple[str, int], list[Sample]], what: str, a: int, b: int) -> float:
    """Marginal controller CPU per host between a and b hosts (medians), in ms."""
    return (_cpu(res, what, b) - _cpu(res, what, a)) / (b - a) * 1000


def table(
    res: dict[tuple[str, int], list[Sample]], sizes: list[int], baseline: Baseline | None = None
) -> str:
    verbs = [*VERBS, *(v + baseline.suffix for v in VERBS)] if baseline else list(VERBS)
    md = lambda rs: "\n".join("| " + " | ".join(r) + " |" for r in rs)  # noqa: E731
    rows = [["verb", "N", "wall", "controller CPU", "peak RSS", "CPU ÷ pdsh"]]
    rows.append(["---"] * len(rows[0]))
    for what in (*verbs, PDSH):
        for n in sizes:
            got = res[what, n]
            if not got:
                continue
            ratio = _cpu(res, what, n) / _cpu(res, PDSH, n) if what != PDSH else 1.0
            rss = _cell([s.rss_mb for s in got], "MB", 0)
            if what == PDSH:
                rss += " per process (one ssh per host)"
            rows.append(
                [
                    f"`{what}`" if what != PDSH else what,
                    str(n),
                    _cell([s.wall for s in got], "s"),
                    _cell([s.cpu for s in got], "s"),
                    rss,
                    f"{ratio:.2f}x",
                ]
            )
    lo, mid = sizes[0], max((n for n in sizes if n <= 128), default=sizes[-1])
    hi = sizes[-1]
    head = ["verb", f"CPU per host {lo}→{mid}", *([f"{mid}→{hi}"] if hi > mid else [])]
    head += [f"peak RSS at {hi}", "target", "met"]
    slopes = [head, ["---"] * len(head)]
    for what in (*verbs, PDSH):
        if not res[what, lo] or not res[what, mid] or mid == lo:
            continue
        s1 = slope_ms(res, what, lo, mid)
        cells = [f"{s1:.2f} ms"]
        if hi > mid and res[what, hi]:
            cells.append(f"{slope_ms(res, what, mid, hi):.2f} ms")
        rss = statistics.median(s.rss_mb for s in res[what, hi]) if res[what, hi] else 0.0
        if what == PDSH:
            target, met = "(baseline)", ""
        else:
            target = f"<= {TARGET_MS:g} ms per host, RSS < {TARGET_RSS_MB:g} MB"
            met = "yes" if s1 <= TARGET_MS and rss < TARGET_RSS_MB else "**no**"
        name = f"`{what}`" if what != PDSH else what
        slopes.append([name, *cells, f"{rss:.0f} MB", target, met])
    text = md(rows) + "\n\n" + md(slopes) + "\n"
    if baseline is not None:
        text += "\n" + md(_against(res, sizes, baseline)) + "\n"
    return text


def _against(
    res: dict[tuple[str, int], list[Sample]], sizes: list[int], baseline: Baseline
) -> list[list[str]]:
    """Controller CPU per host (all of it, divided by N) of this checkout and the baseline,
    measured in the same rounds, and their ratio."""
    rows = [["verb", "N", "CPU per host", f"CPU per host @ {baseline.rev}", "÷ baseline"]]
    rows.append(["---"] * len(rows[0]))
    for verb in VERBS:
        for n in sizes:
            if not res[verb, n] or not res[verb + baseline.suffix, n]:
                continue
            mine, theirs = _cpu(res, verb, n), _cpu(res, verb + baseline.suffix, n)
            cells = [f"{mine / n * 1000:.2f} ms", f"{theirs / n * 1000:.2f} ms"]
            rows.append([f"`{verb}`", str(n), *cells, f"{mine / theirs:.2f}x"])
    return rows


def _args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__)
    p.add_argument("--sizes", default="16,64,128,256", help="host counts (16,64,128,256)")
    p.add_argument("--reps", type=int, default=3, help="timed rounds per size (3)")
    p.add_argument("--out", type=Path, help="write the markdown table here too")
    p.add_argument("--baseline", metavar="REV", help="also run this commit's verbs, side by side")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = _args(argv)
    if os.geteuid() != 0:
        print("the bench needs root (namespace lab): sudo python -m bench.scale")
        return 2
    if not shutil.which("pdsh"):
        print("pdsh is missing: apt-get install pdsh")
        return 2
    sizes = sorted(int(s) for s in args.sizes.split(","))
    started, load_before = time.monotonic(), report.load()
    report.compile_tfdeploy()
    # SIGTERM ends the bench like Ctrl-C does: through the finally blocks that stop the lab.
    signal.signal(signal.SIGTERM, signal.default_int_handler)

    def log(text: str) -> None:
        print(f"[{time.monotonic() - started:5.0f} s] {text}", file=sys.stderr, flush=True)

    res: dict[tuple[str, int], list[Sample]] = {}
    tmp = Path(tempfile.mkdtemp(prefix="tfdeploy-scale-", dir="/var/tmp"))
    baseline = Baseline.add(args.baseline, tmp) if args.baseline else None
    try:
        for n in sizes:
            for what, samples in run_size(n, args.reps, tmp, log, baseline).items():
                res[what, n] = samples
    finally:
        if baseline is not None:
            baseline.remove()
        shutil.rmtree(tmp, ignore_errors=True)
    res = defaultdict(list, res)
    elapsed = time.monotonic() - started
    text = table(res, sizes, baseline) + (
        f"\nMachine: {report.machine()}. "
        f"Load average before/after: {load_before} / {report.load()}. "
        f"Bench wall time {elapsed / 60:.1f} min; {report.BYTECODE_NOTE}; "
        f"median (min-max) of {args.reps} rounds after "
        "one untimed round (agent installed, code pushed). Controller CPU is user + sys of the "
        "`tfdeploy` process (pdsh: of pdsh and all its ssh clients); the lab's hosts share the "
        "same cores, so wall time here is bounded by the lab, not the controller.\n"
    )
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(report.header("bench.scale") + "\n" + text)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except ScaleError as exc:
        print(f"bench failed: {exc}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print("bench interrupted; labs stopped", file=sys.stderr)
        sys.exit(130)
