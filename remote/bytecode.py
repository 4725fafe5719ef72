"""A new environment starts with bytecode its host already compiled for the same modules.

Environments are built without compiling bytecode (installers.py says why): a task compiles what
it imports at its first step, into the venv's `__pycache__`. A second environment that differs
from the first by one package (a requirement added) would then compile TensorFlow's imports all
over again at its first step: tens of seconds of CPU per host for modules it already has.

uv hard-links every environment's files from the host's cache, so a module of the new
environment that comes from the same wheel is the same file (inode) as in the old one. Python
accepts a `.pyc` whose header matches its source's mtime and size, and fixes the code's file name
to the module's own path when it loads it, so one `.pyc` serves every venv that holds the module.

Which `.pyc` is never the old venv's own: a file in a venv is its tasks' to write, and a task
that wrote a `.pyc` of its choosing there (issue 58: one that printed POISONED) must not reach
another venv, where it would run as that venv's module. The old venv only says which modules its
tasks import (its `.pyc` names); their bytecode comes from this host's bytecode store
(WORKDIR/hosts/<host>/bytecode/<cache tag>/), which only this module writes: each entry compiled
here, by the new venv's own interpreter (`py_compile`, a process of its own), from the module's
source file, and named by that source's identity (device, inode, size, mtime) and by the sha256
of the entry's own bytes. An entry is linked into a venv only while its bytes still hash to its
name: a task that rewrites its venv's linked `.pyc` in place changes the store's file too, and
the next seeding finds it changed, drops it and compiles the module again. The store is
filled off the critical path where it can be (fill: while the old venv's task trains, so the
next venv's `up` does not wait for it); seeding compiles only what a fill did not. Compiled once
per module and host, an entry then serves every later venv (hard links, no copies). Python
replaces a `.pyc` by writing a new file and renaming it, never in place, so a venv's own
recompile leaves the store as it is.

A task runs as the same account as the agent and could write the store itself, or another venv:
that is the host account's owner at work, which no file check stops (docs/security.md). What the
store stops is the accident and the half-measure: a task's file carried into a venv that never
ran that task.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Iterator, Tuple

PYCACHE = "__pycache__"
STORE = "bytecode"
FILL_LOCK = ".fill.lock"  # held by the one fill_main of this store that runs
MAX_WORKERS = 8  # compiling processes at once, at most one per core
PER_WORKER = 64  # modules below which one more process is not worth its start
COMPILE_TIMEOUT_S = 900.0
STALE_S = 2 * COMPILE_TIMEOUT_S  # a temporary file older than any compile: a killed one's
# Run by the venv's own python (-I -S: nothing of the venv or the environment is imported):
# [source, destination, optimize] per line of stdin, all read first (so that every process is
# fed at once and they compile side by side); each destination written (atomically, by
# py_compile) or left absent.
_COMPILE = (
    "import json, py_compile, sys\n"
    "for line in sys.stdin.read().splitlines():\n"
    "    src, dest, opt = json.loads(line)\n"
    "    try:\n"
    "        py_compile.compile(src, cfile=dest, doraise=True, optimize=opt,\n"
    "            invalidation_mode=py_compile.PycInvalidationMode.TIMESTAMP)\n"
    "    except Exception:\n"
    "        pass\n"
)

Wanted = Tuple[Path, Path, int, str]  # (our module's source, its .pyc in our venv, opt, key)


def store_dir(workdir: Path, host_id: str) -> Path:
    """This host's store, WORKDIR/hosts/<host>/bytecode: per host like the uv cache whose files
    it compiles (venvs.uv_cache), and, like it, only a speed-up (prune may empty it)."""
    return workdir / "hosts" / host_id / STORE


def seed(venv: Path, version: str, siblings: list[Path], store: Path) -> int:
    """Links into `venv` the store's `.pyc` of every module that one of `siblings` (built
    environments on this host) has compiled and whose source is the same file in `venv`,
    compiling into the store first what it lacks; returns how many were linked. `version`: the
    venv's Python ("3.11.2"), whose cache tag the files carry."""
    ours = site_packages(venv, version)
    if ours is None:
        return 0
    tag = "cpython-" + "".join(version.split(".")[:2])
    wanted: dict[Path, Wanted] = {}
    for other in siblings:
        theirs = site_packages(other, version)
        if theirs is None:
            continue
        for pyc, rel in _compiled(theirs, tag):
            found = _wanted(pyc.name, rel, theirs, ours)
            if found is not None:
                wanted.setdefault(found[1], found)
    if not wanted:
        return 0
    shelf = store / tag
    try:
        shelf.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError:
        return 0
    entries = _verified(shelf, _entries(shelf), {w[3] for w in wanted.values()})
    missing = [w for w in wanted.values() if w[3] not in entries]
    if missing:
        entries.update(_compile(venv / "bin" / "python", shelf, missing))
    return sum(_link(shelf, entries, w) for w in wanted.values())


