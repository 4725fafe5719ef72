"""Host sources: top-level tables the parser does not know, plugged in through `register_source`."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

import deployer.config.inventory as inventory_module
from deployer.config.inventory import (
    Discovered,
    SourceContext,
    Sourced,
    discover_hosts,
    load_inventory,
    make_host,
    parse_host_settings,
)
from deployer.config.schema import Table
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

    def discover(self, file: str) -> Discovered:
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
        return Discovered(hosts=hosts, instances=tuple(f"machine {i}" for i in range(self.size)))


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


@pytest.fixture
def sources(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(inventory_module._SOURCES, "rack", read_rack)
    monkeypatch.setitem(inventory_module._SOURCES, "pair", read_pair)


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
        load_inventory(write_toml(tmp_path, text))


def test_the_aws_source_uses_only_public_names_of_the_inventory() -> None:
    """aws.py plugs in like any other source: no private helper, no Table internals."""
    tree = ast.parse((ROOT / "deployer" / "sources" / "aws.py").read_text())
    ours = ("deployer.config.inventory", "deployer.config.schema")
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in ours:
            assert not [a.name for a in node.names if a.name.startswith("_")]
        if isinstance(node, ast.Attribute):
            assert node.attr not in ("_data", "_seen"), ast.unparse(node)
