"""A set that only adds requirements to one resolved before keeps its pins (issue 58: the "+1
requirement" `up`): pip resolves the added lines alone, against the earlier versions, and asks
the index about the new project only; added lines that need other versions, or a set that also
drops a line, are resolved whole as before.

Real pip against an index on loopback whose request log says what pip asked about."""

from __future__ import annotations

from pathlib import Path

import pytest

from deployer.envs.platform import HostPlatform
from deployer.envs.resolve import resolve
from deployer.envs.spec import from_lines
from deployer.envs.wheelhouse import Wheelhouse
from tests.support.wheels import IndexServer, make_wheel, pip_env, write_index

pytestmark = pytest.mark.slow

X86_311 = HostPlatform.of("3.11.2", "x86_64", "2.36")


class Index:
    """An index on loopback whose projects can be published to while it serves."""

    def __init__(self, tmp: Path) -> None:
        self.tmp, self.dists = tmp, tmp / "dists"
        make_wheel(self.dists, "big", "1.0")
        make_wheel(self.dists, "other", "1.0")
        make_wheel(self.dists, "tqdmish", "1.0")
        self.server = IndexServer(self.publish())

    def publish(self) -> Path:
        return write_index(self.tmp / "index", self.dists).parent

    def resolve(self, lines: list[str]) -> Wheelhouse:
        env = pip_env(self.tmp, PIP_INDEX_URL=self.server.url, PIP_NO_CACHE_DIR="1")
        spec = from_lines(lines, base=self.tmp)
        return resolve(spec, X86_311, cache=self.tmp / "cache", env=env)

    def asked(self) -> set[str]:
        """The projects whose index pages pip asked for since the last call."""
        pages = {p.split("/")[2] for p in self.server.requests if p.startswith("/simple/")}
        self.server.requests.clear()
        return pages


def _files(house: Wheelhouse) -> set[str]:
    return {w.file for w in house.wheels}


def test_an_added_requirement_keeps_the_earlier_pins_and_asks_the_index_about_itself_only(
    tmp_path: Path,
) -> None:
    index = Index(tmp_path)
    with index.server.running():
        first = index.resolve(["big", "other"])
        assert _files(first) == {"big-1.0-py3-none-any.whl", "other-1.0-py3-none-any.whl"}
        index.asked()
        make_wheel(index.dists, "big", "1.1")  # a newer release since the first resolution
        index.publish()
        added = index.resolve(["big", "other", "tqdmish"])
        # Before: the whole set resolved again, big's page read and big 1.1 taken.
        assert index.asked() == {"tqdmish"}
    assert _files(added) == _files(first) | {"tqdmish-1.0-py3-none-any.whl"}
    assert added.lines == ("big", "other", "tqdmish")
    assert added.pinned.read_text().count("--hash=sha256:") == 3


def test_an_added_requirement_that_needs_a_newer_pin_resolves_the_whole_set(
    tmp_path: Path,
) -> None:
    index = Index(tmp_path)
    with index.server.running():
        index.resolve(["big"])
        make_wheel(index.dists, "big", "1.1")
        make_wheel(index.dists, "needsnew", "1.0", requires=["big>=1.1"])
        index.publish()
        added = index.resolve(["big", "needsnew"])
    assert _files(added) == {"big-1.1-py3-none-any.whl", "needsnew-1.0-py3-none-any.whl"}


def test_a_set_that_also_drops_a_line_is_resolved_whole(tmp_path: Path) -> None:
    index = Index(tmp_path)
    with index.server.running():
        index.resolve(["big", "other"])
        index.asked()
        make_wheel(index.dists, "big", "1.1")
        index.publish()
        changed = index.resolve(["big", "tqdmish"])
        assert index.asked() == {"big", "tqdmish"}
    assert _files(changed) == {"big-1.1-py3-none-any.whl", "tqdmish-1.0-py3-none-any.whl"}


def test_a_constraints_file_is_content_beyond_its_line_so_its_set_is_resolved_whole(
    tmp_path: Path,
) -> None:
    """`-c pins.txt` reads the same before and after pins.txt changed: equal lines would not
    prove an equal set."""
    index = Index(tmp_path)
    pins = tmp_path / "pins.txt"
    pins.write_text("big==1.0\n")
    with index.server.running():
        index.resolve(["big", f"-c {pins}"])
        make_wheel(index.dists, "big", "1.1")
        index.publish()
        pins.write_text("big==1.1\n")
        index.asked()
        changed = index.resolve(["big", f"-c {pins}", "tqdmish"])
        assert "big" in index.asked()
    assert "big-1.1-py3-none-any.whl" in _files(changed)
