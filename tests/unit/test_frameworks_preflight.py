"""Preflight's framework rule (up/frameworkrule.py), a framework job's TensorFlow default, and the
failure report's hint for a script under the wrong convention (watch/convention.py): both read
each framework's record (config/frameworks.py). Also what the rule reads of a host: the image
trial's output (remote/containers.py), and the env and image replies' `frameworks` at the edge."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from deployer.config.frameworks import RECORDS, WRONG_CONVENTION_HINT, Framework
from deployer.config.inventory import load_inventory
from deployer.config.plan import Plan, Task, make_plan
from deployer.core.errors import HostError
from deployer.envs.wheelhouse import Wheel
from deployer.hosts.replies import Edge
from deployer.hosts.task_runtime import TaskRuntime
from deployer.up import frameworkrule
from deployer.up.environment import Environments
from deployer.up.images import Images
from deployer.watch.convention import convention_hint
from remote import containers, hostfacts, protocol
from tests.support.aws import cli

HOSTS = """
[[hosts]]
address = "10.0.0.1"
tasks = [{ role = "worker" }]

[[hosts]]
address = "10.0.0.2"
tasks = [{ role = "worker" }]
"""
TORCH = {"torch": "2.13.0+cpu"}
KERAS = {"keras": "3.15.1", "jax": "0.10.2", "jaxlib": "0.10.2"}


def _plan(tmp_path: Path, job: str) -> Plan:
    (tmp_path / "code").mkdir(exist_ok=True)
    inventory = tmp_path / "inv.toml"
    inventory.write_text(
        f'[job]\nname = "j"\ncode = "code"\ncommand = "python3 t.py"\n{job}\n{HOSTS}'
    )
    return make_plan(load_inventory(inventory))


def _facts(h1: dict[str, str], h2: dict[str, str]) -> dict[str, dict[str, object]]:
    return {"10.0.0.1": {"frameworks": h1}, "10.0.0.2": {"frameworks": h2}}


def test_a_framework_job_needs_no_tensorflow_unless_a_role_reads_tf_config(
    tmp_path: Path,
) -> None:
    assert _plan(tmp_path, "").job.require_tensorflow
    assert not _plan(tmp_path, 'framework = "torch"').job.require_tensorflow
    mixed = 'framework = "torch"\nrole_frameworks = { evaluator = "tensorflow" }'
    assert _plan(tmp_path, mixed).job.require_tensorflow
    said = 'framework = "torch"\nrequire_tensorflow = true'
    assert _plan(tmp_path, said).job.require_tensorflow


def test_a_missing_framework_is_named_per_host_with_its_python(tmp_path: Path) -> None:
    plan = _plan(tmp_path, 'framework = "keras"')
    found = frameworkrule.problems(plan, _facts(KERAS, {"keras": "3.15.1"}))
    assert [(p.host, p.cause) for p in found] == [
        ("10.0.0.2", 'jax is not installed for python3 (worker:1 reads framework = "keras")'),
        ("10.0.0.2", 'jaxlib is not installed for python3 (worker:1 reads framework = "keras")'),
    ]
    assert frameworkrule.problems(plan, _facts(KERAS, KERAS)) == []


def test_two_versions_of_a_framework_across_hosts_are_refused(tmp_path: Path) -> None:
    plan = _plan(tmp_path, 'framework = "torch"')
    found = frameworkrule.problems(plan, _facts(TORCH, {"torch": "2.12.0"}))
    assert [(p.host, p.cause) for p in found] == [
        ("10.0.0.1", "torch 2.13.0+cpu"),
        ("10.0.0.2", "torch 2.12.0"),
    ]


def test_tensorflow_jobs_and_venv_tasks_are_left_to_their_own_checks(tmp_path: Path) -> None:
    assert frameworkrule.problems(_plan(tmp_path, ""), _facts({}, {})) == []
    in_venv = 'framework = "torch"\nrequirements = ["torch"]'
    assert frameworkrule.problems(_plan(tmp_path, in_venv), _facts({}, {})) == []


class _Resolved(Environments):
    """Every requirements task's venv resolved to `files` (a wheelhouse of wheel file names)."""

    def __init__(self, plan: Plan, files: list[str]) -> None:
        super().__init__(plan)
        wheels = tuple(Wheel(f, "0" * 64, 1) for f in files)
        self.env = SimpleNamespace(
            hash="1a2b3c4d5e6f7a8b",
            wheelhouse=SimpleNamespace(wheels=wheels),
            identity=SimpleNamespace(interpreter=SimpleNamespace(path="/usr/bin/python3")),
        )

    def env_of(self, task: Task) -> SimpleNamespace:  # type: ignore[override]
        return self.env


