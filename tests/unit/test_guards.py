"""The run's guards (docs/up.md, "Guards"): `[aws] max_cost` and `[job] gpu_idle_stop`.

The rules (remote/guards.py) as tables; the keys as the inventory reads them; the cost priced
at `up` on moto's EC2 (its spot price, $0.00001/h; no Price List API, so an on-demand cap is
refused as cost unknown); the live view's GPU numbers from the real `gpus` op over the
nvidia-smi stand-in; and a real keeper and warden on this machine (the agent's `keep` op,
127.0.0.1) that stop a run for each guard, with the stand-in on the warden's PATH. The kept
detached run on the lab, and `max_cost` stopping an attached `up` on moto's instances:
tests/integration/test_guards.py.
"""

from __future__ import annotations

import dataclasses
import json
import secrets
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from deployer.config.model import GpuIdleStop
from deployer.config.plan import make_plan
from deployer.config.sources import SourceTable
from deployer.core.errors import InventoryError, UsageError
from deployer.hosts.gpus import GpuMonitor, GpuReport
from deployer.sources import load_inventory
from deployer.sources.costs import GroupCost, MachineCost, RunCost
from deployer.up.guards import arm, hourly
from deployer.watch.guards import run_gpus, verdict
from remote import guards
from remote.guards import CostCap, GpuIdle, Guards
from tests.support.agent import new_run, ok, raw_call, start, wait_for
from tests.support.aws import REGION, resolve_hosts
from tests.support.gpus import FAKE, STATE_NAME, state
from tests.support.helpers import JOB, plan, write_toml

MOTO_SPOT = 0.00001  # moto's one spot price, every zone, since 2006 (USD an hour)

# -- the rules --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "said"),
    [
        (0, None),
        (3599, None),
        (3600, "its cost reached max_cost $25.00 (spent $25.00)"),
        (7200, "its cost reached max_cost $25.00 (spent $29.00)"),
    ],
)
def test_the_cost_cap_is_reached_when_spent_plus_rate_times_time_reaches_it(
    seconds: float, said: str | None
) -> None:
    assert CostCap(max_usd=25.0, spent_usd=21.0, usd_per_hour=4.0).reached(seconds) == said


def test_small_amounts_keep_their_digits_in_the_words() -> None:
    """A stand-in's spot price is fractions of a cent: `<$0.0001` would say nothing."""
    said = CostCap(5e-8, 4e-8, MOTO_SPOT).reached(3600)
    assert said == "its cost reached max_cost $0.00000005 (spent $0.00001)"
    assert [guards.usd(a) for a in (0.5, 0.0413, 1234.5, 0.9999)] == [
        "$0.50",
        "$0.0413",
        "$1,234.50",
        "$1.00",
    ]


IDLE = GpuIdle(below=5, minutes=0.5)  # 30 s


@pytest.mark.parametrize(
    ("looks", "stops_at"),
    [
        # (time, every GPU's utilization) in order; the first look at which it stops, or None
        ([(0, [0, 4]), (29, [1, 0]), (30, [0, 0])], 30),
        ([(0, [0, 0]), (20, [0, 5]), (30, [0, 0]), (59, [0, 0]), (60, [0, 0])], 60),
        ([(0, [0, 0]), (20, None), (30, [0, 0]), (60, [0, 0])], 60),  # a GPU without a number
        ([(0, []), (100, []), (1000, [])], None),  # a run with no GPU numbers: never
        ([(0, [99]), (100, [99])], None),
    ],
    ids=["idle", "a-gpu-above-the-floor-restarts-it", "no-number-restarts-it", "none", "busy"],
)
def test_the_idle_window_counts_only_while_every_gpu_is_below_the_floor(
    looks: list[tuple[float, list[float] | None]], stops_at: float | None
) -> None:
    since, stopped = None, None
    for now, utilizations in looks:
        since = IDLE.since(since, utilizations, now)
        if IDLE.reached(since, now):
            stopped = now
            break
    assert stopped == stops_at


