"""Preflight's script check (issue 58): `python3 mwm.py` for a code directory holding mwms.py
is refused before anything starts, naming the inventory key and the closest file; every command
whose script may come from elsewhere is left alone. Plans from real inventory files; the `up`
of the last test runs the real agent on this machine (`transport = "local"`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from deployer.config.inventory import load_inventory
from deployer.config.plan import make_plan
from deployer.up.scriptcheck import missing_scripts, script_of
from tests.support.helpers import free_port, one_line, run_cli


@pytest.mark.parametrize(
    ("command", "script"),
    [
        ("python3 mwm.py --epochs 3", "mwm.py"),
        ("python mwm.py", "mwm.py"),
        ("/opt/venv/bin/python3.11 -u -X dev -W ignore src/train.py", "src/train.py"),
        ("python3 -uBWerror train.py", "train.py"),
        ("FOO=1 python3 x.py", None),  # the shell runs FOO=1 first: not the interpreter's word
        ("python3 -m pkg.train", None),  # a module may be the environment's
        ("python3 -mpkg", None),
        ("python3 -c 'print(1)'", None),
        ("python3 -uc 'print(1)'", None),
        ("python3 /opt/app/train.py", None),  # the host's, or an image's
        ("python3 ~/train.py", None),
        ("python3 $SCRIPT.py", None),
        ("python3 ../elsewhere.py", None),  # outside the code directory
        ("python3 train_{task_index}.py", None),
        ("cd sub && python3 x.py", None),
        ("torchrun train.py", None),  # a console script of the environment
        ("python3 notebook.ipynb", None),
        ("python3 - < x.py", None),
        ("python3 --version", None),
        ("python3 'unclosed", None),
    ],
)
def test_the_script_is_read_only_where_it_is_certainly_a_file_of_code(
    command: str, script: str | None
) -> None:
    assert script_of(command) == script


def _plan(tmp: Path, job: str, hosts: str = "", files: tuple[str, ...] = ("mwms.py",)) -> object:
    code = tmp / "code"
    code.mkdir(exist_ok=True)
    for name in files:
        (code / name).parent.mkdir(parents=True, exist_ok=True)
        (code / name).write_text("print('hi')\n")
    hosts = hosts or '[[hosts]]\nname = "h1"\naddress = "10.0.0.1"\ntasks = [{ role = "worker" }]\n'
    (tmp / "inv.toml").write_text(f'[job]\nname = "j"\ncode = "code"\n{job}\n{hosts}')
    return make_plan(load_inventory(tmp / "inv.toml"))


def test_a_missing_script_is_found_under_the_key_that_names_it(tmp_path: Path) -> None:
    hosts = (
        '[[hosts]]\nname = "h1"\naddress = "10.0.0.1"\n'
        'tasks = [{ role = "chief" }, { role = "worker", command = "python3 evl.py" }]\n'
        '[[hosts]]\nname = "h2"\naddress = "10.0.0.2"\ntasks = [{ role = "worker" }]\n'
    )
    job = 'command = "python3 mwm.py"\n[job.role_commands]\nchief = "python3 mwms.py"\n'
    plan = _plan(tmp_path, job, hosts)
    found = {(m.key, m.script, m.tasks) for m in missing_scripts(plan)}  # type: ignore[arg-type]
    assert found == {
        ("hosts[0].tasks[1].command", "evl.py", ("worker:0",)),
        ("job.command", "mwm.py", ("worker:1",)),
    }


def test_a_job_with_setup_is_not_checked_since_setup_may_write_the_script(tmp_path: Path) -> None:
    plan = _plan(tmp_path, 'command = "python3 mwm.py"\nsetup = ["cp mwms.py mwm.py"]')
    assert missing_scripts(plan) == []  # type: ignore[arg-type]


def test_scripts_that_are_there_pass(tmp_path: Path) -> None:
    plan = _plan(tmp_path, 'command = "python3 src/train.py"', files=("src/train.py",))
    assert missing_scripts(plan) == []  # type: ignore[arg-type]


def test_up_refuses_the_typo_before_anything_starts_naming_key_and_closest_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real agent on this machine: the hello happens, nothing starts, and the port the
    hello reserved is free again for the next `up`."""
    code = tmp_path / "code"
    code.mkdir()
    marker = tmp_path / "ran"
    (code / "mwms.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    (code / "common.py").write_text("")
    text = (
        f'[job]\nname = "typo"\ncode = "{code}"\ncommand = "python3 mwm.py --epochs 2"\n'
        f"require_tensorflow = false\nnetcheck = false\nport = {free_port()}\n"
        '[[hosts]]\nname = "local"\naddress = "127.0.0.1"\ntransport = "local"\n'
        f'workdir = "{tmp_path / "wd"}"\ntasks = [{{ role = "worker" }}]\n'
    )
    inventory = tmp_path / "inv.toml"
    inventory.write_text(text)
    monkeypatch.setenv("TFDEPLOY_STATE_DIR", str(tmp_path / "state"))
    code_, out, err = run_cli("up", str(inventory))
    err = one_line(err)
    # Before: preflight passed, the task ran `python3 mwm.py` and failed (exit 1, "can't open").
    assert code_ == 3, out + err
    assert f"{inventory}: job.command: the command runs mwm.py, which is not in" in err, err
    assert "nothing was started" in err and "hint: did you mean mwms.py?" in err, err
    assert "can't open file" not in out + err and not marker.exists()
    assert not (tmp_path / "wd" / "runs").exists() or not any((tmp_path / "wd" / "runs").iterdir())
    # The script fixed, the same host's port is free: the hello's reservation was released.
    inventory.write_text(text.replace("mwm.py", "mwms.py"))
    code_, out, err = run_cli("up", str(inventory))
    assert code_ == 0, out + err
    assert marker.exists()
