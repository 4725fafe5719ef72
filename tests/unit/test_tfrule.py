"""The TensorFlow rule (deployer/up/tfrule.py): every task's TensorFlow, one check."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from deployer.config.model import Job
from deployer.core.errors import HostsFailed
from deployer.up.tfrule import TaskTensorflow, check, summary
from tests.support.harness import TWO_WORKERS, Harness

JOB = Job(name="j", code=Path("."), command="python t.py", role_commands={})


def _tf(task: str, host: str, where: str, version: str | None) -> TaskTensorflow:
    return TaskTensorflow(task, host, where, version)


def test_the_missing_tensorflow_hint_names_requirements_not_setup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = Harness(tmp_path, TWO_WORKERS, monkeypatch)
    h.hosts["b"].facts["tensorflow"] = None
    with pytest.raises(HostsFailed) as info:
        h.run(lambda now: None)
    hint = info.value.hint or ""
    # Before: "install tensorflow on the host or add it to job.setup": setup cannot install on
    # an offline host, requirements can (the controller sends the wheels).
    assert "`requirements`" in hint and "offline hosts" in hint, hint
    assert "require_tensorflow = false" in hint and "job.setup" not in hint, hint


def test_one_check_names_each_version_and_where_it_comes_from() -> None:
    found = [
        _tf("worker:0", "h1", "python3", "2.21.0"),
        _tf("worker:1", "h2", "venv 1a2b3c4d5e6f", "2.15.1"),
        _tf("evaluator:0", "h2", "image localhost/x:1", "2.15.1"),
    ]
    with pytest.raises(HostsFailed) as info:
        check(JOB, found)
    said = info.value.message
    assert "hosts disagree on the TensorFlow version: the tasks would run 2.15.1, 2.21.0" in said
    assert "h1: TensorFlow 2.21.0 for worker:0 (python3)" in said
    assert "h2: TensorFlow 2.15.1 for worker:1 (venv 1a2b3c4d5e6f)" in said
    assert "h2: TensorFlow 2.15.1 for evaluator:0 (image localhost/x:1)" in said
    assert "allow_mixed_tensorflow = true" in (info.value.hint or "")
    allowed = check(dataclasses.replace(JOB, allow_mixed_tensorflow=True), found)
    assert allowed == [
        "mixed TensorFlow (allow_mixed_tensorflow = true): 2.15.1 on worker:1@h2 "
        "(venv 1a2b3c4d5e6f) and evaluator:0@h2 (image localhost/x:1); 2.21.0 on worker:0@h1 "
        "(python3)"
    ]
    assert summary(found) == "tensorflow 2.15.1/2.21.0"


def test_require_tensorflow_false_and_setup_stay_per_job() -> None:
    found = [_tf("worker:0", "h1", "python3", None), _tf("worker:1", "h2", "python3", "2.21.0")]
    with pytest.raises(HostsFailed, match="TensorFlow is not installed for python3"):
        check(JOB, found)
    assert check(dataclasses.replace(JOB, require_tensorflow=False), found) == []
    assert check(dataclasses.replace(JOB, setup=("pip install tensorflow",)), found) == []
    assert check(JOB, [f for f in found if f.version]) == []