def test_guards_look_at_the_runs_own_gpus_and_say_which_guard_stopped_it() -> None:
    run = Guards(None, IDLE, [("h1", 0), ("h2", 1)], start=0.0)
    other_gpu_busy = {"h1": {0: 0.0, 1: 100.0}, "h2": {0: 100.0, 1: 2.0}}
    assert run.look(0, other_gpu_busy) is None
    assert run.look(30, other_gpu_busy) == (
        "gpu_idle_stop",
        "every GPU of the run below 5 % for 30 s",
    )
    missing = Guards(None, IDLE, [("h1", 0), ("h2", 1)], start=0.0)
    assert missing.look(0, {"h1": {0: 0.0}}) is None
    assert missing.look(100, {"h1": {0: 0.0}}) is None  # h2 said nothing: no idle time
    assert Guards(None, IDLE, [], start=0.0).look(1e6, {"h1": {0: 0.0}}) is None
    priced = Guards(CostCap(1.0, 0.5, 1.0), IDLE, [], start=100.0)
    assert priced.look(1899, {}) is None
    assert priced.look(1900, {}) == ("max_cost", "its cost reached max_cost $1.00 (spent $1.00)")


def test_the_keepers_plan_carries_the_cost_as_it_stands_at_the_hand_over() -> None:
    run = Guards(CostCap(10.0, 1.0, 3.6), GpuIdle(5, 30), [("h1", 0)], start=50.0)
    told = json.loads(json.dumps(run.plan(now=1050.0)))  # 1,000 s later: $1 more
    assert told == {
        "max_cost": {"max_usd": 10.0, "spent_usd": 2.0, "usd_per_hour": 3.6},
        "gpu_idle_stop": {"below": 5, "minutes": 30},
    }
    kept = Guards.from_plan(told, [("h1", 0)], start=0.0)
    assert (kept.cost, kept.idle) == (CostCap(10.0, 2.0, 3.6), GpuIdle(5, 30))
    for wrong in ({"max_cost": {"max_usd": 1}}, {"gpu_idle_stop": {"below": -1, "minutes": 1}}):
        with pytest.raises(ValueError, match="guards"):
            Guards.from_plan(wrong, [], 0.0)


def test_a_wardens_gpu_sample_is_read_strictly() -> None:
    assert guards.sample_of({"age": 1, "utilization": [[0, 3], [1, 50.5]]}) == {0: 3.0, 1: 50.5}
    junk = [[True, 0], [2, 101], [3, "0"], [4], "x", [2.5, 0], [-1, 0]]
    assert guards.sample_of({"utilization": junk}) == {}
    assert guards.sample_of(None) is None
    assert guards.sample_of({"utilization": "0"}) is None


def test_the_keepers_gpu_samples_are_dated_by_their_age_and_go_stale() -> None:
    """A warden answers its last sample with its age: dated on the keeper's clock, it counts
    for 30 s (GPU_STALE_S); a reply without one (no nvidia-smi) forgets the host's last."""
    samples = guards.GpuSamples()
    samples.note("h1", {"age": 5, "utilization": [[0, 0]]}, now=100.0)
    samples.note("h2", {"age": 0, "utilization": [[0, 1]]}, now=100.0)
    assert samples.fresh(125.0) == {"h1": {0: 0.0}, "h2": {0: 1.0}}
    assert samples.fresh(126.0) == {"h2": {0: 1.0}}  # taken at 95: 31 s old
    samples.note("h2", None, now=127.0)
    samples.note("h1", {"age": -1, "utilization": [[0, 0]]}, now=127.0)
    assert samples.fresh(127.0) == {}


# -- the keys ------------------------------------------------------------------------------------

ONE_HOST = '[[hosts]]\naddress = "192.0.2.1"\ngpus = 2\ntasks = [{ role = "worker" }]\n'


def test_gpu_idle_stop_is_read_from_job(tmp_path: Path) -> None:
    read = plan(tmp_path, JOB + "gpu_idle_stop = { below = 5, minutes = 30 }\n" + ONE_HOST)
    assert read.job.gpu_idle_stop == GpuIdleStop(below=5.0, minutes=30.0)
    assert plan(tmp_path, JOB + ONE_HOST).job.gpu_idle_stop is None


@pytest.mark.parametrize(
    ("table", "key", "said"),
    [
        ("{ below = 5 }", "job.gpu_idle_stop.minutes", "is missing: e.g. gpu_idle_stop = {"),
        ("{ below = 0, minutes = 1 }", "job.gpu_idle_stop.below", "above 0 and at most 100"),
        ("{ below = 101, minutes = 1 }", "job.gpu_idle_stop.below", "above 0 and at most 100"),
        ("{ below = 5, minutes = 0 }", "job.gpu_idle_stop.minutes", "more than 0 minutes"),
        ("{ below = 5, minuts = 30 }", "job.gpu_idle_stop.minuts", "unknown key"),
        ("{ below = '5', minutes = 30 }", "job.gpu_idle_stop.below", "expected a number"),
        ("30", "job.gpu_idle_stop", "expected a table"),
    ],
)
def test_a_wrong_gpu_idle_stop_names_its_key_and_the_fix(
    tmp_path: Path, table: str, key: str, said: str
) -> None:
    path = write_toml(tmp_path, JOB + f"gpu_idle_stop = {table}\n" + ONE_HOST)
    with pytest.raises(InventoryError) as info:
        load_inventory(path)
    assert (info.value.path, info.value.key) == (str(path), key)
    assert said in info.value.expected, info.value


