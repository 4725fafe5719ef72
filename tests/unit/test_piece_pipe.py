"""The channel buffer that keeps packets' payloads as they came (hosts/paramiko_tuning.py): it
must read, wait, time out, close and signal exactly as paramiko's own BufferedPipe does, because
paramiko's Channel drives it. And which path, tuned or stock, a paramiko version gets."""

from __future__ import annotations

import threading
import time

import pytest
from paramiko.buffered_pipe import BufferedPipe, PipeTimeout

from deployer.hosts import paramiko_tuning
from deployer.hosts.paramiko_tuning import _PiecePipe


def _both() -> list[BufferedPipe]:
    return [BufferedPipe(), _PiecePipe()]


@pytest.mark.parametrize("pipe", _both(), ids=["paramiko", "pieces"])
def test_reads_return_the_bytes_in_order_whatever_the_read_size(pipe: BufferedPipe) -> None:
    for piece in (b"abc", b"defgh", b"i"):
        pipe.feed(piece)
    assert len(pipe) == 9
    got = bytearray()
    while len(got) < 9:
        got += pipe.read(2)
    assert bytes(got) == b"abcdefghi"
    assert len(pipe) == 0 and not pipe.read_ready()


def test_a_whole_payload_is_handed_over_without_a_copy() -> None:
    pipe = _PiecePipe()
    payload = bytes(range(200)) * 10
    pipe.feed(payload)
    assert pipe.read(1 << 20) is payload


@pytest.mark.parametrize("pipe", _both(), ids=["paramiko", "pieces"])
def test_an_empty_pipe_times_out_and_a_closed_one_ends(pipe: BufferedPipe) -> None:
    started = time.monotonic()
    with pytest.raises(PipeTimeout):
        pipe.read(10, timeout=0.1)
    assert 0.09 <= time.monotonic() - started < 2
    with pytest.raises(PipeTimeout):
        pipe.read(10, timeout=0.0)
    pipe.feed(b"last")
    pipe.close()
    assert pipe.read(10) == b"last"  # what came before the close is still read
    assert pipe.read(10) == b""


@pytest.mark.parametrize("pipe", _both(), ids=["paramiko", "pieces"])
def test_a_waiting_read_wakes_when_bytes_arrive(pipe: BufferedPipe) -> None:
    feeder = threading.Timer(0.1, pipe.feed, args=(b"late",))
    feeder.start()
    try:
        assert pipe.read(10, timeout=5) == b"late"
    finally:
        feeder.join()


@pytest.mark.parametrize("pipe", _both(), ids=["paramiko", "pieces"])
def test_the_event_says_whether_a_read_would_return_at_once(pipe: BufferedPipe) -> None:
    event = threading.Event()
    pipe.set_event(event)  # what Channel.fileno() relies on
    assert not event.is_set()
    pipe.feed(b"xy")
    assert event.is_set()
    assert pipe.read(1) == b"x"
    assert event.is_set()  # a byte is left
    assert pipe.read(1) == b"y"
    assert not event.is_set()
    pipe.feed(b"z")
    assert pipe.empty() == b"z"
    assert not event.is_set()
    pipe.close()
    assert event.is_set()


@pytest.mark.parametrize(
    ("version", "path"),
    [
        ("3.3.2", "stock"),  # before the versions checked
        ("3.4.0", "tuned"),
        ("4.0.0", "tuned"),
        ("5.1.0", "tuned"),
        ("5.2.0", "stock"),  # internals nobody read yet
        ("6.0.0rc1", "stock"),
        ("garbage", "stock"),
    ],
)
def test_only_the_paramiko_versions_read_get_the_tuned_path(version: str, path: str) -> None:
    chosen, why = paramiko_tuning.choose(version, {})
    assert chosen == path
    assert version in why


def test_the_environment_forces_stock_paramiko_on_any_version() -> None:
    env = {paramiko_tuning.ENV: " Stock "}
    assert paramiko_tuning.choose("5.1.0", env) == ("stock", "TFDEPLOY_PARAMIKO=stock")
    assert paramiko_tuning.choose("5.1.0", {paramiko_tuning.ENV: ""})[0] == "tuned"