JAX_WHEELS = ["jax-0.10.2-py3-none-any.whl", "jaxlib-0.10.2-cp311-cp311-manylinux_x86_64.whl"]


def test_a_venv_task_is_checked_on_its_resolved_wheels(tmp_path: Path) -> None:
    in_venv = 'framework = "keras"\nrequirements = ["keras"]'
    plan = _plan(tmp_path, in_venv)
    resolved = _Resolved(plan, JAX_WHEELS)
    found = frameworkrule.problems(plan, _facts(KERAS, KERAS), resolved)
    assert [(p.host, p.cause) for p in found] == [
        (
            "10.0.0.1",
            'keras is not installed for venv 1a2b3c4d5e6f (worker:0 reads framework = "keras")',
        ),
        (
            "10.0.0.2",
            'keras is not installed for venv 1a2b3c4d5e6f (worker:1 reads framework = "keras")',
        ),
    ]
    assert "requirements" in (found[0].hint or "") and "keras" in (found[0].hint or "")
    resolved = _Resolved(plan, ["keras-3.15.1-py3-none-any.whl", *JAX_WHEELS])
    assert frameworkrule.problems(plan, _facts({}, {}), resolved) == []
    # Without the environments (preflight, before they are resolved): not known yet.
    assert frameworkrule.problems(plan, _facts({}, {})) == []


def test_a_venv_over_system_site_packages_counts_the_base_pythons(tmp_path: Path) -> None:
    shared = 'framework = "keras"\nrequirements = ["jax"]\nsystem_site_packages = true'
    plan = _plan(tmp_path, shared)
    resolved = _Resolved(plan, JAX_WHEELS)
    found = frameworkrule.problems(plan, _facts(KERAS, {"keras": "3.14.0"}), resolved)
    where = "venv 1a2b3c4d5e6f over /usr/bin/python3"
    assert [(p.host, p.cause) for p in found] == [
        ("10.0.0.1", f"keras 3.15.1 ({where})"),
        ("10.0.0.2", f"keras 3.14.0 ({where})"),
    ]


def test_a_venv_from_the_hosts_index_and_an_image_are_not_known_before_the_import(
    tmp_path: Path,
) -> None:
    from_hosts = 'framework = "torch"\nrequirements = ["torch"]\nwheels_from = "hosts"'
    plan = _plan(tmp_path, from_hosts)
    assert frameworkrule.known_packages(plan, _facts({}, {}), _Resolved(plan, [])) == []
    in_image = 'framework = "torch"\nimage = "localhost/x:1"'
    plan = _plan(tmp_path, in_image)
    assert frameworkrule.known_packages(plan, _facts({}, {}), _Resolved(plan, [])) == []


VENV = "/home/u/.tfdeploy/envs/1a2b3c4d5e6f7a8b"


class _Installed(_Resolved):
    """Every requirements task's venv installed at VENV, from the hosts' own index (no
    wheelhouse here: `wheels_from = "hosts"`)."""

    def __init__(self, plan: Plan) -> None:
        super().__init__(plan, [])
        self.env.wheelhouse = None

    def runtime(self, task: Task) -> TaskRuntime:
        return TaskRuntime("python3", venv=VENV)


