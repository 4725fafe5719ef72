"""An environment's inputs and a host's target platform, without pip: what the cache key is made
of, and which wheel tags a host accepts."""

from __future__ import annotations

from pathlib import Path

import pytest

from deployer.envs.platform import HostPlatform
from deployer.envs.spec import RequirementsError, env_hash, from_file, from_lines


def test_aarch64_glibc_2_31_accepts_manylinux_2_17_to_2_31_and_manylinux2014() -> None:
    host = HostPlatform.of("3.9.18", "aarch64", "2.31")
    tags = host.platform_tags()
    assert tags[0] == "manylinux_2_31_aarch64" and tags[-2] == "manylinux_2_17_aarch64"
    assert tags[-1] == "manylinux2014_aarch64"
    assert len(tags) == 31 - 17 + 2 and not any("manylinux1" in t or "x86_64" in t for t in tags)
    args = host.pip_args()
    assert args[:4] == ["--python-version", "3.9", "--implementation", "cp"]
    assert args[4:6] == ["--abi", "cp39"] and "abi3" in args and "none" in args
    assert args.count("--platform") == len(tags)


def test_x86_64_keeps_the_old_aliases_and_arm64_is_aarch64() -> None:
    tags = HostPlatform.of("3.11.2", "x86_64", "2.28").platform_tags()
    assert tags[-3:] == ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]
    assert HostPlatform.of("3.11", "arm64", "2.35").machine == "aarch64"


def test_a_host_without_glibc_gets_pure_wheels_only() -> None:
    host = HostPlatform.of("3.12.1", "x86_64", None)
    assert host.platform_tags() == [] and host.pip_args()[-2:] == ["--platform", "any"]
    assert "no glibc" in host.describe()


def test_key_and_hash_change_with_python_platform_and_text(tmp_path: Path) -> None:
    spec = from_lines(["numpy<3"], base=tmp_path)
    keys = {
        env_hash(spec, HostPlatform.of(py, machine, glibc))
        for py, machine, glibc in [
            ("3.11.2", "x86_64", "2.36"),
            ("3.9.1", "x86_64", "2.36"),
            ("3.11.2", "aarch64", "2.36"),
            ("3.11.2", "x86_64", "2.28"),
        ]
    }
    assert len(keys) == 4
    same = HostPlatform.of("3.11.9", "x86_64", "2.36")  # a patch release installs the same wheels
    assert env_hash(spec, same) in keys
    assert from_lines(["numpy<3"], base=tmp_path).digest == spec.digest
    assert from_lines(["numpy<2"], base=tmp_path).digest != spec.digest


def test_files_reached_are_part_of_the_text_comments_and_continuations_are_not(
    tmp_path: Path,
) -> None:
    (tmp_path / "constraints.txt").write_text("numpy==2.0.2\n")
    (tmp_path / "base.txt").write_text("six  # why six\n")
    main = tmp_path / "requirements.txt"
    main.write_text(
        "-r base.txt\n--constraint=constraints.txt\n"
        'tomli>=1 ; python_version < "3.11"\n'
        "attrs==25.1.0 \\\n    --hash=sha256:" + "a" * 64 + "\n"
    )
    spec = from_file(main)
    assert "six\n" in spec.text and "numpy==2.0.2\n" in spec.text
    assert 'tomli>=1 ; python_version < "3.11"\n' in spec.text
    assert f"attrs==25.1.0      --hash=sha256:{'a' * 64}\n" in spec.text
    before = spec.digest
    (tmp_path / "base.txt").write_text("six  # a comment changed, nothing else\n")
    assert from_file(main).digest == before
    (tmp_path / "constraints.txt").write_text("numpy==2.0.1\n")
    assert from_file(main).digest != before


def test_missing_files_are_named(tmp_path: Path) -> None:
    with pytest.raises(RequirementsError, match="requirements file not found"):
        from_file(tmp_path / "requirements.txt")
    (tmp_path / "requirements.txt").write_text("-c nowhere.txt\n")
    with pytest.raises(
        RequirementsError, match=r"requirements.txt:1: constraints file nowhere.txt"
    ):
        from_file(tmp_path / "requirements.txt")
    with pytest.raises(RequirementsError, match=r"local path ./pkg not found"):
        from_lines(["./pkg"], base=tmp_path)


def test_markers_are_evaluated_for_the_host_and_nested_files_inlined(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "c.txt").write_text("numpy<3\n")
    (tmp_path / "sub" / "more.txt").write_text(
        "-c c.txt\n"
        'tomli ; python_version < "3.11"\n'
        'uvloop ; platform_machine == "aarch64" and sys_platform == "linux"\n'
        "pkg @ https://example.invalid/p.whl;x=1 ; python_full_version >= '3.9.2'\n"
    )
    (tmp_path / "requirements.txt").write_text("-r sub/more.txt\nsix==1.17.0 --hash=sha256:ab\n")
    spec = from_file(tmp_path / "requirements.txt")
    arm39 = spec.for_target(HostPlatform.of("3.9.18", "aarch64", "2.31"))
    assert arm39.splitlines() == [
        f"-c {tmp_path / 'sub' / 'c.txt'}",
        "tomli",
        "uvloop",
        "pkg @ https://example.invalid/p.whl;x=1",
        "six==1.17.0 --hash=sha256:ab",
    ]
    x86 = spec.for_target(HostPlatform.of("3.11.2", "x86_64", "2.36"))
    assert "tomli" not in x86 and "uvloop" not in x86 and "pkg @" in x86
    old39 = HostPlatform.of("3.9.1", "aarch64", "2.31")
    assert "pkg @" not in spec.for_target(old39)
    assert env_hash(spec, old39) != env_hash(spec, HostPlatform.of("3.9.18", "aarch64", "2.31"))
    with pytest.raises(RequirementsError, match="not an environment marker"):
        from_lines(["six ; python_version <> 3"], base=tmp_path).for_target(old39)
