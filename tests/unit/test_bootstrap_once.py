"""The agent's files are read, packed and hashed once per process, however many fleet workers
ask at once: functools.cache alone let each of a verb's 20 threads that asked before the first
answer compute them again (a quarter of a 64-host `status`'s CPU, issue 58's edge cost)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import threading, time
from pathlib import Path
from remote import protocol
reads = []
original = Path.read_text
def counted(self, *a, **k):
    if self.suffix == ".py":
        reads.append(self.name)
        time.sleep(0.001)  # a slow disk: the window in which other threads ask too
    return original(self, *a, **k)
Path.read_text = counted
hashed = []
real_id = protocol.agent_id
protocol.agent_id = lambda files: hashed.append(1) or real_id(files)
from deployer.hosts import bootstrap
start = threading.Barrier(20)
def ask():
    start.wait()
    bootstrap.agent_id(); bootstrap.agent_files_message()
threads = [threading.Thread(target=ask) for _ in range(20)]
[t.start() for t in threads]; [t.join() for t in threads]
print(len(reads) == len(set(reads)), len(hashed))
"""


def test_twenty_threads_asking_at_once_read_and_hash_the_agent_once() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert done.stdout.split() == ["True", "1"], done.stdout + done.stderr
