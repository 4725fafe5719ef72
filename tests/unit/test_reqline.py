"""Requirements lines read as pip reads them: every editable spelling pip's own parser accepts is
refused here, and every file pip follows is followed here (pip's parser is the oracle, not a
list of spellings: pip._internal.req.req_file.parse_requirements on this machine)."""

from __future__ import annotations

from pathlib import Path

import pytest

pip_req_file = pytest.importorskip("pip._internal.req.req_file")
pip_session = pytest.importorskip("pip._internal.network.session")

from deployer.envs.spec import RequirementsError, from_file  # noqa: E402

# Each spelling pip's requirements-file grammar allows for an editable (glued short option,
# `=`, unique prefixes of --editable, after other options, VCS URLs glued).
EDITABLE_LINES = [
    "-e ./pkg",
    "-e./pkg",
    "-egit+https://example.invalid/x.git#egg=x",
    "-e git+https://example.invalid/x.git#egg=x",
    "--editable ./pkg",
    "--editable=./pkg",
    "--editable=git+https://example.invalid/x.git#egg=x",
    "--edit ./pkg",
    "--ed=./pkg",
    "--editab ./pkg",
    "--pre -e ./pkg",
    "--no-index --editable=./pkg",
    "-e  ./pkg",
    '-e "./pkg"',
]
# Lines that install no editable: pip reads them, and so must tfdeploy, without refusing.
PLAIN_LINES = [
    "numpy<3",
    "--pre",
    "--prefer-binary",
    "--only-binary=:all:",
    "./pkg",
    "numpy==1.26.4 --hash=sha256:" + "0" * 64,
    "--extra-index-url https://example.invalid/simple",
]


def _pip_editables(path: Path) -> list[bool]:
    session = pip_session.PipSession()
    return [r.is_editable for r in pip_req_file.parse_requirements(str(path), session=session)]


def _tree(tmp_path: Path, main: str, nested: str | None = None) -> Path:
    (tmp_path / "pkg").mkdir(exist_ok=True)
    (tmp_path / "pkg" / "setup.py").write_text("from setuptools import setup; setup(name='p')\n")
    if nested is not None:
        (tmp_path / "more.txt").write_text(nested + "\n")
    path = tmp_path / "requirements.txt"
    path.write_text(main + "\n")
    return path


@pytest.mark.parametrize("line", EDITABLE_LINES)
def test_every_editable_spelling_pip_accepts_is_refused(tmp_path: Path, line: str) -> None:
    path = _tree(tmp_path, line)
    assert any(_pip_editables(path)), f"pip does not read {line!r} as an editable"
    with pytest.raises(RequirementsError, match="editable requirements"):
        from_file(path)


@pytest.mark.parametrize(
    "include", ["-r more.txt", "-rmore.txt", "--requirement=more.txt", "--requirem more.txt"]
)
@pytest.mark.parametrize("line", ["-e./pkg", "--edit ./pkg"])
def test_an_editable_in_a_nested_file_is_refused(tmp_path: Path, include: str, line: str) -> None:
    path = _tree(tmp_path, include, nested=line)
    assert any(_pip_editables(path)), f"pip does not follow {include!r} to {line!r}"
    with pytest.raises(RequirementsError, match=r"more\.txt:1: .*editable"):
        from_file(path)


@pytest.mark.parametrize("line", PLAIN_LINES)
def test_lines_pip_reads_without_an_editable_pass(tmp_path: Path, line: str) -> None:
    path = _tree(tmp_path, line)
    assert not any(_pip_editables(path))
    spec = from_file(path)
    assert line in spec.lines


@pytest.mark.parametrize(
    "include", ["-rmore.txt", "--requirement=more.txt", "--requireme more.txt"]
)
def test_every_spelling_of_a_nested_file_is_followed(tmp_path: Path, include: str) -> None:
    path = _tree(tmp_path, include, nested="six==1.16.0")
    pip_names = [
        r.requirement
        for r in pip_req_file.parse_requirements(str(path), session=pip_session.PipSession())
    ]
    spec = from_file(path)
    assert pip_names == ["six==1.16.0"] and spec.lines == ("six==1.16.0",)
    assert "# file " + str((tmp_path / "more.txt").resolve()) in spec.text


def test_an_ambiguous_option_is_refused_in_pips_words(tmp_path: Path) -> None:
    path = _tree(tmp_path, "--e ./pkg")  # --editable or --extra-index-url: pip says so
    with pytest.raises(pip_req_file.RequirementsFileParseError):
        _pip_editables(path)
    with pytest.raises(RequirementsError, match="ambiguous option: --e"):
        from_file(path)
