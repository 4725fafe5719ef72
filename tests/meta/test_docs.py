"""The docs cannot go stale quietly: every link resolves, every page is reachable from the README,
every test a page cites exists where it says, and a measured figure has one home (docs/bench/),
so it cannot be stated twice with two values."""

from __future__ import annotations

import io
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench import report

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
BENCH = DOCS / "bench"
PAGES = sorted(DOCS.glob("*.md"))  # the reference pages, one question each
BENCH_FILES = sorted(BENCH.glob("*.md"))  # the one home of every measured figure
EVERY = [README, *PAGES, *BENCH_FILES]

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)
INDENTED = re.compile(r"^(?: {4}|\t).*$", re.M)  # a command shown as a code block
CODE_SPAN = re.compile(r"`[^`\n]*`")
# A measured quantity: a number with a unit of time, size, rate or share.
FIGURE = re.compile(
    r"(?<![\w.,-])(\d[\d,]*(?:\.\d+)?) ?(ms|s|min|MB|GB|kB|MB/s|lines/s|steps/s|%)(?![\w/])"
)
RATIO = re.compile(r"(?<![\w.,])\d[\d,]*(?:\.\d+)?x(?!\w)")  # 0.69x, 1.54x: always a bench figure
SUITE_SIZE = re.compile(r"(?<![\w.,])\d[\d,]* (?:passed|skipped|tests)\b")


def _prose(path: Path) -> str:
    """The text a reader reads as sentences: code blocks and code spans removed (commands there
    carry numbers that are arguments, not results)."""
    text = FENCE.sub("", path.read_text())
    if path != README:
        text = INDENTED.sub("", text)
    return CODE_SPAN.sub("", text)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text())
    return {_slug(h) for h in re.findall(r"^#{1,6} (.+)$", text, re.M)}


def _links(path: Path) -> list[str]:
    text = FENCE.sub("", path.read_text())
    return [t for t in LINK.findall(CODE_SPAN.sub("", text)) if not re.match(r"\w+:", t)]


def _target(page: Path, link: str) -> tuple[Path, str]:
    file, _, anchor = link.partition("#")
    return ((page.parent / file).resolve() if file else page), anchor