AWS = (
    f'[aws]\nregion = "{REGION}"\nEXTRA\n[[aws.hosts]]\n'
    'filters = { "tag:tfdeploy-job" = "capped" }\ntasks = [{ role = "worker" }]\n'
)


@pytest.mark.parametrize(
    ("value", "said"),
    [("0", "above 0 (e.g. max_cost = 25.0)"), ("-1", "at least 0"), ('"25"', "a number")],
)
def test_a_wrong_max_cost_names_its_key(tmp_path: Path, value: str, said: str) -> None:
    path = write_toml(tmp_path, JOB + AWS.replace("EXTRA", f"max_cost = {value}"))
    with pytest.raises(InventoryError) as info:
        load_inventory(path)
    assert (info.value.path, info.value.key) == (str(path), "aws.max_cost")
    assert said in info.value.expected, info.value


# -- priced at `up`, on moto ----------------------------------------------------------------


def _launch(ec2: Any, *, spot: bool) -> str:
    """A Linux instance (moto's first Amazon image is Windows, which tfdeploy does not price)."""
    images = ec2.describe_images(Owners=["amazon"])["Images"]
    image = next(i["ImageId"] for i in images if i.get("Platform") != "windows")
    market = {"MarketType": "spot", "SpotOptions": {"SpotInstanceType": "one-time"}}
    reply = ec2.run_instances(
        ImageId=image,
        MinCount=1,
        MaxCount=1,
        InstanceType="g5.xlarge",
        Placement={"AvailabilityZone": "us-east-1a"},
        TagSpecifications=[
            {"ResourceType": "instance", "Tags": [{"Key": "tfdeploy-job", "Value": "capped"}]}
        ],
        **({"InstanceMarketOptions": market} if spot else {}),
    )
    return str(reply["Instances"][0]["InstanceId"])


def _capped_plan(tmp_path: Path, extra: str = "max_cost = 1.0") -> Any:
    path = write_toml(tmp_path, JOB + AWS.replace("EXTRA", extra))
    return make_plan(resolve_hosts(load_inventory(path)))


def test_max_cost_is_priced_at_up_from_the_spot_price_history(ec2: Any, tmp_path: Path) -> None:
    """Two spot instances launched after the run began: spent moto's price for each one's
    seconds since its launch, and each costs the run moto's price an hour from now on."""
    for _ in range(2):
        _launch(ec2, spot=True)
    capped = _capped_plan(tmp_path)
    now = time.time() + 60
    armed = arm(capped, now - 600, 42.0, detached=False, wall=now)
    assert armed is not None and armed.cost is not None and armed.idle is None
    assert armed.start == 42.0 and armed.cost.max_usd == 1.0
    seconds = sum(now - i.launched.timestamp() for i in capped.inventory.instances)
    assert armed.cost.spent_usd == pytest.approx(seconds / 3600 * MOTO_SPOT, rel=1e-6)
    assert armed.cost.usd_per_hour == pytest.approx(2 * MOTO_SPOT, rel=1e-6)


def test_max_cost_whose_cost_cannot_be_known_is_refused_before_anything_starts(
    ec2: Any, tmp_path: Path
) -> None:
    """On-demand prices come from the Price List API, which moto lacks (404): the cap cannot be
    kept, so `up` refuses, naming the key, why, and the fix."""
    _launch(ec2, spot=False)
    with pytest.raises(InventoryError) as info:
        arm(_capped_plan(tmp_path), time.time() - 60, 0.0, detached=False)
    assert info.value.key == "aws.max_cost"
    assert "cannot be kept: the run's cost is unknown (" in info.value.expected
    assert "nothing was started" in info.value.expected
    assert info.value.hint is not None and "pricing:GetProducts" in info.value.hint


