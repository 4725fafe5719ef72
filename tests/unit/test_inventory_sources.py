"""Host sources: top-level tables the parser does not know, given to `load_inventory` as readers."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest
from rich.console import Console

from deployer.api.render import plan_document, plan_table
from deployer.config.inventory import (
    Inventory,
    discover_hosts,
    make_host,
    parse_host_settings,
)
from deployer.config.inventory import load_inventory as load_with
from deployer.config.model import Host
from deployer.config.plan import make_plan
from deployer.config.schema import Table
from deployer.config.sources import (
    Discovered,
    Provisioned,
    Say,
    SourceContext,
    Sourced,
    SourceTable,
)
from deployer.core.errors import InventoryError
from tests.support.helpers import JOB, write_toml

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Rack:
    """A pending source: its hosts are "found" only when discovered, named rack-0, rack-1..."""

    table: Table
    context: SourceContext
    size: int
    key: str = "rack"

    def discover(self, file: str, *, preview: bool = False) -> Discovered:
        settings = parse_host_settings(self.table, self.context)
        hosts = tuple(
            make_host(
                settings,
                name=f"rack-{i}",
                address=f"10.9.0.{i + 1}",
                tf_address=f"10.9.0.{i + 1}",
                key=self.table.path,
                transport="ssh",
            )
            for i in range(self.size)
        )
        rows = tuple((h.name, h.address) for h in hosts)
        table = SourceTable(f"{self.size} rack machines", ("machine", "address"), rows, "rack")
        return Discovered(
            hosts=hosts, instances=tuple(f"machine {i}" for i in range(self.size)), table=table
        )

    def provision(self, file: str, say: Say, *, detach: bool = False) -> Provisioned:
        return Provisioned(self.discover(file))

    def replace(self, file: str, gone: Host, say: Say) -> Host | None:
        return None

    def terminate(self, when: tuple[str, ...], say: Say) -> None:
        """A rack's machines are not ours to end."""


def read_rack(t: Table, context: SourceContext) -> Sourced:
    size = t.integer("size", 1, minimum=1)
    return Sourced(pending=Rack(t, context, size))


def read_pair(t: Table, context: SourceContext) -> Sourced:
    """A source whose hosts are known at once: two hosts sharing one set of settings."""
    settings = parse_host_settings(t, context)
    t.finish()
    return Sourced(
        hosts=tuple(
            make_host(settings, name=n, address=n, tf_address=n, key=t.path, transport="ssh")
            for n in ("p1", "p2")
        )
    )


READERS = {"rack": lambda: read_rack, "pair": lambda: read_pair}


def load_inventory(path: Path) -> Inventory:
    return load_with(path, READERS)


@pytest.fixture
def sources() -> None:
    """The readers are passed to every load in this file; the fixture names the dependence."""


def test_a_registered_source_adds_hosts_without_hosts_table(tmp_path: Path, sources: None) -> None:
    inv = load_inventory(
        write_toml(
            tmp_path,
            JOB + '[pair]\ntasks = [{ role = "worker" }]\nssh = { identity = "id" }\n',
        )
    )
    assert [h.name for h in inv.hosts] == ["p1", "p2"]
    assert {h.ssh.identity for h in inv.hosts} == {str(tmp_path / "id")}
    assert inv.pending == () and discover_hosts(inv) is inv


def test_pending_sources_are_discovered_after_the_static_hosts(
    tmp_path: Path, sources: None
) -> None:
    text = (
        JOB
        + '[rack]\nsize = 2\ntasks = [{ role = "worker" }]\n'
        + '[[hosts]]\naddress = "10.0.0.1"\ntasks = [{ role = "chief" }]\n'
    )
    inv = load_inventory(write_toml(tmp_path, text))
    assert [h.name for h in inv.hosts] == ["10.0.0.1"]  # loading does no discovery
    assert [p.key for p in inv.pending] == ["rack"]
    found = discover_hosts(inv)
    assert [h.name for h in found.hosts] == ["10.0.0.1", "rack-0", "rack-1"]
    assert found.instances == ("machine 0", "machine 1") and found.pending == ()


def test_hosts_of_a_source_must_not_clash_with_the_static_ones(
    tmp_path: Path, sources: None
) -> None:
    text = (
        JOB
        + '[rack]\ntasks = [{ role = "worker" }]\n'
        + '[[hosts]]\nname = "rack-0"\naddress = "10.0.0.1"\ntasks = [{ role = "chief" }]\n'
    )
    with pytest.raises(InventoryError, match=r"rack\.name: duplicate host name 'rack-0'"):
        discover_hosts(load_inventory(write_toml(tmp_path, text)))


def test_an_unregistered_table_is_still_an_unknown_key(tmp_path: Path) -> None:
    text = JOB + '[rack]\nsize = 2\n[[hosts]]\naddress = "a"\ntasks = [{ role = "chief" }]\n'
    with pytest.raises(InventoryError, match=r"rack: unknown key \(known keys here: hosts, job"):
        load_with(write_toml(tmp_path, text))


def test_the_aws_source_uses_only_public_names_of_the_inventory() -> None:
    """The aws package plugs in like any other source: no private helper, no Table internals."""
    ours = ("deployer.config.inventory", "deployer.config.schema", "deployer.config.sources")
    for path in sorted((ROOT / "deployer" / "sources" / "aws").glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module in ours:
                assert not [a.name for a in node.names if a.name.startswith("_")], path
            if isinstance(node, ast.Attribute):
                assert node.attr not in ("_data", "_seen"), ast.unparse(node)


def test_plan_shows_what_a_source_found_as_the_source_describes_it(
    tmp_path: Path, sources: None
) -> None:
    """The renderers know no source: a test's rack shows in the table and JSON like EC2 does."""
    text = JOB + '[rack]\nsize = 2\ntasks = [{ role = "worker" }]\n'
    plan = make_plan(discover_hosts(load_inventory(write_toml(tmp_path, text))))
    console = Console(width=120, color_system=None, record=True)
    console.print(plan_table(plan))
    shown = console.export_text()
    assert "2 rack machines" in shown and "rack-1" in shown and "10.9.0.2" in shown
    assert plan_document(plan)["rack"] == []  # no documents: an empty list, not missing
