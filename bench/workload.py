"""The code trees the scenarios deploy: many small files, and a large tree with one 1 MB file."""

from __future__ import annotations

import random
import tarfile
from pathlib import Path

SMALL_FILES = 500  # 5 MB in 500 files of 10 kB, in 10 packages
BIG_FILES = 50  # 50 MB in 50 files of 1 MB
SPAM = """\
import sys, time
now = time.time_ns
start = now()
end = start + int(float(sys.argv[1]) * 1e9)
rate = float(sys.argv[2])  # lines per second; 0: as fast as it can
write, i = sys.stdout.write, 0
while True:
    t = now()
    if t > end:
        break
    write(f"{i} {t}\\n")
    i += 1
    if rate and i % 50 == 0:
        sys.stdout.flush()
        ahead = start + i * 1e9 / rate - now()
        if ahead > 0:
            time.sleep(ahead / 1e9)
sys.stdout.flush()
print(f"DONE {i}", flush=True)
"""


def _fill(path: Path, size: int, rnd: random.Random) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(rnd.randbytes(size))  # incompressible: no tool wins by compression


def small_tree(root: Path) -> Path:
    rnd = random.Random(5)
    for i in range(SMALL_FILES):
        _fill(root / f"pkg{i // 50}" / f"mod{i}.py", 10_000, rnd)
    (root / "spam.py").write_text(SPAM)
    return root


def big_tree(root: Path) -> Path:
    rnd = random.Random(50)
    for i in range(BIG_FILES):
        _fill(root / f"data{i // 10}" / f"blob{i}.bin", 1_000_000, rnd)
    return root


def change_one(root: Path, generation: int) -> None:
    """Rewrites one 1 MB file with new content (the 'edit one file, deploy again' loop)."""
    _fill(root / "data0" / "blob0.bin", 1_000_000, random.Random(1000 + generation))


def tar_of(root: Path, out: Path) -> Path:
    with tarfile.open(out, "w") as tar:
        tar.add(root, arcname=".")
    return out


def tree_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