def test_a_venv_from_the_hosts_index_is_checked_on_what_its_env_op_answered(
    tmp_path: Path,
) -> None:
    from_hosts = 'framework = "torch"\nrequirements = ["torch"]\nwheels_from = "hosts"'
    plan = _plan(tmp_path, from_hosts)
    envs = _Installed(plan)
    installed = {"10.0.0.1": {VENV: TORCH}, "10.0.0.2": {VENV: {}}}
    found = frameworkrule.problems(plan, _facts({}, {}), envs, installed=installed)
    assert [(p.host, p.cause) for p in found] == [
        ("10.0.0.2", f'torch is not installed for venv {VENV} (worker:1 reads framework = "torch")')
    ]
    assert "requirements" in (found[0].hint or "")
    installed["10.0.0.2"][VENV] = {"Torch": "2.12.0"}  # as a dist-info may spell it
    found = frameworkrule.problems(plan, _facts({}, {}), envs, installed=installed)
    assert [(p.host, p.cause) for p in found] == [
        ("10.0.0.1", f"torch 2.13.0+cpu (venv {VENV})"),
        ("10.0.0.2", f"torch 2.12.0 (venv {VENV})"),
    ]
    # A venv whose env op said nothing of its frameworks (an older agent): still not known.
    assert frameworkrule.problems(plan, _facts({}, {}), envs, installed={}) == []


def test_a_venvs_answer_outweighs_its_wheels_once_installed(tmp_path: Path) -> None:
    """Once installed, the venv's own python says what a task imports (with
    system_site_packages the base python's too): its answer replaces what its wheels said."""
    plan = _plan(tmp_path, 'framework = "torch"\nrequirements = ["torch"]')
    envs = _Installed(plan)
    envs.env.wheelhouse = SimpleNamespace(wheels=(Wheel("torch-2.12.0-py3-none-any.whl", "0", 1),))
    before = frameworkrule.problems(plan, _facts({}, {}), envs)
    assert before == []  # both on the resolved torch 2.12.0
    installed = {"10.0.0.1": {VENV: TORCH}, "10.0.0.2": {VENV: {"torch": "2.12.0"}}}
    after = frameworkrule.problems(plan, _facts({}, {}), envs, installed=installed)
    assert [p.cause for p in after] == [
        f"torch 2.13.0+cpu (venv {VENV})",
        f"torch 2.12.0 (venv {VENV})",
    ]


IMAGE = "localhost/x:1"


def _tried(
    frameworks: dict[str, dict[str, str] | None],
) -> dict[str, dict[str, protocol.ImageReply]]:
    """Each host's check of IMAGE: its trial ran, and read these frameworks (None: none read,
    as an image's Python without importlib.metadata says)."""
    checked = {}
    for host, said in frameworks.items():
        reply: protocol.ImageReply = {
            "runtime": "podman",
            "rootless": False,
            "platform": "linux/amd64",
            "present": True,
            "pulled": False,
            "image_platform": "linux/amd64",
            "tried": True,
            "tensorflow": None,
        }
        if said is not None:
            reply["frameworks"] = said
        checked[host] = {IMAGE: reply}
    return checked


