"""The `[slurm]` source without a cluster: the table's keys and errors, what tfdeploy hands
sbatch, and Slurm's answers read from output captured on the lab's Slurm 22.05.8 (Debian 12).

A changed output form must be an UnreadableOutput naming the command, never a wrong state.
The cluster itself is exercised in tests/integration/test_slurm.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from deployer.core.errors import InventoryError
from deployer.sources import load_inventory
from deployer.sources.slurm import batch
from deployer.sources.slurm.allocation import waiting_line
from deployer.sources.slurm.outputs import (
    QUEUE_FORMAT,
    JobState,
    UnreadableOutput,
    expand_hostlist,
    limit_seconds,
    output_seconds,
    parse_granted_gpus,
    parse_nodes,
    parse_partition,
    parse_queue,
    parse_submitted,
    say_duration,
)
from deployer.sources.slurm.settings import SlurmSettings
from tests.support.aws import cli
from tests.support.slurm_outputs import BASE, JOB_DETAIL, NODES, PARTITION

ROOT = Path(__file__).resolve().parents[2]
SQUEUE = f"squeue -h -t all -j 1 -o '{QUEUE_FORMAT}'"

# ---- output captured from slurmctld 22.05.8 on the lab ----------------------------------------

QUEUE = """\
8|CANCELLED|0:52|4:08|2|gpu|h2-ec7e,h3-ec7e|(null)|None
20|PENDING|0:00|5:00|2|gpu||(null)|Resources
21|PENDING|0:00|5:00|1|gpu||(null)|Priority
22|PENDING|0:00|5:00|3|gpu||(null)|PartitionNodeLimit
19|RUNNING|0:28|9:32|2|gpu|h2-ec7e,h3-ec7e|tfdeploy-request:nodes=2|None
"""


def test_squeue_lines_are_read_into_states_durations_and_reasons() -> None:
    jobs = {j.id: j for j in parse_queue(QUEUE, SQUEUE)}
    assert jobs["19"].state is JobState.RUNNING and jobs["19"].nodelist == "h2-ec7e,h3-ec7e"
    assert (jobs["19"].elapsed, jobs["19"].left, jobs["19"].nodes) == (28, 572, 2)
    assert jobs["20"].state.waiting and jobs["20"].reason == "Resources"
    assert jobs["20"].nodelist == ""  # pending: no node yet
    assert jobs["22"].reason == "PartitionNodeLimit"
    assert jobs["8"].state.ended and not jobs["8"].state.waiting


def test_a_reason_with_spaces_and_commas_is_kept_whole() -> None:
    line = "7|PENDING|0:00|1-00:00:00|2|gpu||(null)|ReqNodeNotAvail, UnavailableNodes:bh[2-3]\n"
    (job,) = parse_queue(line, SQUEUE)
    assert job.reason == "ReqNodeNotAvail, UnavailableNodes:bh[2-3]"
    assert job.left == 86400


@pytest.mark.parametrize(
    "line,problem",
    [
        ("19 RUNNING 0:28 9:32 2 gpu h2 None", "expected 9 fields"),  # another -o form
        ("19|RUNNINGISH|0:28|9:32|2|gpu|h2||None", "unknown job state 'RUNNINGISH'"),
        ("19|RUNNING|28s|9:32|2|gpu|h2||None", "a duration '28s'"),
        ("19|RUNNING|0:28|9:32|two|gpu|h2||None", "a node count 'two'"),
        ("job19|RUNNING|0:28|9:32|2|gpu|h2||None", "a job id 'job19'"),
    ],
)
def test_an_squeue_line_of_another_form_is_an_error_naming_the_command(
    line: str, problem: str
) -> None:
    with pytest.raises(UnreadableOutput) as info:
        parse_queue(line, SQUEUE)
    assert info.value.command == SQUEUE
    assert problem in info.value.message and SQUEUE in info.value.message


def test_granted_gpus_are_read_per_node_from_the_job_detail() -> None:
    granted = parse_granted_gpus(JOB_DETAIL, "scontrol", ["h2-ec7e", "h3-ec7e"])
    assert granted == {"h2-ec7e": (0,), "h3-ec7e": (0,)}
    typed = "JobId=7 Nodes=bh[2-3] CPU_IDs=0-1 Mem=0 GRES=gpu:a100:2(IDX:2-3)"
    assert parse_granted_gpus(typed, "scontrol", ["bh2", "bh3"]) == {"bh2": (2, 3), "bh3": (2, 3)}
    with pytest.raises(UnreadableOutput, match="no JobId="):
        parse_granted_gpus("slurm_load_jobs error", "scontrol show job -d -o 7", ["bh2"])


def test_nodes_and_partitions_are_read_from_scontrol_one_line_records() -> None:
    nodes = parse_nodes(NODES, "scontrol show node")
    assert [(n.name, n.address, n.state) for n in nodes.values()] == [
        ("h2-ec7e", "10.77.16.12", "MIXED"),
        ("h3-ec7e", "10.77.16.13", "MIXED"),
    ]
    part = parse_partition(PARTITION, "scontrol show partition gpu -o")
    assert (part.name, part.total_nodes, part.max_nodes, part.max_time) == ("gpu", 2, None, 14400)
    with pytest.raises(UnreadableOutput, match="no NodeAddr="):
        parse_nodes("NodeName=bh2 State=IDLE", "scontrol show node bh2 -o")


def test_sbatch_parsable_gives_the_job_id_or_an_error() -> None:
    assert parse_submitted("17\n", "sbatch") == "17"
    assert parse_submitted("17;cluster\n", "sbatch") == "17"
    with pytest.raises(UnreadableOutput, match="sbatch"):
        parse_submitted("Submitted batch job 17\n", "sbatch")


@pytest.mark.parametrize(
    "text,names",
    [
        ("bh[2-3]", ["bh2", "bh3"]),
        ("h2-ec7e,h3-ec7e", ["h2-ec7e", "h3-ec7e"]),
        ("gpu[01-02,07],cpu5", ["gpu01", "gpu02", "gpu07", "cpu5"]),
        ("n[8-10]", ["n8", "n9", "n10"]),
        ("rack[1-2]-n[01-02]", ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]),
    ],
)
def test_hostlists_expand_in_order(text: str, names: list[str]) -> None:
    assert expand_hostlist(text) == names


def test_durations_as_slurm_reads_and_prints_them() -> None:
    assert [limit_seconds(w) for w in ("90", "10:30", "02:00:00", "1-00", "1-02:03")] == [
        5400,
        630,
        7200,
        86400,
        93780,
    ]
    assert limit_seconds("2h") is None
    assert [output_seconds(w) for w in ("0:05", "9:59", "1:00:00", "2-01:00:00")] == [
        5,
        599,
        3600,
        176400,
    ]
    assert [say_duration(s) for s in (40, 100, 7500)] == ["40s", "1m40s", "2h05m"]


# ---- the [slurm] table ---------------------------------------------------------------------


def _settings(tmp_path: Path, extra: str = "", group: str = "") -> SlurmSettings:
    path = tmp_path / "inv.toml"
    path.write_text(BASE.format(extra=extra, group=group))
    (source,) = load_inventory(path).pending
    settings: SlurmSettings = source.settings  # type: ignore[attr-defined]
    return settings


def test_the_table_reads_into_settings_with_its_defaults(tmp_path: Path) -> None:
    s = _settings(tmp_path)
    assert (s.login, s.partition, s.time, s.nodes, s.gpus_per_node) == (
        "login.example.edu",
        "gpu",
        "02:00:00",
        2,
        4,
    )
    assert (s.reach, s.keep_allocation, s.wait, s.exclusive, s.signal) == (
        "srun",
        False,
        0.0,
        False,
        None,
    )
    assert s.job_name == "tfdeploy-digits"


def test_every_key_reaches_sbatch(tmp_path: Path) -> None:
    extra = (
        'account = "ml"\nqos = "high"\nconstraint = "a100"\nreservation = "r1"\nexclusive = true\n'
        'sbatch_options = ["--mem=64G"]\nsignal = "USR1@300"\n'
    )
    argv = batch.sbatch_argv(_settings(tmp_path, extra))
    for option in (
        "--job-name=tfdeploy-digits",
        "--partition=gpu",
        "--nodes=2",
        "--time=02:00:00",
        "--gres=gpu:4",
        "--account=ml",
        "--qos=high",
        "--constraint=a100",
        "--reservation=r1",
        "--exclusive",
        "--mem=64G",
        "--signal=B:USR1@300",
    ):
        assert option in argv
    assert "--test-only" in batch.sbatch_argv(_settings(tmp_path, extra), test_only=True)


def test_restart_job_asks_for_a_requeueable_allocation_and_the_users_option_wins(
    tmp_path: Path,
) -> None:
    """A requeued allocation is what restart-job waits for (Slurm gives it back, same id);
    other policies leave requeueing to the cluster's default (tfdeploy releases it anyway)."""
    assert "--requeue" not in batch.sbatch_argv(_settings(tmp_path))
    path = tmp_path / "inv.toml"
    path.write_text(
        BASE.replace(
            'command = "python3 mwms.py"', 'command = "x"\non_failure = "restart-job"'
        ).format(extra='sbatch_options = ["--no-requeue"]\n', group="")
    )
    (source,) = load_inventory(path).pending
    argv = batch.sbatch_argv(source.settings)  # type: ignore[attr-defined]
    assert argv.index("--requeue") < argv.index("--no-requeue")  # sbatch: the last one wins


