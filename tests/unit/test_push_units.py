"""What a push and an environment say of sizes (issue 58): the bytes that travel, the wheels
included, in human units (`398 MB`, not `398123456 bytes`), in the progress and the summaries."""

from __future__ import annotations

import time
from pathlib import Path

from deployer.push.deliver import push_summary
from deployer.push.fanout import Spread
from deployer.push.sync import ByteMeter, CodeFile, Manifest, PushResult
from deployer.up.environment import PlannedEnv
from deployer.watch.progress import PlainProgress, Progress, sent_progress


def _manifest() -> Manifest:
    code = (CodeFile("mwms.py", "a" * 64, 0o644, 41_000),)
    wheels = (CodeFile("/cache/w/tf.whl", "b" * 64, 0o644, 398_000_000),)
    return Manifest(root=Path("/code"), files=code, extras=wheels)


def test_the_sending_note_weighs_the_wheels_too() -> None:
    # Before: "the code and wheels: 41 kB" while 398 MB went out.
    assert _manifest().sending_note() == (
        "the code: 41 kB, the wheels and image layers: 398 MB; only what a host lacks travels"
    )
    assert Manifest(root=Path("/code"), files=()).sending_note() == (
        "the code: 0 B; only what a host lacks travels"
    )


def test_the_summaries_say_human_units() -> None:
    manifest = _manifest()
    star = push_summary({"h1": PushResult(1, 2, 398_041_000)}, manifest, "r1")
    assert star == ["pushed 1 file to 1 host: 398 MB sent (2 files) (run r1)"], star
    spread = Spread(seed="h1", uplink_bytes=398_041_000, copied={"h2": 398_041_000})
    fanned = push_summary({"h1": PushResult(1, 0, 0), "h2": PushResult(1, 0, 0)}, manifest, "r2")
    assert fanned[-1].endswith("0 bytes sent, every file was already there (run r2)")
    fanned = push_summary(
        {"h1": PushResult(1, 0, 0), "h2": PushResult(1, 0, 0)}, manifest, "r2", spread=spread
    )
    assert fanned == [
        "fan-out: 398 MB sent to h1, relayed host to host to 1 host",
        "pushed 1 file to 2 hosts: 398 MB sent from here (398 MB to the fan-out's seed) (run r2)",
    ], fanned


def test_a_planned_environment_says_its_size_in_human_units() -> None:
    line = PlannedEnv("h1", "requirements.txt", "ab" * 32, "CPython 3.11", 38, 380_418_874).line()
    assert line.endswith(": abababababab, CPython 3.11, 38 wheels, 380 MB, resolved here"), line


def test_the_progress_of_a_push_counts_what_the_meter_was_told() -> None:
    meter = ByteMeter()
    meter.expect("h1", 398_041_000)  # the fan-out's seed: the one stream from here
    meter.add("h1", 120_000_000)
    said: list[str] = []
    plain = PlainProgress(said.append, every=0.0)
    start = time.monotonic() - 10
    base = Progress("sending the code to 2 hosts", started=start, note=_manifest().sending_note())
    plain.show(base)
    plain.show(sent_progress(base, meter))
    assert (
        said[1]
        == "the code: 41 kB, the wheels and image layers: 398 MB; only what a host lacks travels"
    )
    assert said[2].startswith("still sending the code to 2 hosts (10 s): 120 MB of 398 MB, "), said