def fill(venv: Path, version: str, store: Path, parent: int | None = None) -> int:
    """Compiles into the store every module whose `.pyc` the venv's own tasks wrote (their
    imports) and the store lacks, in this process (the venv's python); returns how many
    entries it made. Stops early once `parent` is no longer this process's parent.

    Run while a task of `venv` trains (supervisor.py starts it, at the lowest priority, once the
    task reported its first step): the next environment that adds a requirement to this one
    then finds its bytecode compiled and only links it, instead of compiling TensorFlow's
    imports while its `up` waits (3,300 modules, 8 s of CPU). Reads only the `.pyc` names, as
    seed() does; the bytes come from the module's source, compiled here."""
    import py_compile  # only a fill pays for it

    ours = site_packages(venv, version)
    if ours is None:
        return 0
    tag = "cpython-" + "".join(version.split(".")[:2])
    shelf = store / tag
    try:
        shelf.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError:
        return 0
    held = _entries(shelf)
    missing: dict[str, Wanted] = {}
    for pyc, rel in _compiled(ours, tag):
        found = _module(pyc.name, rel, ours)
        if found is not None and found[3] not in held:
            missing.setdefault(found[3], found)
    token, made = os.urandom(4).hex(), 0
    mode = py_compile.PycInvalidationMode.TIMESTAMP
    for i, (source, _, opt, key) in enumerate(missing.values()):
        if parent is not None and os.getppid() != parent:
            break  # the supervisor is gone: so is the run this fill served
        temp = shelf / f".{token}-{i}.tmp"
        try:
            py_compile.compile(
                str(source), cfile=str(temp), doraise=True, optimize=opt, invalidation_mode=mode
            )
        except Exception:
            with contextlib.suppress(OSError):
                os.unlink(str(temp))
            continue
        made += _shelve(source, key, temp) is not None
    return made


def fill_main(argv: list[str]) -> int:
    """`VENV VERSION STORE PARENT`, in a process of its own: at the lowest priority (SCHED_IDLE,
    else nice 19), and one per store at a time (a second task of the same venv on this host
    finds the lock taken)."""
    venv, version, store, parent = Path(argv[0]), argv[1], Path(argv[2]), int(argv[3])
    try:  # Linux's idle class: CPU only when no task of the run wants it
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        with contextlib.suppress(OSError):
            os.nice(19)
    try:
        store.mkdir(mode=0o700, parents=True, exist_ok=True)
        lock = os.open(str(store / FILL_LOCK), os.O_WRONLY | os.O_CREAT, 0o600)
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return 0
    fill(venv, version, store, parent)
    return 0


def fill_argv(venv: Path, version: str, store: Path) -> list[str]:
    """The command that runs fill_main in the venv's own python (the cache tag and magic
    number its imports read), from this file's folder, for this process as its parent."""
    here = os.path.dirname(os.path.abspath(__file__))
    code = (
        f"import sys; sys.path.insert(0, {here!r}); import bytecode; "
        "sys.exit(bytecode.fill_main(sys.argv[1:]))"
    )
    python = str(venv / "bin" / "python")
    return [python, "-I", "-S", "-c", code, str(venv), version, str(store), str(os.getpid())]


def site_packages(venv: Path, version: str) -> Path | None:
    minor = ".".join(version.split(".")[:2])
    path = venv / "lib" / f"python{minor}" / "site-packages"
    return path if path.is_dir() else None


def _compiled(root: Path, tag: str) -> Iterator[tuple[Path, Path]]:
    """Every `.pyc` of cache tag `tag` under `root`, with its module's directory relative to it:
    only their names are read (which modules the tasks import), never their bytes."""
    for folder, dirs, files in os.walk(str(root)):
        if os.path.basename(folder) != PYCACHE:
            continue
        dirs[:] = []
        rel = Path(folder).parent.relative_to(root)
        for name in files:
            if name.endswith(".pyc") and f".{tag}." in name:
                yield Path(folder) / name, rel


def _wanted(name: str, rel: Path, theirs: Path, ours: Path) -> Wanted | None:
    """The module of `.pyc` file `name` when its source is the same file in both venvs (from
    the same wheel, linked from the uv cache) and `ours` has no `.pyc` of it yet; None else."""
    found = _module(name, rel, ours)
    if found is None or os.path.lexists(str(found[1])):
        return None
    try:
        mine, old = os.stat(str(found[0])), os.stat(str(theirs / rel / found[0].name))
    except OSError:
        return None
    return found if (mine.st_ino, mine.st_dev) == (old.st_ino, old.st_dev) else None


