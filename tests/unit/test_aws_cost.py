"""A run's cost on EC2: the price APIs' answers parsed strictly, the spot price integrated over
each instance's time, and what `runs`, `status --json` and the report say, on moto's EC2.

What moto 5.2.6 answers and what it does not: its DescribeSpotPriceHistory gives one entry per
zone, $0.00001/h since 2006 (and ignores StartTime and EndTime), so a spot run's cost is
checked on it end to end; it has no Pricing API (GetProducts answers 404 "Not yet
implemented"), so the on-demand path is checked on a price list written here in the shape
AWS documents, handed in through botocore's Stubber (the request checked against the
service's model), and moto's 404 is checked to read as "cost unknown" with its words.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from deployer.api import render, runcost
from deployer.api.reportpage import write_report
from deployer.config.plan import make_plan
from deployer.results import runstore
from deployer.results.runs import HostRun
from deployer.sources import costs, load_inventory
from deployer.sources.aws import cost, ends, launch, pricing
from deployer.sources.aws.settings import AwsSettings
from deployer.up.records import run_facts
from tests.support.aws import cli, described, resolve_hosts, write_inventory

pytestmark = pytest.mark.names_tf(
    reason="records runs of inventories whose code is examples/digits on moto's EC2; starts no task"
)

RUN = "mnist-20261207T000000Z-c0st"
HOUR = 3600.0
MOTO_SPOT = 0.00001  # moto's one spot price, every zone, since 2006
GROUPS = """
[[aws.hosts]]
filters = { "tag:tfdeploy-job" = "mnist", "tag:tfdeploy-role" = "worker" }
tasks = [{ role = "worker" }]

