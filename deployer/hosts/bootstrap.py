"""What a host runs first: the bootstrap script that installs this agent version if the host
lacks it and answers the hello (docs/PROTOCOL.md "Calling the agent"), and the agent's files
and content id it installs.
"""

from __future__ import annotations

import functools
import json
import threading
import zlib
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import TypeVar

from remote import protocol

T = TypeVar("T")

REMOTE_DIR = Path(__file__).resolve().parents[2] / "remote"
TASK_SIDE_DIR = REMOTE_DIR / "taskside"

# Runs on the host with only the interpreter: makes sure this agent version is installed (when it
# is not, the bootstrap answers `needs_files` and the files arrive as the next stdin line: 160 KB
# that a host which has them never gets again), answers the hello request in the same process,
# then keeps serving requests on the same channel (`agent.serve`) until stdin closes: every later
# call of the connection costs one round trip instead of an sshd session and a Python start
# (~50 ms of host CPU). Fed all at once with EOF, it answers the hello alone and exits
# (one-shot mode).
# Hosts sharing a home (NFS) may install at once: each writes its own temporary names, and a
# rename puts identical content in place.
# The version gate comes first and uses nothing newer than Python 2 syntax, so an interpreter
# too old for the agent says so instead of failing on some later line. The look-only reply
# speaks protocol.PROTOCOL_VERSION, as the agent does.
MIN_HOST_PYTHON = (3, 8)
TOO_OLD_EXIT = 79  # the bootstrap's exit status when the host's Python is older than that
_VERSION_GATE = f"""
import sys
if sys.version_info < {MIN_HOST_PYTHON!r}:
    sys.stderr.write(".".join(str(n) for n in sys.version_info[:3]))
    sys.exit({TOO_OLD_EXIT})
"""
BOOTSTRAP = (
    _VERSION_GATE
    + f"V = {protocol.PROTOCOL_VERSION!r}\n"
    + f"NEEDS = {protocol.BOOTSTRAP_NEEDS_FILES!r}\n"
    + """
import hashlib, json, os, shutil, zlib
if not os.environ.get("HOME", "x"):
    del os.environ["HOME"]  # empty: ~ must come from the passwd entry, not become "/"
d = json.loads(sys.stdin.buffer.readline())
w = os.path.expanduser(d["workdir"])
if d.get("look_only") and not os.path.isdir(w):
    sys.stdout.write(json.dumps({"v": V, "ok": True, "absent": True, "workdir": w}) + "\\n")
    sys.exit(0)
home = os.path.join(w, "agent", d["agent_id"])
def intact():
    # The directory is named by its files' content hash (protocol.agent_id): a corrupted or
    # half-written file is installed again, never run. Integrity, not trust: the host owns it.
    try:
        names = sorted(n for n in os.listdir(home) if n.endswith(".py") and n != "__init__.py")
        h = hashlib.sha256()
        for n in names:
            with open(os.path.join(home, n), "rb") as f:
                h.update(n.encode() + b"\\0" + f.read() + b"\\0")
    except OSError:
        return False
    return os.path.isfile(os.path.join(home, ".complete")) and h.hexdigest()[:12] == d["agent_id"]
def install():
    files = d.get("files")
    if files is None:
        sys.stdout.write(json.dumps({"v": V, "ok": True, NEEDS: True, "workdir": w}) + "\\n")
        sys.stdout.flush()
        size = int(sys.stdin.buffer.readline())
        files = json.loads(zlib.decompress(sys.stdin.buffer.read(size)))
    os.makedirs(home, 0o700, exist_ok=True)
    for name in os.listdir(home):  # a stray module would change the hash at every hello
        if name.endswith(".py") and name not in files:
            try:
                os.unlink(os.path.join(home, name))
            except OSError:
                pass  # gone already: another host of a shared home cleaned it
    # What was compiled from a damaged file may pass Python's mtime-and-size check.
    shutil.rmtree(os.path.join(home, "__pycache__"), ignore_errors=True)
    for name, text in files.items():
        tmp = os.path.join(home, "%s.part-%s-%d" % (name, os.uname()[1], os.getpid()))
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, os.path.join(home, name))
    open(os.path.join(home, ".complete"), "w").close()
if not intact():
    install()
sys.path.insert(0, home)
import agent
sys.exit(agent.serve(json.dumps(d["request"]).encode()))
"""
)


# functools.cache lets every thread that calls before the first call returns compute the value
# again: the fleet's 20 workers each read and hashed the agent's files at a verb's start
# (a quarter of a 64-host `status`'s CPU). One lock: computed once per process.
_ONCE = threading.RLock()  # re-entered: agent_id reads agent_files


def _once(fn: Callable[[], T]) -> Callable[[], T]:
    cached = cache(fn)

    def locked() -> T:
        with _ONCE:
            return cached()

    return functools.wraps(fn)(locked)


@_once
def agent_files() -> dict[str, str]:
    """The remote side's source files, pushed to every host (the package marker is not needed),
    and the task-side helpers (remote/taskside/: modules a task imports, never the agent; the
    agent copies them into each task's directory), installed beside them."""
    return {
        p.name: p.read_text(encoding="utf-8")
        for p in [*sorted(REMOTE_DIR.glob("*.py")), *sorted(TASK_SIDE_DIR.glob("*.py"))]
        if protocol.is_pushed(p.name)
    }


@_once
def agent_files_message() -> bytes:
    """The files as the bootstrap reads them, encoded once per process: the size of what
    follows on a line, then the JSON compressed (a third of its size: a first deploy over a
    laptop's uplink sends it to every host). Every Python that can pip-install has zlib."""
    packed = zlib.compress(json.dumps(agent_files()).encode(), 6)
    return b"%d\n" % len(packed) + packed


@_once
def agent_id() -> str:
    """Content hash of the agent: two tfdeploy versions never overwrite each other's agent."""
    return protocol.agent_id((name, text.encode()) for name, text in agent_files().items())
