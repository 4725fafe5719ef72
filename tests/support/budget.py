"""The suite's time budget: a run of pytest that takes longer than `suite_budget_s` (pyproject.toml,
[tool.pytest.ini_options]) fails, listing its slowest tests, so CI stays inside its limit however
many tests later issues add (docs/testing.md, "The budget").

One number to change: `suite_budget_s` in pyproject.toml, or `--suite-budget=SECONDS` for one run
(0 turns the check off). It is pytest's wall time from the start of collection to the end of the
session, measured by the process that reports (the xdist controller with `-n`). A run that selects
a few tests never comes near it; the whole suite is what it is for. It is a property of the run,
not a test: no test asserts a time (timing claims live in bench/).
"""

from __future__ import annotations

import time
from collections import defaultdict

import pytest

INI = "suite_budget_s"
SLOWEST = 15  # tests listed when the budget is exceeded


def add_options(parser: pytest.Parser) -> None:
    parser.addini(INI, "seconds of pytest wall time the suite may take; 0: no limit", default="0")
    parser.addoption(
        "--suite-budget",
        type=float,
        default=None,
        metavar="SECONDS",
        help=f"override the ini's {INI} for this run (0: no limit)",
    )


def budget_of(config: pytest.Config) -> float:
    given = config.getoption("--suite-budget")
    return float(given if given is not None else config.getini(INI) or 0)


class Budget:
    """Sums each test's setup, call and teardown time as reported, and fails a run over budget."""

    def __init__(self, limit: float) -> None:
        self.limit = limit
        self.start = time.monotonic()
        self.per_test: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.per_test[report.nodeid] += report.duration

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        elapsed = time.monotonic() - self.start
        if elapsed <= self.limit:
            return
        slowest = sorted(self.per_test.items(), key=lambda kv: kv[1], reverse=True)[:SLOWEST]
        lines = [
            f"SUITE BUDGET EXCEEDED: {elapsed:.0f} s of pytest wall time, budget {self.limit:g} s"
            f" ({INI} in pyproject.toml, or --suite-budget). Make these faster (docs/testing.md):",
            *(f"  {seconds:7.1f} s  {nodeid}" for nodeid, seconds in slowest),
        ]
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.ensure_newline()
            for line in lines:
                reporter.write_line(line, red=True)
        if session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


def install(config: pytest.Config) -> None:
    """Registers the check in the reporting process (never in an xdist worker)."""
    limit = budget_of(config)
    if limit > 0 and not hasattr(config, "workerinput"):
        config.pluginmanager.register(Budget(limit), "tfdeploy-suite-budget")
