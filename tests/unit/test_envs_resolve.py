"""The controller resolving a job's environment with real pip, from packages made in the test and
served from tmp_path (a folder, or an index on loopback): no test reaches a real index.

Each test runs pip a few times (~1 s each), so the module is marked slow.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from deployer.envs.platform import HostPlatform
from deployer.envs.resolve import ResolveError, resolve
from deployer.envs.spec import RequirementsError, env_hash, from_file, from_lines
from tests.support.wheels import IndexServer, make_sdist, make_wheel, pip_env, sha256, write_index

pytestmark = pytest.mark.slow

ARM39 = HostPlatform.of("3.9.18", "aarch64", "2.31")
X86_311 = HostPlatform.of("3.11.2", "x86_64", "2.36")


def _files(wheels: list[Path]) -> set[str]:
    return {p.name for p in wheels}


def _folder_env(tmp: Path, folder: Path) -> dict[str, str]:
    """pip reads only `folder` (find-links, no index)."""
    return pip_env(tmp, PIP_NO_INDEX="1", PIP_FIND_LINKS=str(folder))


@pytest.fixture
def dists(tmp_path: Path) -> Path:
    d = tmp_path / "dists"
    make_wheel(d, "alpha", "1.0", tag="cp39-cp39-manylinux_2_17_aarch64", requires=["beta>=1"])
    make_wheel(d, "alpha", "1.0", tag="cp311-cp311-manylinux_2_17_x86_64", requires=["beta>=1"])
    make_wheel(d, "beta", "1.0")
    make_wheel(d, "onlyx86", "1.0", tag="cp39-cp39-manylinux_2_17_x86_64")
    make_wheel(d, "left", "1.0", requires=["shared<2"])
    make_wheel(d, "right", "1.0", requires=["shared>=2"])
    make_wheel(d, "shared", "1.0")
    make_wheel(d, "shared", "2.0")
    make_sdist(d, "puresrc", "1.0", requires=["beta"])
    make_sdist(d, "nativesrc", "1.0", pure=False)
    return d


def test_each_target_gets_its_own_wheels_aarch64_cp39_among_x86_64_cp311(
    tmp_path: Path, dists: Path
) -> None:
    # Markers hold for the host, not this machine (pip alone evaluates them for its own Python).
    spec = from_lines(["alpha==1.0", 'shared==1.0 ; python_version < "3.10"'], base=tmp_path)
    env = _folder_env(tmp_path, dists)
    arm = resolve(spec, ARM39, cache=tmp_path / "cache", env=env)
    x86 = resolve(spec, X86_311, cache=tmp_path / "cache", env=env)
    assert {w.file for w in arm.wheels} == {
        "alpha-1.0-cp39-cp39-manylinux_2_17_aarch64.whl",
        "beta-1.0-py3-none-any.whl",
        "shared-1.0-py3-none-any.whl",
    }
    assert {w.file for w in x86.wheels} == {
        "alpha-1.0-cp311-cp311-manylinux_2_17_x86_64.whl",
        "beta-1.0-py3-none-any.whl",
    }
    assert arm.key != x86.key and arm.path != x86.path
    assert _files(list(arm.wheel_dir.iterdir())) == {w.file for w in arm.wheels}
    beta = next(w for w in arm.wheels if w.name == "beta")
    assert (
        beta.sha256 == sha256(dists / beta.file) and beta.size == (dists / beta.file).stat().st_size
    )
    assert f"beta==1.0 --hash=sha256:{beta.sha256}" in arm.pinned.read_text()


def test_cache_reused_until_text_changes_or_refresh(tmp_path: Path, dists: Path) -> None:
    """The index's request log is the proof: a reused resolution asks it nothing."""
    index = write_index(tmp_path / "index", dists).parent
    constraints = tmp_path / "code" / "constraints.txt"
    constraints.parent.mkdir()
    constraints.write_text("beta==1.0\n")
    (tmp_path / "code" / "requirements.txt").write_text("alpha\n-c constraints.txt\n")
    cache = tmp_path / "cache"
    with IndexServer(index).running() as server:
        env = pip_env(tmp_path, PIP_INDEX_URL=server.url)
        first = resolve(
            from_file(tmp_path / "code" / "requirements.txt"), ARM39, cache=cache, env=env
        )
        assert server.requests, "the first resolution asks the index"
        server.requests.clear()

        again = resolve(
            from_file(tmp_path / "code" / "requirements.txt"), ARM39, cache=cache, env=env
        )
        assert again == first
        assert server.requests == []

        fresh = resolve(
            from_file(tmp_path / "code" / "requirements.txt"),
            ARM39,
            cache=cache,
            env=env,
            refresh=True,
        )
        assert fresh.key == first.key and len(server.requests) > 0
        server.requests.clear()

        constraints.write_text("beta>=1.0\n")  # a changed file the requirements reach
        changed = resolve(
            from_file(tmp_path / "code" / "requirements.txt"), ARM39, cache=cache, env=env
        )
        assert changed.key != first.key and len(server.requests) > 0


def test_this_machines_pip_configuration_is_honoured(tmp_path: Path, dists: Path) -> None:
    """A pip config file (what `pip config list` shows) names the index; nothing else does."""
    index = write_index(tmp_path / "index", dists).parent
    with IndexServer(index).running() as server:
        conf = tmp_path / "pip.conf"
        conf.write_text(f"[global]\nindex-url = {server.url}\n")
        env = pip_env(tmp_path) | {"PIP_CONFIG_FILE": str(conf)}
        wh = resolve(from_lines(["alpha"], base=tmp_path), ARM39, cache=tmp_path / "c", env=env)
        assert "alpha-1.0-cp39-cp39-manylinux_2_17_aarch64.whl" in {w.file for w in wh.wheels}
        assert any(path.startswith("/simple/alpha/") for path in server.requests)