@pytest.mark.parametrize("page", EVERY, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(page: Path) -> None:
    broken = []
    for link in _links(page):
        target, anchor = _target(page, link)
        if not target.exists():
            broken.append(f"{link}: no such file")
        elif anchor and anchor not in _anchors(target):
            broken.append(f"{link}: no heading #{anchor} in {target.name}")
    assert not broken, f"{page.name}: {broken}"


def test_the_checks_find_what_they_look_for() -> None:
    """The link, anchor and figure patterns match what the docs write (a pattern that never
    matched would pass every page)."""
    assert _slug("CPU placement: `threads` and `cpus`") == "cpu-placement-threads-and-cpus"
    assert _slug("What happens when...") == "what-happens-when"
    assert "failures.md#what-happens-when" in _links(README.parent / "docs" / "results.md")
    found = FIGURE.findall("median 39 s, 455 MB, 779,706 lines/s, 75% and 1.5 s; 2 cores")
    assert found == [("39", "s"), ("455", "MB"), ("779,706", "lines/s"), ("75", "%"), ("1.5", "s")]
    assert RATIO.findall("0.69x pdsh, 1.54x, 3x, not 0x7f") == ["0.69x", "1.54x", "3x"]
    assert SUITE_SIZE.findall("615 tests; 555 passed, 23 skipped; the 2.15 tests") == [
        "615 tests",
        "555 passed",
        "23 skipped",
    ]


def test_every_docs_page_is_linked_from_the_readme() -> None:
    linked = {_target(README, link)[0] for link in _links(README)}
    missing = [p.name for p in PAGES if p.resolve() not in linked]
    assert not missing, f"docs pages the README does not link: {missing}"


def test_every_bench_file_is_linked_from_the_performance_page_and_says_what_wrote_it() -> None:
    performance = DOCS / "performance.md"
    linked = {_target(performance, link)[0] for link in _links(performance)}
    assert BENCH_FILES, "docs/bench/ is empty"
    for path in BENCH_FILES:
        assert path.resolve() in linked, f"{path.name} is not linked from docs/performance.md"
        first = path.read_text().splitlines()[0]
        assert re.match(r"(Written|Measured) by `[^`]*python -m bench|Recorded by hand", first), (
            f"{path.name} must start by naming the command that wrote it, or say it was recorded"
            f" by hand: {first!r}"
        )


def test_a_ratio_is_stated_only_in_docs_bench() -> None:
    """`0.69x` in prose beside `0.79x` in the table was the contradiction: prose links instead."""
    stated = {p.name: RATIO.findall(_prose(p)) for p in [README, *PAGES]}
    stated = {name: found for name, found in stated.items() if found}
    assert not stated, f"ratios outside docs/bench/ (link the bench file instead): {stated}"


def test_the_readme_states_no_measured_figure() -> None:
    found = [m.group(0) for m in FIGURE.finditer(_prose(README))]
    assert not found, f"the README links its figures, it does not state them: {found}"


def test_the_suite_size_is_printed_by_the_test_command_not_copied() -> None:
    copied = {p.name: SUITE_SIZE.findall(_prose(p)) for p in [README, *PAGES]}
    copied = {name: found for name, found in copied.items() if found}
    assert not copied, f"hand-copied test counts (pytest's last line says them): {copied}"


def test_a_page_that_cites_a_bench_file_states_only_its_figures() -> None:
    """A page linking docs/bench/ files may state a figure only as those files have it."""
    absent: dict[str, list[str]] = {}
    citing = 0
    for page in PAGES:
        cited = [t for t in (_target(page, link)[0] for link in _links(page)) if t.parent == BENCH]
        if not cited:
            continue
        citing += 1
        source = "\n".join(t.read_text() for t in cited if t.exists())
        for m in FIGURE.finditer(_prose(page)):
            said = rf"(?<![\d.,]){re.escape(m.group(1))} ?{re.escape(m.group(2))}(?![\w/])"
            if not re.search(said, source):
                absent.setdefault(page.name, []).append(m.group(0))
    assert citing, "no page cites docs/bench/: the check would check nothing"
    assert not absent, f"figures their bench files do not have (link them instead): {absent}"


def _defined_tests() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in (ROOT / "tests").rglob("test_*.py"):
        for name in re.findall(r"^\s*(?:async )?def (test_\w+)", path.read_text(), re.M):
            found.setdefault(name, set()).add(path.name)
    return found


def test_every_cited_test_and_test_file_exists() -> None:
    defined = _defined_tests()
    missing = []
    for page in [README, *PAGES]:
        text = page.read_text()
        cited = re.findall(r"`(test_\w+)(?![\w.])", text)
        missing += [f"{page.name}: {name}" for name in cited if name not in defined]
        for file in set(re.findall(r"\btests/[\w/]+\.py\b", text)):
            if not (ROOT / file).exists():
                missing.append(f"{page.name}: {file}")
    assert not missing, f"cited tests that do not exist: {missing}"


def test_each_fault_is_proven_by_a_test_in_the_file_its_row_names() -> None:
    """A row names its test's file unless the test is in test_faults.py (the table says so)."""
    defined = _defined_tests()
    rows = [r for r in (DOCS / "failures.md").read_text().splitlines() if r.startswith("| ")]
    assert len(rows) > 30
    wrong = []
    for row in rows[2:]:
        proof = row.rsplit(" | ", 1)[-1]
        for name in re.findall(r"`(test_\w+)(?![\w.])", proof):
            files = defined.get(name, set())
            if "test_faults.py" not in files and not any(f in proof for f in files):
                wrong.append(f"{name} (in {sorted(files)})")
    assert not wrong, f"tests whose row does not name their file: {wrong}"


def test_a_bench_writes_its_output_to_the_file_the_docs_link(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "docs" / "bench" / "x.md"
    monkeypatch.setattr(sys, "argv", ["x.py", "--reps", "2", "--out", str(out)])
    shown = io.StringIO()
    monkeypatch.setattr(sys, "stdout", shown)
    with report.tee_to(out, "bench.x"):
        print("| hosts | time |\n|---|---|\n| 8 | 1.02 s |")
    text = out.read_text()
    assert text.startswith(f"Written by `python -m bench.x --reps 2 --out {out}` on ")
    assert text.endswith("\n| hosts | time |\n|---|---|\n| 8 | 1.02 s |\n")
    assert "| 8 | 1.02 s |" in shown.getvalue()
    with report.tee_to(None, "bench.x"):
        print("nothing written")
    assert out.read_text() == text


def test_no_install_hint_names_the_other_projects_distribution() -> None:
    """`tfdeploy` on PyPI is an unrelated project: every hint names tfdeploy-cluster, or the
    checkout's `pip install -e`."""
    wrong = re.compile(r"pip install\s+(?:-\w+\s+)*['\"]?tfdeploy(?![\w-])")
    assert wrong.search("pip install 'tfdeploy[aws]'") and not wrong.search(
        "pip install 'tfdeploy-cluster[aws]'"
    )
    files = [*EVERY, ROOT / "inventories" / "aws.toml", *(ROOT / "deployer").rglob("*.py")]
    found = [str(p.relative_to(ROOT)) for p in files if wrong.search(p.read_text())]
    assert not found, f"install hints naming PyPI's unrelated `tfdeploy`: {found}"


def _layout_entries() -> set[str]:
    """The root entries docs/architecture.md's "Repository layout" names (each `name:` or
    `name/:` in its list)."""
    text = (DOCS / "architecture.md").read_text()
    section = text.split("## Repository layout", 1)[1].split("\n## ", 1)[0]
    items = "\n".join(line for line in section.splitlines() if line.startswith(("- ", "  ")))
    return {span.strip("`:").rstrip("/") for span in re.findall(r"`[^`/\s]+/?`:", items)}


def test_no_file_at_the_repository_root_that_the_layout_does_not_list() -> None:
    """What git would commit at the root (tracked, or new and not ignored) is each named in the
    layout, and everything the layout names is there: a stray output file (a bench's `up`) fails."""
    git = ["git", "-C", str(ROOT), "ls-files", "--cached", "--others", "--exclude-standard"]
    try:
        listed = subprocess.run(git, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the root's entries cannot be told from build outputs")
    at_root = {path.split("/", 1)[0] for path in listed.splitlines()}
    layout = _layout_entries()
    assert {"README.md", "deployer", "remote", "tests", ".gitignore"} <= layout
    stray = sorted(at_root - layout)
    assert not stray, f"at the repository root but not in docs/architecture.md's layout: {stray}"
    assert not layout - at_root, f"in the layout but not at the root: {sorted(layout - at_root)}"