@pytest.mark.parametrize(
    "extra,group,key,said",
    [
        ('reach = "telnet"\n', "", "slurm.reach", "srun"),
        ('signal = "USR1"\n', "", "slurm.signal", "USR1@300"),
        ('sbatch_options = ["--nodes=4"]\n', "", "slurm.sbatch_options", "set by tfdeploy"),
        ('sbatch_options = ["-N4"]\n', "", "slurm.sbatch_options", "long sbatch options"),
        ("", "share_gpu = true\n", "slurm.hosts[0]", "share_gpus"),
        ('walltime = "1:00"\n', "", "slurm", "walltime"),
    ],
)
def test_a_wrong_key_is_an_error_naming_the_file_and_key(
    tmp_path: Path, extra: str, group: str, key: str, said: str
) -> None:
    path = tmp_path / "inv.toml"
    path.write_text(BASE.format(extra=extra, group=group))
    with pytest.raises(InventoryError) as info:
        load_inventory(path)
    assert said in str(info.value)
    assert str(path) in str(info.value) and key in str(info.value)


def test_a_time_limit_slurm_cannot_read_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "inv.toml"
    path.write_text(BASE.format(extra="", group="").replace('"02:00:00"', '"2h"'))
    with pytest.raises(InventoryError, match=r"slurm\.time: expected a Slurm time limit"):
        load_inventory(path)


