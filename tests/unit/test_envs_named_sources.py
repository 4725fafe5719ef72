"""Distributions a requirement names by path or URL are built into wheels or refused, never
dropped; a package name the index does not know is said in pip's words. Real pip, packages made
in the test, served from tmp_path (a folder, or an index on loopback)."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

from deployer.envs.platform import HostPlatform
from deployer.envs.resolve import ResolveError, resolve
from deployer.envs.spec import from_lines
from tests.support.wheels import IndexServer, make_sdist, make_wheel, pip_env, write_index

pytestmark = pytest.mark.slow

ARM39 = HostPlatform.of("3.9.18", "aarch64", "2.31")
X86_311 = HostPlatform.of("3.11.2", "x86_64", "2.36")


def _offline(tmp: Path, folder: Path) -> dict[str, str]:
    return pip_env(tmp, PIP_NO_INDEX="1", PIP_FIND_LINKS=str(folder))


@pytest.fixture
def dists(tmp_path: Path) -> Path:
    d = tmp_path / "dists"
    make_wheel(d, "beta", "1.0")
    make_wheel(d, "armonly", "1.0", tag="cp39-cp39-manylinux_2_17_aarch64")
    return d


@pytest.mark.parametrize("spelling", ["{path}", "file://{path}", "tiny @ file://{path}"])
def test_a_named_source_archive_is_built_into_a_wheel(
    tmp_path: Path, dists: Path, spelling: str
) -> None:
    sdist = make_sdist(tmp_path / "src", "tiny", "1.0", requires=["beta"])
    spec = from_lines([spelling.format(path=sdist)], base=tmp_path)
    wh = resolve(spec, X86_311, cache=tmp_path / "cache", env=_offline(tmp_path, dists))
    # Before: pip download saved tiny-1.0.tar.gz, the wheelhouse kept only *.whl: "0 wheels"
    # (beta alone), and the task ran without tiny.
    assert {w.file for w in wh.wheels} == {
        "tiny-1.0-py3-none-any.whl",
        "beta-1.0-py3-none-any.whl",
    }
    assert "tiny==1.0 --hash=sha256:" in wh.pinned.read_text()


def test_a_named_project_folder_is_built_into_a_wheel(tmp_path: Path, dists: Path) -> None:
    sdist = make_sdist(tmp_path / "src", "tinydir", "1.0")
    with tarfile.open(sdist) as tar:
        tar.extractall(tmp_path / "code")
    spec = from_lines(["./tinydir-1.0"], base=tmp_path / "code")
    wh = resolve(spec, X86_311, cache=tmp_path / "cache", env=_offline(tmp_path, dists))
    assert {w.file for w in wh.wheels} == {"tinydir-1.0-py3-none-any.whl"}


def test_a_named_native_source_for_another_platform_is_an_error(
    tmp_path: Path, dists: Path
) -> None:
    sdist = make_sdist(tmp_path / "src", "nativetiny", "1.0", pure=False)
    spec = from_lines([str(sdist)], base=tmp_path)
    with pytest.raises(ResolveError) as e:
        resolve(spec, ARM39, cache=tmp_path / "cache", env=_offline(tmp_path, dists))
    assert "nativetiny-1.0.tar.gz" in e.value.message
    assert "platform-specific" in e.value.message and "aarch64" in e.value.message


def test_a_name_the_index_does_not_know_is_said_in_pips_words(tmp_path: Path, dists: Path) -> None:
    index = write_index(tmp_path / "index", dists).parent
    with IndexServer(index).running() as server:
        env = pip_env(tmp_path, PIP_INDEX_URL=server.url)
        with pytest.raises(ResolveError) as e:
            resolve(
                from_lines(["tensorflow-cup"], base=tmp_path),
                X86_311,
                env=env,
                cache=tmp_path / "cache",
            )
    said = e.value.message
    assert said.startswith("tensorflow-cup: the package index has no package of that name")
    assert "(from versions: none)" in said and "404" in said and server.url in said
    assert "manylinux" not in said and "pip index versions" in (e.value.hint or "")


def test_a_package_with_wheels_for_other_platforms_only_keeps_the_platform_message(
    tmp_path: Path, dists: Path
) -> None:
    with pytest.raises(ResolveError) as e:
        resolve(
            from_lines(["armonly"], base=tmp_path),
            X86_311,
            cache=tmp_path / "cache",
            env=_offline(tmp_path, dists),
        )
    assert e.value.message.startswith("armonly: no wheel for CPython 3.11, manylinux_2_36_x86_64")
