"""The inventories the docs show are ones a reader can copy: every TOML example parses, and the
README's multi-host example and inventories/aws.toml name only files that exist in the repository
and install packages with `requirements`, not with pip in `setup` (which fails on hosts with no
route out, as in a private subnet)."""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.names_tf(
    reason="reads the docs' and inventories/' examples; starts nothing"
)

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
AWS = ROOT / "inventories" / "aws.toml"
TOML_BLOCK = re.compile(r"^```toml\n(.*?)^```", re.M | re.S)
PAGES = [README, *sorted((ROOT / "docs").glob("*.md")), ROOT / "examples" / "digits" / "README.md"]


def _blocks(page: Path) -> list[str]:
    return TOML_BLOCK.findall(page.read_text())


def _readme_inventory() -> dict[str, Any]:
    """The README's multi-host reference example: the first TOML block under "## An inventory"
    (the first-run section before it is for hosts that already hold TensorFlow)."""
    text = README.read_text()
    section = text[text.index("\n## An inventory") :]
    found = [tomllib.loads(b) for b in TOML_BLOCK.findall(section)]
    found = [d for d in found if "job" in d and "hosts" in d]
    assert found, "the README's reference inventory (## An inventory) is gone"
    return found[0]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_toml_example_parses(page: Path) -> None:
    bad = []
    for i, block in enumerate(_blocks(page)):
        try:
            tomllib.loads(block)
        except tomllib.TOMLDecodeError as exc:
            bad.append(f"block {i + 1}: {exc}")
    assert not bad, f"{page.name}: {bad}"


def test_the_pages_have_toml_examples() -> None:
    """The pattern finds the blocks (a pattern that never matched would pass every page)."""
    assert _blocks(README) and _blocks(ROOT / "docs" / "inventory.md")


def _named_files(job: dict[str, Any], inventory_dir: Path) -> list[Path]:
    """The code directory, the requirements file(s) relative to it, and each command's script."""
    code = (inventory_dir / job["code"]).resolve()
    named = [code]
    requirements = job.get("requirements")
    if isinstance(requirements, str):
        named.append(code / requirements)
    commands = [job.get("command", ""), *job.get("role_commands", {}).values()]
    for command in commands:
        words = shlex.split(command)
        if words and re.fullmatch(r"python3?(\.\d+)?", words[0]) and len(words) > 1:
            named.append(code / words[1])
    return named


@pytest.mark.parametrize("which", ["README.md", "inventories/aws.toml"])
def test_the_multi_host_examples_name_files_that_exist(which: str) -> None:
    if which == "README.md":
        job = _readme_inventory()["job"]  # the README says it sits in inventories/
    else:
        job = tomllib.loads(AWS.read_text())["job"]
    named = _named_files(job, ROOT / "inventories")
    assert len(named) >= 3, f"expected code, requirements and a script: {named}"
    missing = [str(p.relative_to(ROOT)) for p in named if not p.exists()]
    assert not missing, f"{which} names files the repository lacks: {missing}"


@pytest.mark.parametrize("which", ["README.md", "inventories/aws.toml"])
def test_the_multi_host_examples_install_packages_with_requirements(which: str) -> None:
    if which == "README.md":
        job = _readme_inventory()["job"]
    else:
        job = tomllib.loads(AWS.read_text())["job"]
    assert job.get("requirements"), f"{which}: the job's packages belong in `requirements`"
    pip = [c for c in job.get("setup", []) if re.search(r"\bpip3?\b.*\binstall\b", c)]
    assert not pip, (
        f"{which}: setup installs packages with pip (no index on a private subnet): {pip}"
    )


def test_every_mwms_worker_of_the_readme_example_has_the_same_gpu_count() -> None:
    """MultiWorkerMirroredStrategy needs as many GPUs in every worker (and the chief)."""
    counts = []
    for host in _readme_inventory()["hosts"]:
        for task in host["tasks"]:
            if "gpus" in task:
                counts += [len(task["gpus"])] * task.get("count", 1)
            else:  # the host's GPUs split evenly among its tasks
                n = sum(t.get("count", 1) for t in host["tasks"])
                counts += [host["gpus"] // n] * task.get("count", 1)
    assert len(set(counts)) == 1, f"GPUs per task: {counts}"