def test_groups_must_ask_for_the_same_gpus_and_nodes_is_required(tmp_path: Path) -> None:
    path = tmp_path / "inv.toml"
    text = BASE.format(extra="", group="") + (
        '[[slurm.hosts]]\nnodes = 1\ngpus = 2\ntasks = [{ role = "worker" }]\n'
    )
    path.write_text(text)
    with pytest.raises(InventoryError, match=r"slurm\.hosts\[1\]\.gpus: 2 GPUs per node"):
        load_inventory(path)
    path.write_text(BASE.format(extra="", group="").replace("nodes = 2\n", ""))
    with pytest.raises(InventoryError, match=r"slurm\.hosts\[0\]\.nodes: is missing"):
        load_inventory(path)
    path.write_text(BASE.format(extra="", group="").replace("gpus = 4", 'gpus = "auto"'))
    with pytest.raises(InventoryError, match='not "auto"'):
        load_inventory(path)


def test_the_waiting_line_says_nodes_partition_reason_and_time() -> None:
    (job,) = [j for j in parse_queue(QUEUE, SQUEUE) if j.id == "20"]
    settings = SlurmSettings(login="local", partition="gpu", time="10", groups=())
    line = waiting_line(settings, job, 100)
    assert line.startswith("waiting for 0 nodes in gpu: Resources, 1m40s")


def test_plan_shows_the_nodes_to_allocate_and_asks_no_slurm(tmp_path: Path) -> None:
    code, out, err = cli("plan", str(ROOT / "inventories" / "slurm.toml"))
    assert code == 0, err
    assert "warning" not in err
    assert out.count("(to allocate)") == 2
    assert "TF_CONFIG" in out


# aws.toml names instances that exist only in a test's EC2 (tests/unit/test_aws.py plans it).
OWN = sorted(p.name for p in (ROOT / "inventories").glob("*.toml") if p.name != "aws.toml")


@pytest.mark.parametrize("name", OWN)
def test_every_inventory_in_inventories_plans_without_a_warning(name: str) -> None:
    assert "slurm.toml" in OWN
    code, _, err = cli("plan", str(ROOT / "inventories" / name))
    assert code == 0, f"{name} does not plan:\n{err}"
    assert "warning" not in err, f"{name} plans with a warning:\n{err}"