def test_an_image_task_is_checked_on_what_its_trial_container_read(tmp_path: Path) -> None:
    plan = _plan(tmp_path, f'framework = "keras"\nimage = "{IMAGE}"')
    images = Images(plan)
    images.checked = _tried({"10.0.0.1": KERAS, "10.0.0.2": {"keras": "3.14.0"}})
    found = frameworkrule.problems(plan, _facts({}, {}), images=images)
    assert [(p.host, p.cause) for p in found] == [
        (
            "10.0.0.2",
            f'jax is not installed for image {IMAGE} (worker:1 reads framework = "keras")',
        ),
        (
            "10.0.0.2",
            f'jaxlib is not installed for image {IMAGE} (worker:1 reads framework = "keras")',
        ),
        ("10.0.0.1", f"keras 3.15.1 (image {IMAGE})"),
        ("10.0.0.2", f"keras 3.14.0 (image {IMAGE})"),
    ]
    assert "install jax in the image" in (found[0].hint or "")
    # Not read (an image's Python 3.7), or no trial on that host yet (an image sent from here
    # is tried after its load): not known, so not checked.
    images.checked = _tried({"10.0.0.1": KERAS, "10.0.0.2": None})
    assert frameworkrule.problems(plan, _facts({}, {}), images=images) == []
    del images.checked["10.0.0.2"]
    assert [k.task.name for k in frameworkrule.known_packages(plan, {}, images=images)] == [
        "worker:0"
    ]
    # The hello says the host python's, which the image's tasks do not run.
    assert frameworkrule.problems(plan, _facts(KERAS, {})) == []


PROBE_LINES = "tensorflow 2.21.0\nframework torch 2.13.0+cpu\nframeworks read\n"


@pytest.mark.parametrize(
    ("out", "tensorflow", "frameworks"),
    [
        (PROBE_LINES, "2.21.0", {"torch": "2.13.0+cpu"}),
        # no Python in the image; a Python without importlib.metadata (3.6, 3.7): not read
        ("tensorflow -\n", None, None),
        ("tensorflow -\nframeworks ?\n", None, None),
        # an image prints what it likes before: only the probe's last lines are read
        ("\x1b]52;c;x\x07" + "x" * 100_000 + "\n" + PROBE_LINES, "2.21.0", {"torch": "2.13.0+cpu"}),
        # ... and after: lines that far back are not read at all
        (PROBE_LINES + "y" * 100_000 + "\n", None, None),
        # a name not asked for, a version of no version's shape, a line of another shape
        (
            "framework evil 1.0\nframework jax $(reboot)\nframework keras 3.15.1 extra\n"
            f"framework jaxlib {'9' * 80}\nframework torch 2.13.0\nframework torch 1.0\n"
            "tensorflow -\nframeworks read\n",
            None,
            {"torch": "2.13.0"},
        ),
    ],
)
def test_the_trials_output_is_read_strictly(
    out: str, tensorflow: str | None, frameworks: dict[str, str] | None
) -> None:
    said = containers.parse_trial(out, hostfacts.FRAMEWORK_DISTRIBUTIONS)
    assert said == containers.Trial(tensorflow, frameworks)


ENV_REPLY = {
    "venv": VENV,
    "built": True,
    "waited": False,
    "installer": "pip",
    "seconds": 1.0,
    "python": "3.11.7",
    "tensorflow": None,
    "interpreters": {"checked": [f"{VENV}/bin/python", VENV], "found": {}},
}


def test_the_env_and_image_replies_frameworks_pass_the_edge_as_the_hellos_do() -> None:
    """Typed (a text per name), cleaned of escape sequences, bounded in length: the edge reads
    a field by its type and name, so `frameworks` is read alike in the three replies."""
    said = {"torch\x1b[2J": "2.13.0\x1b]0;owned\x07"}
    env = Edge("h1", protocol.OP_ENVIRONMENT).reply(
        {**ENV_REPLY, "frameworks": said}, protocol.EnvReply
    )
    image = Edge("h1", protocol.OP_IMAGE).reply(
        _tried({"h1": said})["h1"][IMAGE], protocol.ImageReply
    )
    assert env["frameworks"] == image["frameworks"] == {"torch": "2.13.0"}
    assert "frameworks" not in Edge("h1", protocol.OP_ENVIRONMENT).reply(
        ENV_REPLY, protocol.EnvReply
    )
    for bad in ({"torch": 2}, {"torch": "9" * 70_000}, ["torch"]):
        with pytest.raises(HostError, match="frameworks"):
            Edge("h1", protocol.OP_ENVIRONMENT).reply(
                {**ENV_REPLY, "frameworks": bad}, protocol.EnvReply
            )


