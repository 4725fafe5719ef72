"""`tfdeploy plan` says TensorFlow's cluster rules before anything runs (deployer/config/tfrules.py,
docs/tensorflow.md): warnings on stderr, the plan still printed and exit 0; the rules TF itself
fails on are errors (tests/inventories/bad_pss_without_chief.toml, bad_evaluator_only.toml,
bad_overlapping_gpus.toml, through test_cli_plan.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.support.helpers import one_line, run_cli, to_toml


def write(tmp_path: Path, hosts: list[dict[str, Any]], **job: Any) -> str:
    document = {"job": {"name": "r", "code": str(tmp_path), "command": "python3 t.py", **job}}
    path = tmp_path / "inv.toml"
    path.write_text(to_toml(document) + "".join(f"[[hosts]]\n{to_toml(h)}" for h in hosts))
    return str(path)


def warnings_of(err: str) -> list[str]:
    return [one_line(w) for w in one_line(err).split("warning: ")[1:]]


UNEQUAL = [
    {"address": "a", "gpus": 4, "tasks": [{"role": "worker", "gpus": [1, 2, 3]}]},
    {"address": "b", "gpus": 1, "tasks": [{"role": "worker"}]},
    {"address": "c", "gpus": 1, "tasks": [{"role": "worker"}]},
    {"address": "d", "tasks": [{"role": "chief"}]},
]


def test_unequal_device_counts_among_mwms_workers_warn_naming_tasks_and_counts(
    tmp_path: Path,
) -> None:
    path = write(tmp_path, UNEQUAL)
    for argv in (["plan", path], ["plan", "--json", path]):
        code, out, err = run_cli(*argv)
        assert code == 0 and "TF_CONFIG" in out
        assert warnings_of(err) == [
            "MultiWorkerMirroredStrategy needs the same number of devices on every worker (and "
            "the chief), or TF's behaviour is undefined: worker:0: 3 GPUs; worker:1 and "
            "worker:2: 1 GPU; chief:0: CPU"
        ]
    json.loads(run_cli("plan", "--json", path)[1])  # stdout stays one JSON document
    # Equal counts, or a strategy whose tasks read no TF_CONFIG: nothing to say.
    equal = [{"address": a, "gpus": 2, "tasks": [{"role": "worker"}]} for a in "ab"]
    assert run_cli("plan", write(tmp_path, equal))[2] == ""
    assert run_cli("plan", write(tmp_path, UNEQUAL, strategy="mirrored"))[2] == ""


def test_ps_job_without_a_chief_warns_and_tf1_says_it_is_meant(tmp_path: Path) -> None:
    hosts = [{"address": "a", "tasks": [{"role": "worker", "count": 2}, {"role": "ps"}]}]
    code, _, err = run_cli("plan", write(tmp_path, hosts))
    assert code == 0
    assert warnings_of(err) == [
        "the job has ps tasks but no chief: ParameterServerStrategy needs a chief (its "
        'coordinator); a TF1 between-graph job needs none (set strategy = "tf1" to say so)'
    ]
    assert run_cli("plan", write(tmp_path, hosts, strategy="tf1"))[0::2] == (0, "")
    # strategy = "pss" says the script builds it: TF would have no coordinator, an error.
    code, out, err = run_cli("plan", write(tmp_path, hosts, strategy="pss"))
    assert (code, out) == (2, "")
    assert 'strategy = "pss" needs a chief' in one_line(err)


def test_ps_tasks_given_gpus_warn(tmp_path: Path) -> None:
    hosts = [
        {"address": "a", "gpus": 2, "tasks": [{"role": "chief", "gpus": [0]}]},
        {"address": "b", "gpus": 2, "tasks": [{"role": "worker"}, {"role": "ps", "gpus": [1]}]},
    ]
    code, _, err = run_cli("plan", write(tmp_path, hosts))
    assert code == 0
    assert warnings_of(err) == [
        "ps tasks given GPUs (ps:0: 1 GPU): a parameter server only holds variables, and "
        "ParameterServerStrategy places them on its CPU"
    ]


def test_auto_gpu_hosts_are_left_to_preflight(tmp_path: Path) -> None:
    """`gpus = "auto"` has no count before preflight: plan says nothing it cannot know."""
    hosts = [
        {"address": "a", "gpus": "auto", "tasks": [{"role": "worker"}]},
        {"address": "b", "gpus": 2, "tasks": [{"role": "worker"}]},
    ]
    assert run_cli("plan", write(tmp_path, hosts))[0::2] == (0, "")