def test_a_detached_run_without_a_keeper_cannot_have_a_guard(tmp_path: Path) -> None:
    """Nobody would hold it: refused before anything starts."""
    unkept = plan(
        tmp_path,
        JOB + "keeper = false\ngpu_idle_stop = { below = 5, minutes = 30 }\n" + ONE_HOST,
    )
    with pytest.raises(UsageError, match="gpu_idle_stop needs someone to hold the run"):
        arm(unkept, time.time(), 0.0, detached=True)
    assert arm(unkept, time.time(), 0.0, detached=False) is not None
    assert arm(plan(tmp_path, JOB + ONE_HOST), time.time(), 0.0, detached=True) is None


def test_the_hourly_rate_counts_the_instances_that_still_run() -> None:
    def machine(ident: str, usd: str, start: float, end: float) -> MachineCost:
        return MachineCost(ident, "g", "t", "spot", "z", start, end, Decimal(usd))

    running = machine("i-1", "2", 1, 7201)  # $2 over 2 h: $1 an hour
    ended = machine("i-2", "5", 1, 3601)  # ended an hour ago: nothing more
    cost = RunCost((GroupCost("g", (running, ended)),), priced_at=7201)
    assert hourly(cost) == 1
    fresh = RunCost((GroupCost("g", (machine("i-3", "0", 7201, 7201),)),), priced_at=7201)
    assert hourly(fresh) == "i-3 has run no time of the run yet, so its rate is unknown"


def test_max_cost_is_the_lowest_cap_of_the_inventorys_sources(tmp_path: Path) -> None:
    from deployer.up.guards import max_cost

    base = plan(tmp_path, JOB + ONE_HOST)
    tables = tuple(SourceTable("t", (), (), "k", max_cost=c) for c in (None, 9.0, 3.0))
    assert max_cost(make_plan(dataclasses.replace(base.inventory, tables=tables))) == 3.0


# -- the live view's GPU numbers (attached `up`) -------------------------------------------


def _gpus_reply(bin_dir: Path) -> dict[str, Any]:
    """The real agent's `gpus` op, with the stand-in first on its PATH."""
    request = json.dumps({"v": 1, "op": "gpus", "workdir": "/tmp"}).encode()
    return raw_call(request, env={"PATH": f"{bin_dir}:/usr/bin:/bin"})


def test_an_attached_ups_idle_guard_reads_the_live_views_gpu_numbers(tmp_path: Path) -> None:
    """The watch's own guard (deployer/watch/guards.py) over what GpuMonitor keeps of the
    agent's `gpus` replies: only the GPUs the run's tasks were given count."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").symlink_to(FAKE)
    idle = plan(
        tmp_path,
        JOB
        + "gpu_idle_stop = { below = 5, minutes = 0.5 }\n"
        + '[[hosts]]\nname = "g"\naddress = "192.0.2.1"\ngpus = 4\n'
        + 'tasks = [{ role = "worker", gpus = [1, 2] }]\n',
    )
    assert run_gpus(idle) == [("g", 1), ("g", 2)]
    armed = arm(idle, time.time(), 0.0, detached=False)
    assert armed is not None
    monitor = GpuMonitor({"g"})
    (bin_dir / STATE_NAME).write_text(state(4, util=[90, 0, 3, 90]))  # GPUs 0 and 3: not its
    monitor.update({"g": GpuReport.from_json(_gpus_reply(bin_dir))})
    assert verdict(armed, 0.0, monitor, idle) is None
    assert verdict(armed, 30.0, monitor, idle) == "every GPU of the run below 5 % for 30 s"
    (bin_dir / STATE_NAME).write_text(state(4, util=[0, 0, 7, 0]))
    monitor.update({"g": GpuReport.from_json(_gpus_reply(bin_dir))})
    assert verdict(armed, 31.0, monitor, idle) is None  # GPU 2 went above: the window restarts
    assert verdict(armed, 1000.0, GpuMonitor(set()), idle) is None  # no numbers: never


# -- a real keeper and warden on this machine ---------------------------------------------------


def _keep(workdir: Path, run_id: str, guarded: dict[str, Any], path: str = "") -> None:
    """The run's warden on 127.0.0.1 and its keeper, started by the agent's `keep` op as a
    hand-over does (with `path` first on their PATH), its task holding GPU 0."""
    env = {"PATH": f"{path}:/usr/bin:/bin"} if path else None
    secret = secrets.token_hex(32)

    def keep(**fields: Any) -> dict[str, Any]:
        request = {"v": 1, "op": "keep", "workdir": str(workdir), "run_id": run_id, **fields}
        return ok(raw_call(json.dumps(request).encode(), env=env))

    port = keep(action="warden", secret=secret, address="127.0.0.1")["port"]
    task = {"name": "worker:0", "host": "local", "awaited": True, "serves": False}
    plan_ = {
        "hosts": [{"name": "local", "address": "127.0.0.1", "port": port}],
        "tasks": [{**task, "evaluator": False, "restartable": True, "wave": 0, "gpus": [0]}],
        "policy": {"on_failure": "restart-job", "max_restarts": 3, "stop_grace": 1},
        "job": "demo",
        "interval": 0.2,
        "loss_after": 30,
        "guards": guarded,
    }
    keep(action="keeper", secret=secret, plan=plan_)


def _kept_end(workdir: Path, run_id: str) -> dict[str, Any]:
    """The keeper's record once it ended the run."""
    [record] = workdir.glob(f"hosts/*/runs/{run_id}/keeper.json")

    def ended() -> dict[str, Any] | None:
        events = json.loads(record.read_text())["events"]
        ended: dict[str, Any] | None = events[-1].get("ended")
        return ended

    return wait_for(ended, timeout=30, step=0.1)  # type: ignore[no-any-return]


