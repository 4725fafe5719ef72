"""A venv's name covers every setting that makes it: two different settings never share one."""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

from deployer.config.model import Job, WheelsFrom
from deployer.envs.identity import EnvIdentity, Interpreter
from deployer.up.environment import identity_of

FACTS = {"python": "3.11.2", "executable": "/usr/bin/python3.11", "prefix": "/opt/tf"}


def test_each_setting_makes_another_venv() -> None:
    base = EnvIdentity(
        "r" * 64, Interpreter("/usr/bin/python3.11", "/usr", "3.11.2"), False, "controller"
    )
    variants = [
        base,
        dataclasses.replace(base, requirements="s" * 64),
        dataclasses.replace(
            base, interpreter=Interpreter("/usr/local/bin/python3.11", "/usr", "3.11.2")
        ),
        dataclasses.replace(
            base, interpreter=Interpreter("/usr/bin/python3.11", "/opt/tf", "3.11.2")
        ),
        dataclasses.replace(base, interpreter=Interpreter("/usr/bin/python3.11", "/usr", "3.11.9")),
        dataclasses.replace(base, system_site_packages=True),
        dataclasses.replace(base, wheels_from="hosts"),
        dataclasses.replace(base, installer="uv"),
    ]
    hashes = [v.hash for v in variants]
    assert len(set(hashes)) == len(variants)
    for a, b in itertools.combinations(variants, 2):
        assert (a.hash == b.hash) == (a == b)
    assert base.hash == dataclasses.replace(base).hash  # and stable


def test_the_identity_reads_the_hosts_hello_and_the_jobs_settings(tmp_path: Path) -> None:
    job = Job(name="j", code=tmp_path, command="python t.py", role_commands={})
    plain = identity_of(job, "r" * 64, "python3", FACTS)
    assert plain.interpreter == Interpreter("/usr/bin/python3.11", "/opt/tf", "3.11.2")
    system = identity_of(
        dataclasses.replace(job, system_site_packages=True), "r" * 64, "python3", FACTS
    )
    hosts = identity_of(
        dataclasses.replace(job, wheels_from=WheelsFrom.HOSTS), "r" * 64, "python3", FACTS
    )
    other = identity_of(job, "r" * 64, "/usr/bin/python3", {**FACTS, "prefix": "/usr"})
    assert len({plain.hash, system.hash, hosts.hash, other.hash}) == 4
    # An agent that does not say its real path: the configured one stands in.
    older = identity_of(job, "r" * 64, "/usr/bin/python3", {"python": "3.11.2"})
    assert older.interpreter.path == "/usr/bin/python3"
