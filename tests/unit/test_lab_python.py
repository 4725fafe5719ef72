"""`python -m tests.lab up` and the interpreter it writes for the practice hosts (visible.py):
one the hosts cannot see (under their private /root or /tmp, or a link into them) is replaced by
one they can, saying so, or refused, saying how to make one."""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.lab import LabError, visible


@pytest.fixture
def outside() -> Iterator[Path]:
    """A folder the hosts see (/var/tmp is shared with them; pytest's tmp_path is under /tmp)."""
    with tempfile.TemporaryDirectory(prefix="tfd-visible-", dir="/var/tmp") as d:
        yield Path(d)


def test_an_interpreter_the_hosts_see_is_kept() -> None:
    system = "/usr/bin/python3"  # Debian's, as scripts/install.sh makes its venvs from
    if not Path(system).exists():
        pytest.skip(f"no {system} here")
    assert visible.hidden_because(system) is None
    assert visible.choose(system, isolated=True) == visible.Choice(system)


def test_a_link_through_tmp_is_hidden_even_where_its_last_target_is_not(
    tmp_path: Path, outside: Path
) -> None:
    # A venv's bin/python made from an interpreter under /tmp (or pyenv's under /root): the
    # file is found here, but on a host the link dangles at its hop through the private folder.
    through_tmp = tmp_path / "python3"
    through_tmp.symlink_to(sys.executable)
    python = outside / "python"
    python.symlink_to(through_tmp)
    why = visible.hidden_because(str(python))
    assert why == f"{python} is {through_tmp}, under /tmp", why
    assert visible.hidden_because(str(through_tmp)) == f"{through_tmp} is under /tmp"


def test_a_hidden_interpreter_is_replaced_saying_so(tmp_path: Path, outside: Path) -> None:
    hidden = tmp_path / "python3"
    hidden.symlink_to(sys.executable)
    good = outside / "python"
    good.symlink_to(sys.executable)
    if visible.hidden_because(str(good)) is not None:
        pytest.skip(f"this interpreter is hidden from lab hosts itself: {sys.executable}")
    choice = visible.choose(str(hidden), isolated=True, fallbacks=(str(good),))
    assert choice.python == str(good)
    assert choice.note is not None
    assert f"cannot see {hidden}" in choice.note and f"uses {good} instead" in choice.note


def test_with_no_fallback_it_refuses_saying_how_to_make_one(tmp_path: Path) -> None:
    hidden = tmp_path / "python3"
    hidden.symlink_to(sys.executable)
    with pytest.raises(LabError) as info:
        visible.choose(str(hidden), isolated=True, fallbacks=())
    assert f"cannot run {hidden}" in str(info.value)
    assert "/usr/bin/python3 -m venv" in str(info.value)
    # The loopback lab's hosts share every file: nothing to replace there.
    assert visible.choose(str(hidden), isolated=False).python == str(hidden)
