"""The fan-out seed named its next host mid-stream (remote/peers.py `seed`, `onward`): real agent
processes, a real relay listener on loopback, real bytes. The next host publishes a content only
if its sha256 matches, so a content in its store proves the replay was byte for byte."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from pathlib import Path
from typing import IO, Any

import pytest

from tests.support.agent import AGENT, PYTHON, call, host_dir, ok, wait_for
from tests.support.helpers import free_port

pytestmark = pytest.mark.timeout(60)

SECRET = "ab" * 32


def contents(*sizes: int) -> list[bytes]:
    return [os.urandom(size) for size in sizes]


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def start_seed(workdir: Path, blobs: list[bytes], **params: Any) -> subprocess.Popen[bytes]:
    request = {
        "v": 1,
        "op": "peers",
        "workdir": str(workdir),
        "action": "seed",
        "run_id": "r1",
        "stream": "s1",
        "secret": SECRET,
        "blobs": [[digest(b), len(b)] for b in blobs],
        "seconds": 30,
        **params,
    }
    seed = subprocess.Popen([PYTHON, str(AGENT)], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert seed.stdin is not None
    seed.stdin.write(json.dumps(request).encode() + b"\n")
    return seed


def send(stdin: IO[bytes] | None, data: bytes) -> None:
    assert stdin is not None
    stdin.write(data)
    stdin.flush()


def reply_of(seed: subprocess.Popen[bytes]) -> dict[str, Any]:
    assert seed.stdout is not None
    out = seed.stdout.read()  # until the agent exits (the test's timeout bounds it)
    seed.wait(timeout=30)
    reply: dict[str, Any] = json.loads(out)
    return reply


def relay(workdir: Path) -> int:
    """A next host's listener on loopback, the end of the chain."""
    port = free_port()
    ok(
        call(
            workdir,
            "peers",
            action="relay",
            run_id="r1",
            address="127.0.0.1",
            port=port,
            secret=SECRET,
            next=None,
            seconds=30,
        )
    )
    return port


def stored(workdir: Path, data: bytes) -> bool:
    path = workdir / "store" / digest(data)
    return path.is_file() and path.read_bytes() == data


def litter(workdir: Path) -> list[str]:
    """Half-written contents and notices nobody will read."""
    found = [p.name for p in (workdir / "store").glob(".*.part")]
    peers = workdir / "hosts"
    return found + [p.name for p in peers.glob("*/peers/*.onward")]


def test_a_next_host_named_mid_content_gets_every_byte_from_the_start(tmp_path: Path) -> None:
    seed_dir, next_dir = tmp_path / "seed", tmp_path / "next"
    first, second = contents(5 << 20, 6 << 20)  # large enough to be hashed beside, given cores
    port = relay(next_dir)
    seed = start_seed(seed_dir, [first, second])
    send(seed.stdin, first + second[: 1 << 20])
    # The seed holds the first content and half of the second, in its part file.
    wait_for(lambda: stored(seed_dir, first), timeout=10)
    part = wait_for(lambda: list((seed_dir / "store").glob(f".{digest(second)}.*.part")))
    wait_for(lambda: part[0].stat().st_size == 1 << 20, timeout=10)
    ok(call(seed_dir, "peers", action="onward", run_id="r1", stream="s1", next=["127.0.0.1", port]))
    send(seed.stdin, second[1 << 20 :])
    assert seed.stdin is not None
    seed.stdin.close()
    reply = ok(reply_of(seed))
    assert [entry["error"] for entry in reply["chain"]] == ["", ""], reply
    assert stored(next_dir, first) and stored(next_dir, second)
    assert stored(seed_dir, first) and stored(seed_dir, second)
    assert litter(seed_dir) == [] and litter(next_dir) == []
    assert ok(call(next_dir, "peers", action="close", run_id="r1"))["closed"] is True


def test_a_seed_told_there_is_no_chain_only_stores(tmp_path: Path) -> None:
    seed_dir = tmp_path / "seed"
    [only] = contents(1 << 20)
    seed = start_seed(seed_dir, [only])
    send(seed.stdin, only)
    wait_for(lambda: stored(seed_dir, only), timeout=10)
    time.sleep(0.1)  # it waits to be told where to forward
    assert seed.poll() is None
    ok(call(seed_dir, "peers", action="onward", run_id="r1", stream="s1", next=None))
    assert seed.stdin is not None
    seed.stdin.close()
    reply = ok(reply_of(seed))
    assert [entry["error"] for entry in reply["chain"]] == [""]
    assert litter(seed_dir) == []


def test_a_seed_whose_stream_breaks_publishes_nothing_of_it(tmp_path: Path) -> None:
    seed_dir = tmp_path / "seed"
    [whole] = contents(6 << 20)
    seed = start_seed(seed_dir, [whole])
    send(seed.stdin, whole[: 1 << 20])
    assert seed.stdin is not None
    seed.stdin.close()  # the controller went away (Ctrl-C, a dropped connection)
    reply = reply_of(seed)
    assert reply["ok"] is False and "arrived damaged or short" in reply["error"], reply
    assert not stored(seed_dir, whole)
    assert litter(seed_dir) == []


def test_a_notice_for_a_seed_that_ended_is_removed_by_close(tmp_path: Path) -> None:
    seed_dir = tmp_path / "seed"
    ok(call(seed_dir, "peers", action="onward", run_id="r1", stream="s1", next=None))
    assert [p.name for p in host_dir(seed_dir).glob("peers/*")] == ["r1.s1.onward"]
    assert ok(call(seed_dir, "peers", action="close", run_id="r1"))["closed"] is False
    assert litter(seed_dir) == []