[[aws.hosts]]
filters = { "tag:tfdeploy-job" = "mnist", "tag:tfdeploy-role" = "ps" }
tasks = [{ role = "ps" }]
"""
_LINUX_AMI: dict[str, str] = {}


def _launch(ec2: Any, role: str, *, spot: bool, kind: str = "g5.xlarge") -> str:
    """A Linux instance (moto's first Amazon image is a Windows one, which tfdeploy does not
    price)."""
    if "ami" not in _LINUX_AMI:
        images = ec2.describe_images(Owners=["amazon"])["Images"]
        _LINUX_AMI["ami"] = next(i["ImageId"] for i in images if i.get("Platform") != "windows")
    market = {"MarketType": "spot", "SpotOptions": {"SpotInstanceType": "one-time"}}
    reply = ec2.run_instances(
        ImageId=_LINUX_AMI["ami"],
        MinCount=1,
        MaxCount=1,
        InstanceType=kind,
        Placement={"AvailabilityZone": "us-east-1a"},
        TagSpecifications=[
            {
                "ResourceType": "instance",
                "Tags": [
                    {"Key": "tfdeploy-job", "Value": "mnist"},
                    {"Key": "tfdeploy-role", "Value": role},
                ],
            }
        ],
        **({"InstanceMarketOptions": market} if spot else {}),
    )
    return str(reply["Instances"][0]["InstanceId"])


def _record_run(tmp_path: Path, hours: float | None, *, began: float | None = None) -> float:
    """The run's facts as `up` writes them (records.run_facts over the discovered inventory),
    its outcome `hours` after its start (None: it runs); returns its start."""
    inventory = resolve_hosts(load_inventory(write_inventory(tmp_path, GROUPS)))
    plan = make_plan(inventory)
    launched = min(i.launched.timestamp() for i in inventory.instances)
    start = began if began is not None else launched
    runstore.write_facts(RUN, run_facts(plan, RUN, start, lambda s: s))
    if hours is None:
        runstore.write_outcome(RUN, {"outcome": "running"})
    else:
        runstore.write_outcome(RUN, {"outcome": "succeeded", "ended": start + hours * HOUR})
    return start


@pytest.fixture
def price_list() -> Iterator[list[dict[str, Any]]]:
    """The Pricing API as a Stubber over a real client: each response the test queues is
    checked against GetProducts' model, and the request's filters against what is expected."""
    import boto3
    from botocore.stub import Stubber

    client = boto3.client("pricing", region_name="us-east-1")
    stubber = Stubber(client)
    queued: list[dict[str, Any]] = []

    def make(profile: str | None) -> Any:
        for reply in queued:
            stubber.add_response("get_products", reply, _expected_request(reply.pop("_kind")))
        queued.clear()
        return client

    original = cost.CLIENTS
    cost.CLIENTS = cost.Clients(ec2=original.ec2, pricing=make)
    with stubber:
        yield queued
    cost.CLIENTS = original


def _expected_request(kind: str) -> dict[str, Any]:
    wanted = {**pricing.ON_DEMAND_ATTRIBUTES, "instanceType": kind, "regionCode": "us-east-1"}
    return {
        "ServiceCode": "AmazonEC2",
        "Filters": [{"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in wanted.items()],
        "FormatVersion": "aws_v1",
        "MaxResults": 100,
    }


def _product(kind: str, usd: str, **attributes: str) -> str:
    """One product of GetProducts' PriceList, in the shape AWS documents for EC2 (the product's
    attributes, its on-demand term with one hourly price dimension, a reserved term beside)."""
    sku = "SKU123ABC456DEF7"
    return json.dumps(
        {
            "product": {
                "productFamily": "Compute Instance",
                "attributes": {
                    "instanceType": kind,
                    "regionCode": "us-east-1",
                    "location": "US East (N. Virginia)",
                    "operatingSystem": "Linux",
                    "tenancy": "Shared",
                    "preInstalledSw": "NA",
                    "capacitystatus": "Used",
                    "licenseModel": "No License required",
                    "operation": "RunInstances",
                    **attributes,
                },
                "sku": sku,
            },
            "serviceCode": "AmazonEC2",
            "terms": {
                "OnDemand": {
                    f"{sku}.JRTCKXETXF": {
                        "priceDimensions": {
                            f"{sku}.JRTCKXETXF.6YS6EN2CT7": {
                                "unit": "Hrs",
                                "endRange": "Inf",
                                "description": f"${usd} per On Demand Linux {kind} Instance Hour",
                                "appliesTo": [],
                                "rateCode": f"{sku}.JRTCKXETXF.6YS6EN2CT7",
                                "beginRange": "0",
                                "pricePerUnit": {"USD": usd},
                            }
                        },
                        "sku": sku,
                        "effectiveDate": "2026-11-01T00:00:00Z",
                        "offerTermCode": "JRTCKXETXF",
                        "termAttributes": {},
                    }
                },
                "Reserved": {
                    f"{sku}.4NA7Y494T4": {
                        "priceDimensions": {
                            f"{sku}.4NA7Y494T4.6YS6EN2CT7": {
                                "unit": "Hrs",
                                "pricePerUnit": {"USD": "0.1000000000"},
                            }
                        }
                    }
                },
            },
            "version": "20261201000000",
            "publicationDate": "2026-12-01T00:00:00Z",
        }
    )


def _reply(kind: str, *products: str) -> dict[str, Any]:
    return {"_kind": kind, "FormatVersion": "aws_v1", "PriceList": list(products)}


# ---- the prices, parsed and integrated (pure) ---------------------------------------------------


def test_the_spot_price_in_force_at_the_start_then_each_change_is_integrated() -> None:
    t0 = 1.8e9
    history = [(t0 - 500, Decimal("1.0")), (t0 + 1800, Decimal("2.0")), (t0 + 7200, Decimal(9))]
    assert pricing.integrate(history, t0, t0 + HOUR) == Decimal("1.5")  # half an hour each
    assert pricing.integrate(history, t0 + 1800, t0 + 1800 + HOUR) == Decimal(2)
    assert pricing.integrate(history, t0, t0) == 0
    with pytest.raises(pricing.PriceUnknown, match="no price in force at the start"):
        pricing.integrate(history[1:], t0, t0 + HOUR)


def test_spot_history_entries_are_checked_and_other_zones_left_out() -> None:
    at = datetime(2026, 12, 1, tzinfo=UTC)

    def entry(price: object, zone: str = "us-east-1a", product: str = "Linux/UNIX") -> object:
        return {
            "InstanceType": "g5.xlarge",
            "AvailabilityZone": zone,
            "ProductDescription": product,
            "SpotPrice": price,
            "Timestamp": at,
        }

    vpc = entry("0.7", product="Linux/UNIX (Amazon VPC)")
    found = pricing.spot_prices(
        [entry("0.5"), entry("9", "us-east-1b"), vpc], "g5.xlarge", "us-east-1a"
    )
    assert found == [(at.timestamp(), Decimal("0.5"))]  # Linux/UNIX over its VPC name
    assert pricing.spot_prices([vpc], "g5.xlarge", "us-east-1a")[0][1] == Decimal("0.7")
    for bad in ("NaN", "-0.1", "Infinity", "1e400", "", 0.5, None):
        with pytest.raises(pricing.PriceUnknown):
            pricing.spot_prices([entry(bad)], "g5.xlarge", "us-east-1a")


def test_the_price_list_is_read_strictly() -> None:
    rate = pricing.parse_price_list(
        [_product("g5.xlarge", "1.0060000000")], "g5.xlarge", "us-east-1"
    )
    assert rate == pricing.Rate(Decimal("1.006"), "2026-12-01T00:00:00Z")
    dedicated = _product("g5.xlarge", "1.2", tenancy="Dedicated")  # not what was asked: left out
    other_region = _product("g5.xlarge", "1.3", regionCode="eu-west-1")
    listed = [dedicated, other_region, _product("g5.xlarge", "1.006")]
    assert pricing.parse_price_list(listed, "g5.xlarge", "us-east-1").usd_per_hour == Decimal(
        "1.006"
    )
    refused = {
        "several prices": [_product("g5.xlarge", "1.006"), _product("g5.xlarge", "1.1")],
        "no on-demand Linux price": [dedicated],
        "no JSON": ["{not json"],
        "no object": ["[1, 2]"],
        "not a finite number": [_product("g5.xlarge", "NaN")],
        "not a number": [_product("g5.xlarge", "1.0.0")],
        "out of bounds": [_product("g5.xlarge", "-1")],
        "too long": ["[" + " " * pricing.PRICE_ITEM_BYTES + "]"],
        "nested deeper": ["[" * 40 + "]" * 40],
    }
    for words, items in refused.items():
        with pytest.raises(pricing.PriceUnknown, match=words):
            pricing.parse_price_list(items, "g5.xlarge", "us-east-1")


def test_a_kept_cost_that_was_edited_is_not_taken() -> None:
    machine = costs.MachineCost(
        "i-0123456789abcdef0",
        "aws.hosts[0]",
        "g5.xlarge",
        "spot",
        "z",
        1.0,
        2.0,
        Decimal("0.5"),
        "spot price history",
    )
    kept = costs.RunCost((costs.GroupCost("aws.hosts[0]", (machine,)),), 3.0).to_json()
    assert costs.from_json(json.loads(json.dumps(kept))) == costs.RunCost(
        (costs.GroupCost("aws.hosts[0]", (machine,)),), 3.0
    )
    for edit in ("NaN", "0.5", None):
        changed = json.loads(json.dumps(kept))
        changed["groups"][0]["instances"][0]["usd"] = edit
        found = costs.from_json(changed)
        assert found is None or found.usd is None  # never a figure from a broken record
    assert costs.from_json({"groups": "x"}) is None


# ---- a run on moto's EC2 ---------------------------------------------------------------------


def test_a_spot_runs_cost_comes_from_the_price_history_and_is_kept(
    ec2: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    workers = [_launch(ec2, "worker", spot=True) for _ in range(2)]
    _launch(ec2, "ps", spot=True, kind="m5.large")
    began = _record_run(tmp_path, hours=2)
    found = runcost.run_cost(RUN, now=began + 3 * HOUR)
    assert found is not None and found.final and not found.running
    assert [g.group for g in found.groups] == ["aws.hosts[0]", "aws.hosts[1]"]
    workers_cost, ps_cost = found.groups
    assert {m.id for m in workers_cost.machines} == set(workers)
    assert workers_cost.describe() == "2 x g5.xlarge, spot"
    for m in (*workers_cost.machines, *ps_cost.machines):
        assert m.hours == pytest.approx(2, abs=1e-3)  # from launch to the run's end, not now
    assert _float(found.usd) == pytest.approx(3 * 2 * MOTO_SPOT, rel=1e-3)
    assert "spot price history, us-east-1a, as of " in workers_cost.sources[0]
    assert found.line().startswith("cost <$0.0001: aws.hosts[0] 2 x g5.xlarge, spot")
    # Kept: the next reader asks AWS nothing, and gets the same figure.
    assert runstore.read_cost(RUN).found is not None
    monkeypatch.setattr(cost, "CLIENTS", cost.Clients(ec2=_no_aws, pricing=_no_aws))
    assert runcost.run_cost(RUN, now=began + 30 * 24 * HOUR) == found


def _float(usd: Decimal | None) -> float | None:
    return None if usd is None else float(usd)


def _no_aws(*_: object) -> Any:
    raise AssertionError("AWS was asked")


def test_an_on_demand_run_is_priced_from_the_price_list(
    ec2: Any, tmp_path: Path, price_list: list[dict[str, Any]]
) -> None:
    _launch(ec2, "worker", spot=False)
    _launch(ec2, "ps", spot=False, kind="m5.large")
    price_list += [_reply("g5.xlarge", _product("g5.xlarge", "1.0060000000"))]
    price_list += [_reply("m5.large", _product("m5.large", "0.0960000000"))]
    began = _record_run(tmp_path, hours=None)  # running: so far
    found = runcost.run_cost(RUN, now=began + 1.5 * HOUR)
    assert found is not None and found.running and not found.final
    assert _float(found.usd) == pytest.approx(1.5 * (1.006 + 0.096), rel=1e-3)
    assert found.groups[0].sources == ("AWS price list, 2026-12-01",)
    assert found.cell().endswith(" so far")
    assert runstore.read_cost(RUN).found is None  # not final: not kept


def test_moto_has_no_price_list_so_an_on_demand_run_says_cost_unknown_and_no_partial_total(
    ec2: Any, tmp_path: Path
) -> None:
    _launch(ec2, "worker", spot=True)
    _launch(ec2, "ps", spot=False, kind="m5.large")
    began = _record_run(tmp_path, hours=1)
    found = runcost.run_cost(RUN, now=began + 2 * HOUR)
    assert found is not None and found.usd is None and not found.final
    spot, on_demand = found.groups
    assert _float(spot.usd) == pytest.approx(MOTO_SPOT, rel=1e-3)  # the spot group is priced
    assert on_demand.usd is None
    assert found.line() == (
        "cost unknown: the AWS price list: An error occurred (404) when calling the "
        "GetProducts operation: Not yet implemented"
    )
    assert runstore.read_cost(RUN).found is None  # asked again next time


def test_an_instance_ec2_forgot_is_priced_from_the_end_this_machine_kept(
    ec2: Any, tmp_path: Path
) -> None:
    _launch(ec2, "worker", spot=True)
    _launch(ec2, "ps", spot=True)
    began = _record_run(tmp_path, hours=4)
    facts = runstore.read_facts(RUN).fields
    gone = "i-0123456789abcdef0"  # as if EC2 no longer listed it: moto never knew it
    forgotten = {**facts["machines"]["instances"][1], "id": gone}
    facts["machines"]["instances"].append(forgotten)
    facts["hosts"].append({"name": gone, "address": "10.0.0.9"})
    runstore.write_facts(RUN, facts)
    found = runcost.run_cost(RUN, now=began + 5 * HOUR)
    assert found is not None and found.usd is None
    assert found.unknown == (
        f"EC2 no longer lists {gone} (it lists a terminated instance for about an hour) and "
        "this machine did not see when it ended"
    )
    ends.note({gone: forgotten_launch(forgotten) + HOUR})  # `down` terminated it, say
    found = runcost.run_cost(RUN, now=began + 5 * HOUR)
    assert found is not None and found.usd is not None
    [priced] = [m for g in found.groups for m in g.machines if m.id == gone]
    assert priced.hours == pytest.approx(1, abs=1e-3)


def forgotten_launch(document: dict[str, Any]) -> float:
    return datetime.fromisoformat(document["launched"]).timestamp()


def test_an_end_tfdeploy_caused_or_ec2_showed_is_kept(ec2: Any, tmp_path: Path) -> None:
    ours = _launch(ec2, "worker", spot=True)
    theirs = _launch(ec2, "ps", spot=True)
    began = _record_run(tmp_path, hours=3)
    launch.terminate(AwsSettings(region="us-east-1", profile=None, groups=()), [ours])
    assert ours in ends.known()  # noted as tfdeploy terminated it
    ec2.terminate_instances(InstanceIds=[theirs])  # by hand: EC2 says when, for about an hour
    found = runcost.run_cost(RUN, now=began + 4 * HOUR)
    assert found is not None and found.usd is not None
    assert theirs in ends.known()  # seen in EC2's StateTransitionReason, and kept
    for m in (m for g in found.groups for m in g.machines):
        assert m.hours < 0.1  # each ended at once, not at the run's end


def test_offline_runs_says_cost_unknown_and_why(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """No moto, no credentials: `runs` lists the run, and its cost is unknown with boto's
    reason; nothing crashes and nothing is guessed."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("TFDEPLOY_STATE_DIR", str(tmp_path / "state"))
    document = {
        "id": "i-0123456789abcdef0",
        "type": "g5.xlarge",
        "zone": "us-east-1a",
        "launched": "2026-12-07T10:00:00+00:00",
        "group": "aws.hosts[0]",
        "spot": True,
        "region": "us-east-1",
        "profile": None,
    }
    facts = {"job": "mnist", "began": 1.8e9, "hosts": [{"name": document["id"], "address": "x"}]}
    runstore.write_facts(RUN, {**facts, "machines": {"instances": [document]}})  # type: ignore[typeddict-item]
    runstore.write_outcome(RUN, {"outcome": "succeeded", "ended": 1.8e9 + HOUR})
    code, out, err = cli("runs")
    assert code == 0, err
    line = next(line for line in out.splitlines() if line.startswith(f"run {RUN}: cost"))
    why = "EC2 describe_instances in us-east-1: Unable to locate credentials"
    assert line == f"run {RUN}: cost unknown: {why}"
    code, out, _ = cli("runs", "--json")
    [listed] = json.loads(out)["runs"]
    assert listed["cost"]["usd"] is None
    assert listed["cost"]["unknown"].endswith("Unable to locate credentials")