def _runs(workdir: Path) -> list[dict[str, Any]]:
    request = json.dumps({"v": 1, "op": "runs", "workdir": str(workdir)}).encode()
    return ok(raw_call(request))["runs"]  # type: ignore[no-any-return]


def _started(workdir: Path, run_id: str) -> None:
    new_run(workdir, run_id)
    start(workdir, {"name": "worker:0", "command": "sleep 120", "env": {}}, run_id=run_id)


@pytest.mark.timeout(60)
def test_a_keeper_stops_a_run_whose_cost_reaches_max_cost(workdir: Path, run_id: str) -> None:
    """Handed over at $0.99 of $1.00, at $36 an hour: a second later the keeper stops every
    task, ends the run `stopped` with the guard's words, and the runs op says why."""
    _started(workdir, run_id)
    _keep(workdir, run_id, {"max_cost": {"max_usd": 1, "spent_usd": 0.99, "usd_per_hour": 36}})
    ended = _kept_end(workdir, run_id)
    assert ended["outcome"] == "stopped", ended
    assert ended["why"].startswith("its cost reached max_cost $1.00 (spent $1.0"), ended
    [run] = _runs(workdir)
    assert run["guard_stop"] == ended["why"]
    [task] = run["tasks"]
    assert (task["state"], task["reason"]) == ("exited", "stopped"), task
    wait_for(lambda: not _runs(workdir)[0]["kept"], timeout=15)  # keeper and warden left


@pytest.mark.timeout(60)
def test_a_keeper_stops_a_run_whose_gpus_sit_below_the_floor_for_the_window(
    workdir: Path, run_id: str, tmp_path: Path
) -> None:
    """The warden samples the nvidia-smi stand-in (0 % on the run's GPU 0; GPU 1, busy, is not
    the run's); after the 1.2 s window the keeper stops the run and says so."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").symlink_to(FAKE)
    (bin_dir / STATE_NAME).write_text(state(2, util=[0, 100]))
    _started(workdir, run_id)
    _keep(workdir, run_id, {"gpu_idle_stop": {"below": 5, "minutes": 0.02}}, path=str(bin_dir))
    ended = _kept_end(workdir, run_id)
    assert ended == {
        "outcome": "stopped",
        "why": "every GPU of the run below 5 % for 1 s",
        "attempt": 0,
    }
    [run] = _runs(workdir)
    assert run["guard_stop"] == ended["why"] and run["restarts"] == 0


def test_a_keeper_refuses_a_plan_with_broken_guards(workdir: Path, run_id: str) -> None:
    """Checked over SSH when it is handed over, not found by a keeper no one watches."""
    _started(workdir, run_id)
    request = {
        "v": 1,
        "op": "keep",
        "workdir": str(workdir),
        "run_id": run_id,
        "action": "keeper",
        "secret": secrets.token_hex(32),
        "plan": {
            "hosts": [],
            "tasks": [],
            "policy": {"on_failure": "teardown"},
            "guards": {"max_cost": {"max_usd": "ten"}},
        },
    }
    reply = raw_call(json.dumps(request).encode())
    assert reply["ok"] is False and "guards.max_cost needs the numbers" in reply["error"], reply
