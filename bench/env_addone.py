"""`python -m bench.env_addone [--sets small,sklearn,tf] [--reps 3] [--tf-reps 1] [--out F]`

One requirement added to a set already resolved: what the controller's resolution of the new
set costs, side by side, the way before issue 58 and the way now.

- before: the new set resolved into a cache that holds none of the old set's wheels (what every
  resolution did: `pip download` of the whole set, each wheelhouse its own copy);
- now: into the cache that resolved the old set: the added line is resolved alone, against the
  old set's versions and wheels (deployer/envs/extend.py), so only the new wheels are fetched,
  and the new entry's wheels are hard links to the store.

Both with this machine's Python and `deployer.envs.resolve` itself, against PyPI alone (no
extra index, find-links or constraints of this machine's pip configuration: its local mirror
would hide the downloads; its certificate setting is kept), pip's own cache off (`--no-cache-dir`,
as docs/bench/env_tools.md), and with pip's cache warm from the old set's resolution (a user's
default). Disk: the bytes of the cache's distinct files after both entries (hard links counted
once). Arms alternate within each repetition; medians, then (min-max). Needs the network.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from bench import report
from bench.tools import make_tmp
from deployer.core.text import human_size
from deployer.envs.platform import HostPlatform
from deployer.envs.resolve import resolve
from deployer.envs.spec import from_lines

SETS = {
    "small": ["six"],
    "sklearn": ["scikit-learn"],
    "tf": ["tensorflow-cpu==2.21.0", "scikit-learn"],
}
ADDED = "tqdm"
TARGET = HostPlatform.of("3.11.2", "x86_64", "2.36")


def _env(tmp: Path, pip_cache: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env |= {"PIP_CONFIG_FILE": os.devnull, "PIP_DEFAULT_TIMEOUT": "180"}
    if os.environ.get("PIP_CERT"):
        env["PIP_CERT"] = os.environ["PIP_CERT"]
    if pip_cache:
        return env | {"PIP_CACHE_DIR": str(tmp / "pip-cache")}
    return env | {"PIP_NO_CACHE_DIR": "1"}


def _disk(root: Path) -> int:
    seen: dict[tuple[int, int], int] = {}
    for top, _, files in os.walk(root):
        for name in files:
            st = os.lstat(os.path.join(top, name))
            seen[(st.st_dev, st.st_ino)] = st.st_size
    return sum(seen.values())


def _arm(base: list[str], tmp: Path, pip_cache: bool, seeded: bool) -> tuple[float, int, int]:
    """Seconds for the +1 resolution, its wheels, and the cache's disk after both entries."""
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    env = _env(tmp, pip_cache)
    old_cache = tmp / "cache"
    resolve(from_lines(base, base=tmp), TARGET, cache=old_cache, env=env)
    new_cache = old_cache if seeded else tmp / "other-cache"
    t0 = time.monotonic()
    house = resolve(from_lines([*base, ADDED], base=tmp), TARGET, cache=new_cache, env=env)
    took = time.monotonic() - t0
    disk = _disk(old_cache) + (0 if seeded else _disk(new_cache))
    return took, len(house.wheels), disk


def _cell(values: list[float], fmt: Callable[[float], str]) -> str:
    mid = statistics.median(values)
    return f"{fmt(mid)} ({fmt(min(values))}-{fmt(max(values))})"


def run_set(name: str, reps: int, root: Path) -> None:
    base = SETS[name]
    print(f"\n### `{' '.join(base)}` + `{ADDED}`\n")
    print("| pip cache | way | seconds, median (min-max) | ÷ before | wheels | cache on disk |")
    print("|---|---|---|---|---|---|")
    for pip_cache in (False, True):
        got: dict[bool, list[tuple[float, int, int]]] = {False: [], True: []}
        for _ in range(reps):
            for seeded in (False, True):
                got[seeded].append(_arm(base, root / name, pip_cache, seeded))
        before = statistics.median(t for t, _, _ in got[False])
        for seeded in (False, True):
            times = [t for t, _, _ in got[seeded]]
            way = (
                "now: the added line against the old pins"
                if seeded
                else "before: the whole set again"
            )
            cell = _cell(times, lambda x: f"{x:.2f}")
            print(
                f"| {'warm' if pip_cache else 'off'} | {way} | {cell} "
                f"| {statistics.median(times) / before:.2f}x | {got[seeded][0][1]} "
                f"| {human_size(got[seeded][0][2])} |"
            )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.env_addone", description=__doc__)
    p.add_argument("--sets", default="small,sklearn")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--tf-reps", type=int, default=1, help="repetitions of the tf set")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    root = make_tmp()
    try:
        with report.tee_to(args.out, "bench.env_addone"):
            print(
                f"The controller's resolution of a set with `{ADDED}` added, for "
                f"{TARGET.describe()}; {report.machine()}; load average {report.load()}."
            )
            for name in args.sets.split(","):
                run_set(name, args.tf_reps if name == "tf" else args.reps, root)
            print(
                "\n`before` resolves the new set into a cache without the old set's wheels (each "
                "wheelhouse its own copy); `now` into the same cache, the added line resolved "
                "alone against the old set's pins. `cache on disk`: distinct bytes after both "
                "entries."
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