def test_sdist_only_pure_is_built_here_for_any_platform(tmp_path: Path, dists: Path) -> None:
    spec = from_lines(["puresrc"], base=tmp_path)
    wh = resolve(spec, ARM39, cache=tmp_path / "cache", env=_folder_env(tmp_path, dists))
    assert {w.file for w in wh.wheels} == {
        "puresrc-1.0-py3-none-any.whl",
        "beta-1.0-py3-none-any.whl",
    }
    assert sorted(p.name for p in wh.path.iterdir()) == [
        "manifest.json",
        "pinned.txt",
        "requirements.in",
        "wheels",
    ]


def test_sdist_only_platform_specific_refused_for_another_platform(
    tmp_path: Path, dists: Path
) -> None:
    spec = from_lines(["nativesrc"], base=tmp_path)
    with pytest.raises(ResolveError) as e:
        resolve(spec, ARM39, cache=tmp_path / "cache", env=_folder_env(tmp_path, dists))
    assert (
        "nativesrc" in e.value.message and "CPython 3.9, manylinux_2_31_aarch64" in e.value.message
    )
    assert "platform-specific" in e.value.message and e.value.hint
    assert [p for p in (tmp_path / "cache").iterdir()] == [], "nothing is kept of a failure"


def test_sdist_only_platform_specific_built_when_this_machine_matches(
    tmp_path: Path, dists: Path
) -> None:
    here = HostPlatform.here()
    spec = from_lines(["nativesrc"], base=tmp_path)
    wh = resolve(spec, here, cache=tmp_path / "cache", env=_folder_env(tmp_path, dists))
    tag = f"{here.python_tag}-{here.python_tag}-linux_{here.machine}"
    assert {w.file for w in wh.wheels} == {f"nativesrc-1.0-{tag}.whl"}


def test_no_wheel_for_the_platform_names_requirement_python_and_platform(
    tmp_path: Path, dists: Path
) -> None:
    spec = from_lines(["onlyx86==1.0"], base=tmp_path)
    with pytest.raises(ResolveError) as e:
        resolve(spec, ARM39, cache=tmp_path / "cache", env=_folder_env(tmp_path, dists))
    assert e.value.message.startswith(
        "onlyx86==1.0: no wheel for CPython 3.9, manylinux_2_31_aarch64"
    )
    assert (e.value.hint or "").startswith(
        "pick a version of onlyx86 that publishes a wheel for cp39"
    )


def test_conflict_reported_in_pips_words_cut_to_the_conflict(tmp_path: Path, dists: Path) -> None:
    spec = from_lines(["left", "right"], base=tmp_path)
    with pytest.raises(ResolveError) as e:
        resolve(spec, ARM39, cache=tmp_path / "cache", env=_folder_env(tmp_path, dists))
    text = e.value.message
    assert text.startswith("dependency conflict resolving for CPython 3.9")
    assert "left 1.0 depends on shared<2" in text and "right 1.0 depends on shared>=2" in text
    assert "To fix this" not in text and "pip to attempt" not in text


def test_hashes_are_kept_and_checked(tmp_path: Path, dists: Path) -> None:
    good = sha256(dists / "beta-1.0-py3-none-any.whl")
    env = _folder_env(tmp_path, dists)
    wh = resolve(
        from_lines([f"beta==1.0 --hash=sha256:{good}"], base=tmp_path),
        ARM39,
        cache=tmp_path / "c",
        env=env,
    )
    assert [w.sha256 for w in wh.wheels] == [good]
    with pytest.raises(ResolveError) as e:
        resolve(
            from_lines([f"beta==1.0 --hash=sha256:{'0' * 64}"], base=tmp_path),
            ARM39,
            cache=tmp_path / "c",
            env=env,
        )
    assert "hash" in e.value.message


def test_local_wheel_path_is_resolved_and_part_of_the_key(tmp_path: Path) -> None:
    code = tmp_path / "code"
    wheel = make_wheel(code / "vendor", "vendored", "1.0")
    env = pip_env(tmp_path, PIP_NO_INDEX="1")
    first = resolve(
        from_lines([f"./vendor/{wheel.name}"], base=code), ARM39, cache=tmp_path / "c", env=env
    )
    assert [w.file for w in first.wheels] == [wheel.name]
    make_wheel(code / "vendor", "vendored", "1.0", requires=["beta"])  # rebuilt: new bytes
    rebuilt = from_lines([f"./vendor/{wheel.name}"], base=code)
    assert env_hash(rebuilt, ARM39) != first.key


def test_editable_refused_with_a_hint_also_in_a_nested_file(tmp_path: Path) -> None:
    with pytest.raises(RequirementsError) as e:
        from_lines(["numpy", "-e ./myproject"], base=tmp_path)
    assert "-e ./myproject" in e.value.message and "editable" in e.value.message
    assert "without -e" in (e.value.hint or "")
    (tmp_path / "more.txt").write_text("six\n--editable=git+https://example.invalid/x#egg=x\n")
    (tmp_path / "requirements.txt").write_text("-r more.txt\n")
    with pytest.raises(RequirementsError) as nested:
        from_file(tmp_path / "requirements.txt")
    assert f"{tmp_path / 'more.txt'}:2" in nested.value.message