def _module(name: str, rel: Path, root: Path) -> Wanted | None:
    """The module under `root` that `.pyc` file `name` (in `rel`'s `__pycache__`) is of: its
    source, that `.pyc`'s path, the optimization level and the source's key; None when the
    name is no `.pyc` name Python writes or the source is not there."""
    stem, _, rest = name.partition(".")
    parts = rest.split(".")  # cpython-311.pyc, cpython-311.opt-1.pyc
    opt = {2: 0, 3: {"opt-1": 1, "opt-2": 2}.get(parts[1], -1)}.get(len(parts), -1)
    if opt < 0:
        return None
    source = root / rel / f"{stem}.py"
    try:
        mine = os.stat(str(source))
    except OSError:
        return None
    return source, root / rel / PYCACHE / name, opt, _key(mine, opt)


def _key(st: os.stat_result, opt: int) -> str:
    """A source file's identity as a store entry's name begins: the same file, unchanged."""
    return f"{st.st_dev}-{st.st_ino}-{st.st_size}-{st.st_mtime_ns}-o{opt}"


def _entries(shelf: Path) -> dict[str, str]:
    """{key: file name} of the store's entries (`<key>.<sha256>.pyc`)."""
    found = {}
    try:
        names = os.listdir(str(shelf))
    except OSError:
        return {}
    for name in names:
        key, _, rest = name.partition(".")
        if rest.endswith(".pyc") and len(rest) == 64 + 4:
            found[key] = name
        elif not key:  # `.<token>-<i>.tmp*`: a compile's, left by a builder killed mid-way
            _drop_stale(shelf / name)
    return found


def _drop_stale(path: Path) -> None:
    """Removes a compile's temporary file once no build can still be writing it."""
    try:
        if time.time() - os.stat(str(path)).st_mtime > STALE_S:
            os.unlink(str(path))
    except OSError:
        pass


def _compile(python: Path, shelf: Path, missing: list[Wanted]) -> dict[str, str]:
    """Each missing module compiled into the store by the venv's python, in a few processes
    at once; {key: file name} of the entries made. A module that does not compile (a syntax of
    a newer Python, a test fixture) gets none: it is compiled at import, as without a seed."""
    token = os.urandom(4).hex()
    temps = [shelf / f".{token}-{i}.tmp" for i in range(len(missing))]
    jobs = [[src, str(temp), opt] for (src, _, opt, _), temp in zip(missing, temps)]
    workers = max(1, min(MAX_WORKERS, os.cpu_count() or 1, len(jobs) // PER_WORKER))
    procs = []
    for chunk in (jobs[i::workers] for i in range(workers)):
        lines = "".join(json.dumps([str(a), b, c]) + "\n" for a, b, c in chunk)
        try:
            proc = subprocess.Popen(
                [str(python), "-I", "-S", "-c", _COMPILE],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env={k: v for k, v in os.environ.items() if not k.startswith("PYTHON")},
            )
        except OSError:
            continue
        procs.append(proc)
        feed = proc.stdin  # a pipe (stdin=PIPE): the process reads it all, then compiles
        try:
            if feed is not None:
                with feed:
                    feed.write(lines.encode())
        except OSError:
            pass  # it died at its start: it compiles nothing, and is waited for below
    deadline = time.monotonic() + COMPILE_TIMEOUT_S
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    made = {}
    for (source, _, _, key), temp in zip(missing, temps):
        name = _shelve(source, key, temp)
        if name is not None:
            made[key] = name
    return made


def _shelve(source: Path, key: str, temp: Path) -> str | None:
    """The compiled file renamed to its entry's name, when its source did not change while it
    was compiled; None (and nothing left) else."""
    try:
        fresh = _key(os.stat(str(source)), int(key.rsplit("-o", 1)[1])) == key
        if fresh:
            name = f"{key}.{_sha256(temp)}.pyc"
            os.replace(str(temp), str(temp.with_name(name)))
            return name
    except OSError:
        pass
    with contextlib.suppress(OSError):
        os.unlink(str(temp))
    return None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(str(path), "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _verified(shelf: Path, entries: dict[str, str], keys: set[str]) -> dict[str, str]:
    """The entries of `keys` whose bytes still hash to their name. One that does not (a task
    rewrote a venv's link of it in place, which is the store's file too) is dropped, so it is
    compiled again now."""
    good = {}
    for key in keys & set(entries):
        name = entries[key]
        try:
            if _sha256(shelf / name) == name.split(".")[1]:
                good[key] = name
            else:
                os.unlink(str(shelf / name))
        except OSError:
            pass
    return good


def _link(shelf: Path, entries: dict[str, str], wanted: Wanted) -> int:
    """1 when the store's entry of the module was linked into our venv; 0 when there is none
    or it cannot be linked."""
    _, target, _, key = wanted
    name = entries.get(key)
    if name is None:
        return 0
    try:
        target.parent.mkdir(mode=0o755, exist_ok=True)
        os.link(str(shelf / name), str(target))
    except OSError:  # gone meanwhile, another file system, no room: compiled at import instead
        return 0
    return 1