def test_a_run_on_static_hosts_asks_aws_nothing_and_shows_no_cost(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("TFDEPLOY_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setattr(cost, "CLIENTS", cost.Clients(ec2=_no_aws, pricing=_no_aws))
    runstore.write_facts(RUN, {"job": "mnist", "began": 1.8e9, "machines": {}, "hosts": []})
    runstore.write_outcome(RUN, {"outcome": "succeeded", "ended": 1.8e9 + HOUR})
    assert runcost.run_cost(RUN) is None
    code, out, _ = cli("runs")
    assert code == 0 and "cost" not in out


# ---- what a user sees --------------------------------------------------------------------------


def test_runs_status_json_and_the_report_show_the_cost_with_its_source(
    ec2: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    worker = _launch(ec2, "worker", spot=True)
    ps = _launch(ec2, "ps", spot=True)
    began = _record_run(tmp_path, hours=2)
    later = began + 3 * HOUR
    monkeypatch.setattr(runcost.time, "time", lambda: later)
    code, out, err = cli("runs")
    assert code == 0, err
    print(out)
    assert any(line.strip("┃ ").endswith("┃ cost") for line in out.splitlines())  # a column
    line = next(line for line in out.splitlines() if line.startswith(f"run {RUN}: cost"))
    assert re.fullmatch(
        rf"run {RUN}: cost <\$0\.0001: aws\.hosts\[0\] 1 x g5\.xlarge, spot <\$0\.0001; "
        r"aws\.hosts\[1\] 1 x g5\.xlarge, spot <\$0\.0001 \(spot price history, us-east-1a, "
        r"as of \d{4}-\d\d-\d\d \d\d:\d\d UTC\)",
        line,
    ), line
    # status --json: the hosts' runs (one per host) and the cost of each run, by run id
    host_runs = [HostRun(host, RUN, "mnist", began, True, ()) for host in (worker, ps)]
    costs_now = runcost.status_costs(host_runs, [])
    document = json.loads(render.status_json(host_runs, costs=costs_now))
    print(json.dumps(document["costs"], indent=2))
    kept = document["costs"][RUN]
    assert kept["usd"] == pytest.approx(2 * 2 * float(MOTO_SPOT), rel=1e-3) and kept["final"]
    assert [g["group"] for g in kept["groups"]] == ["aws.hosts[0]", "aws.hosts[1]"]
    [instance] = kept["groups"][0]["instances"]
    assert instance["id"] == worker and instance["market"] == "spot"
    assert instance["source"].startswith("spot price history, us-east-1a, as of ")
    out_text = io.StringIO()
    Console(file=out_text, width=200, color_system=None).print(
        render.status_table(host_runs, costs=costs_now)
    )
    assert "  cost <$0.0001: aws.hosts[0] 1 x g5.xlarge, spot" in out_text.getvalue()
    page = write_report(RUN).read_text()
    assert "<h2>Cost</h2>" in page and worker in page and "spot price history, us-east-1a" in page


def test_status_prices_a_run_whose_up_kept_no_facts_yet_from_the_instances_found_now(
    ec2: Any, tmp_path: Path
) -> None:
    worker = _launch(ec2, "worker", spot=True)
    _launch(ec2, "ps", spot=True)
    inventory = resolve_hosts(load_inventory(write_inventory(tmp_path, GROUPS)))
    [launched] = [i["LaunchTime"].timestamp() for i in described(ec2, [worker])]
    running = HostRun(worker, RUN, "mnist", launched, False, (), starting=True)  # up goes on
    found = runcost.status_costs([running], inventory.tables, now=launched + HOUR)
    assert found[RUN].running and [g.group for g in found[RUN].groups] == ["aws.hosts[0]"]
    assert _float(found[RUN].usd) == pytest.approx(MOTO_SPOT, rel=1e-3)  # the worker's hour alone
