"""A package name no index has is said as such, and only then (issue 58): not hidden by a
find-links page that lists other projects' files (PyTorch's and JAX's `-f` pages do), not
claimed of an index that could not be asked. Real pip: an index on loopback, and the real
index through this machine's own pip configuration where it is reachable."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from deployer.envs.platform import HostPlatform
from deployer.envs.resolve import ResolveError, resolve
from deployer.envs.spec import from_lines
from tests.support.wheels import IndexServer, make_sdist, make_wheel, pip_env, write_index

pytestmark = pytest.mark.slow

X86_311 = HostPlatform.of("3.11.2", "x86_64", "2.36")
X86_313 = HostPlatform.of("3.13.1", "x86_64", "2.36")


def _links_page(tmp: Path) -> Path:
    """A find-links HTML page of other projects' files, as PyTorch's and JAX's are."""
    files = tmp / "other"
    make_wheel(files, "torchish", "1.0", tag="cp311-cp311-manylinux_2_17_x86_64")
    make_sdist(files, "jaxish", "0.4")
    page = tmp / "links.html"
    links = "".join(f'<a href="other/{p.name}">{p.name}</a>\n' for p in sorted(files.iterdir()))
    page.write_text(f"<html><body>\n{links}</body></html>\n")
    return page


def _error(spec: list[str], target: HostPlatform, tmp: Path, env: dict[str, str]) -> ResolveError:
    with pytest.raises(ResolveError) as e:
        resolve(from_lines(spec, base=tmp), target, cache=tmp / "cache", env=env)
    return e.value


def test_a_find_links_page_of_other_projects_does_not_hide_an_unknown_name(
    tmp_path: Path,
) -> None:
    dists = tmp_path / "dists"
    make_wheel(dists, "beta", "1.0")
    make_wheel(dists, "armonly", "1.0", tag="cp39-cp39-manylinux_2_17_aarch64")
    index = write_index(tmp_path / "index", dists).parent
    page = _links_page(tmp_path)
    with IndexServer(index).running() as server:
        env = pip_env(tmp_path, PIP_INDEX_URL=server.url, PIP_FIND_LINKS=page.as_uri())
        # Before: pip passed over the page's links by name ("Skipping link: ... torchish..."),
        # read as files of the project: "no wheel for CPython 3.11 ... pick a version".
        unknown = _error(["scikit-learnn"], X86_311, tmp_path, env)
        # A project the index has, with wheels for another platform only, keeps its message.
        other = _error(["armonly"], X86_311, tmp_path, env)
    assert unknown.message.startswith(
        "scikit-learnn: the package index has no package of that name"
    ), unknown.message
    assert "manylinux" not in unknown.message and "spelling" in (unknown.hint or "")
    assert other.message.startswith("armonly: no wheel for CPython 3.11, manylinux_2_36_x86_64")


def test_an_index_that_cannot_be_asked_is_not_said_to_lack_the_name(tmp_path: Path) -> None:
    """Nothing listens on the index's port: pip learns nothing of the name."""
    env = pip_env(tmp_path, PIP_INDEX_URL="http://127.0.0.1:9/simple/", PIP_RETRIES="0")
    said = _error(["six"], X86_311, tmp_path, env)
    # Before: "six: the package index has no package of that name", of a name every index has.
    assert said.message.startswith("six: pip could not ask the package index about it"), said
    assert "no package of that name" not in said.message
    assert "127.0.0.1:9" in said.message and "pip config list" in (said.hint or "")


def _real_index_reachable(tmp: Path) -> bool:
    """This machine's pip, with its own configuration, fetches a small wheel."""
    done = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(tmp), "six"],
        capture_output=True,
        env=os.environ | {"PIP_RETRIES": "0"},
    )
    return done.returncode == 0


def test_on_the_real_index_a_misspelt_name_and_a_platform_without_wheels(tmp_path: Path) -> None:
    """The issue's own case, through this machine's pip configuration (its index, extra
    indexes and find-links) plus a find-links page of other projects."""
    if not _real_index_reachable(tmp_path / "probe"):
        pytest.skip("the package index of this machine's pip configuration is not reachable")
    env = dict(os.environ) | {"PIP_FIND_LINKS": _links_page(tmp_path).as_uri()}
    unknown = _error(["scikit-learnn"], X86_311, tmp_path, env)
    assert unknown.message.startswith(
        "scikit-learnn: the package index has no package of that name"
    ), unknown.message
    assert "404" in unknown.message
    # tensorflow 2.15.0 has no CPython 3.13 wheel and no sdist at all: the platform message.
    platform = _error(["tensorflow==2.15.0"], X86_313, tmp_path, env)
    assert platform.message.startswith(
        "tensorflow==2.15.0: no wheel for CPython 3.13, manylinux_2_36_x86_64 and no source"
    ), platform.message
    assert "pick a version of tensorflow" in (platform.hint or "")
