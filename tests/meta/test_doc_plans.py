"""Every inventory the README and docs/ show passes `tfdeploy plan`, so a wrong example fails CI.

Each ```toml block of README.md and docs/*.md is written to `<tmp>/inventories/<page>-<n>.toml`
beside a `<tmp>/examples` link to the repository's examples/: the blocks are read as files of the
repository's inventories/ folder, so `code = "../examples/digits"` and a `requirements` file
relative to `code` resolve as they do for a reader who saves the block there. Planning it must
exit 0 with no warning (a TensorFlow rule broken, such as unequal GPUs among MWMS workers, is a
wrong example too). A block with an `[aws]` table plans against moto's EC2 (tests/conftest.py's
`ec2`): no instance runs there, so a group that launches lists its instances as `(to launch)`.

A block that is only part of an inventory (some `[job]` keys, one `[[aws.hosts]]` group) says so
in its fence, ```toml fragment; it is not planned, but it must still parse.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from tests.support.aws import cli

pytestmark = pytest.mark.names_tf(
    reason="plans the docs' inventories (examples/digits, tfdeploy:server); starts nothing"
)

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```toml( fragment)?\n(.*?)^```", re.M | re.S)


def _blocks() -> list[tuple[str, bool, str]]:
    """(id, is_fragment, text) of every TOML block of the pages, in page order."""
    found = []
    for page in PAGES:
        for n, m in enumerate(BLOCK.finditer(page.read_text()), start=1):
            found.append((f"{page.relative_to(ROOT)}#{n}", bool(m.group(1)), m.group(2)))
    return found


BLOCKS = _blocks()
INVENTORIES = [(name, text) for name, fragment, text in BLOCKS if not fragment]


def test_the_pages_show_inventories_and_fragments() -> None:
    """The pattern finds the blocks, and both kinds (a pattern that never matched would pass)."""
    names = [name for name, _ in INVENTORIES]
    assert "README.md#1" in names and "docs/inventory.md#1" in names
    assert any(fragment for _, fragment, _ in BLOCKS)


@pytest.mark.parametrize("name,fragment,text", BLOCKS, ids=[b[0] for b in BLOCKS])
def test_every_toml_block_parses(name: str, fragment: bool, text: str) -> None:
    tomllib.loads(text)  # raises, naming the line, on a broken example


@pytest.mark.parametrize("name,text", INVENTORIES, ids=[b[0] for b in INVENTORIES])
def test_every_inventory_of_the_docs_plans_without_a_warning(
    name: str, text: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if "aws" in tomllib.loads(text):
        request.getfixturevalue("ec2")  # EC2 is moto's, in this process
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    (tmp_path / "inventories").mkdir()
    path = tmp_path / "inventories" / (re.sub(r"\W", "-", name) + ".toml")
    path.write_text(text)
    code, out, err = cli("plan", str(path))
    assert code == 0, f"{name} does not plan:\n{err}"
    assert "warning" not in err, f"{name} plans with a warning:\n{err}"
    # each task's cluster variables: TF_CONFIG, or another convention's (docs/frameworks.md)
    assert "TF_CONFIG" in out or " variables per task" in out


def test_every_code_path_the_docs_name_resolves_from_the_inventories_folder() -> None:
    """`code = "..."` in prose and fragments too (examples/digits/README.md's included) is read
    as the blocks are: relative to inventories/."""
    pages = [*PAGES, ROOT / "examples" / "digits" / "README.md"]
    named = {
        (page.name, code)
        for page in pages
        for code in re.findall(r'\bcode = "([^"]+)"', page.read_text())
    }
    assert ("README.md", "../examples/digits") in named
    missing = sorted(
        f"{page}: {code}" for page, code in named if not (ROOT / "inventories" / code).is_dir()
    )
    assert not missing, f"code paths that are not folders from inventories/: {missing}"