def test_the_hello_reads_every_distribution_a_record_needs() -> None:
    needed = {d for r in RECORDS.values() for d in r.packages}
    assert needed == set(hostfacts.FRAMEWORK_DISTRIBUTIONS)


def test_each_rank_conventions_signs_name_it_in_the_hint() -> None:
    for r in RECORDS.values():
        assert r.signs and r.by_rank == (r.name != Framework.TENSORFLOW)
        for words in r.signs:
            others = [
                f
                for f in Framework
                if f not in {g.name for g in RECORDS.values() if words in g.signs}
            ]
            hint = convention_hint([f"ValueError: {words}"], others[0])
            assert hint is not None and f'framework = "{r.name}"' in hint
    said = convention_hint(["RuntimeError: MASTER_ADDR expected"], Framework.JAX)
    choices = 'framework = "torch"'
    assert said == WRONG_CONVENTION_HINT.format(framework="jax", choices=choices)


def test_a_torch_script_under_tf_config_gets_the_framework_key_as_hint() -> None:
    tail = [
        "Traceback (most recent call last):",
        "ValueError: Error initializing torch.distributed using env:// rendezvous: "
        "environment variable RANK expected, but not set",
    ]
    hint = convention_hint(tail, Framework.TENSORFLOW)
    assert hint is not None and 'set [job] framework = "torch"' in hint
    assert convention_hint(tail, Framework.TORCH) is None  # its own convention: no hint
    keras = ["ValueError: coordinator_address should be defined."]
    hint = convention_hint(keras, Framework.TENSORFLOW)
    assert hint is not None and 'framework = "keras" or framework = "jax"' in hint
    assert convention_hint(["ValueError: loss is nan"], Framework.TENSORFLOW) is None
    tf_script = ["    config = json.loads(os.environ['TF_CONFIG'])", "KeyError: 'TF_CONFIG'"]
    hint = convention_hint(tf_script, Framework.TORCH)
    assert hint is not None and 'framework = "tensorflow"' in hint
    # The name alone in a line the script printed is no sign of a TF_CONFIG reader.
    printed = ["env: TF_CONFIG unset, RANK=1", "RuntimeError: CUDA out of memory"]
    assert convention_hint(printed, Framework.TORCH) is None


def test_plan_json_and_plan_print_each_ranks_variables(tmp_path: Path) -> None:
    (tmp_path / "code").mkdir()
    inventory = tmp_path / "inv.toml"
    inventory.write_text(
        '[job]\nname = "j"\ncode = "code"\ncommand = "python3 t.py"\nframework = "torch"\n'
        '[[hosts]]\naddress = "10.0.0.1"\ntasks = [{ role = "worker", count = 2 }]\n'
        '[[hosts]]\naddress = "10.0.0.2"\ntasks = [{ role = "worker" }]\n'
    )
    code, out, err = cli("plan", "--json", str(inventory))
    assert code == 0, err
    envs = {f"{t['role']}:{t['index']}": t["env"] for t in json.loads(out)["tasks"]}
    assert envs["worker:1"] | {"CUDA_VISIBLE_DEVICES": "", "TFDEPLOY_TASK": "worker:1"} == {
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "2222",
        "RANK": "1",
        "WORLD_SIZE": "3",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "CUDA_VISIBLE_DEVICES": "",
        "TFDEPLOY_TASK": "worker:1",
    }
    assert "TF_CONFIG" not in envs["worker:2"] and envs["worker:2"]["LOCAL_RANK"] == "0"
    code, out, err = cli("plan", str(inventory))
    assert code == 0, err
    assert "torch variables per task" in out and "TF_CONFIG" not in out
    assert "worker:2     MASTER_ADDR=10.0.0.1 MASTER_PORT=2222 RANK=2 WORLD_SIZE=3" in out
