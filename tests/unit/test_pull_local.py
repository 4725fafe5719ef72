"""`up`'s artifacts and `tfdeploy pull` through the real CLI and agent on this machine
(`transport = "local"`): where absolute matches land, and what a local problem is reported as
(issue #28, items 4 and 12). The scripted-host tests of the same code are in test_pull.py.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

from tests.support.helpers import one_line, run_cli
from tests.support.local_jobs import local_job, run_id_of, state  # noqa: F401 (a fixture)

pytestmark = pytest.mark.timeout(120)


def test_a_task_file_and_an_absolute_artifact_never_land_on_each_other(
    tmp_path: Path,
    state: Path,  # noqa: F811
) -> None:
    """The task writes a file `tmp`; the artifacts also name an absolute path below /tmp. Its
    copy once landed at worker-0/tmp/..., over the file: `internal error: IsADirectoryError`,
    exit 1 for a job that succeeded."""
    outside = tmp_path / "abs" / "x"
    outside.parent.mkdir()
    outside.write_text("the host's")
    assert str(outside).startswith("/tmp/")
    home = tmp_path / "home"
    artifacts = f'artifacts = ["tmp", "{outside}"]\nartifacts_to = "{home}"'
    code, out, err = run_cli("up", str(local_job(tmp_path, "printf mine > tmp", artifacts)))
    assert code == 0, out + err
    assert "artifacts: pulled 2 files" in out, out
    base = home / run_id_of(out)
    assert (base / "worker-0" / "tmp").read_text() == "mine"
    assert (base / "worker-0.abs" / str(outside).lstrip("/")).read_text() == "the host's"


def test_an_absolute_path_and_the_tasks_own_file_at_the_same_path_both_come_home(
    tmp_path: Path,
    state: Path,  # noqa: F811
) -> None:
    """`pull RUN /x/etc/hostname` while the task's directory has x/etc/hostname too: the host
    read the task's file for the absolute one, and the pull always failed `changed while being
    pulled`."""
    outside = tmp_path / "etc" / "hostname"
    outside.parent.mkdir()
    outside.write_text("the host's")
    relative = str(outside).lstrip("/")
    write = f"mkdir -p {Path(relative).parent} && printf own > {relative}"
    code, out, err = run_cli("up", str(local_job(tmp_path, write)))
    assert code == 0, out + err
    run_id = run_id_of(out)
    home = tmp_path / "home"
    code, out, err = run_cli("pull", run_id, str(outside), relative, "--to", str(home))
    assert code == 0, one_line(out + err)
    assert "pulled 2 files" in out
    assert (home / run_id / "worker-0" / relative).read_text() == "own"
    assert (home / run_id / "worker-0.abs" / relative).read_text() == "the host's"


def test_pull_to_a_file_exits_2_naming_it(tmp_path: Path, state: Path) -> None:  # noqa: F811
    """It exited 3, "a host is unreachable", with `connection failed: [Errno 20]`."""
    code, out, err = run_cli("up", str(local_job(tmp_path, "printf x > f")))
    assert code == 0, out + err
    home = tmp_path / "home"
    home.write_text("a file")
    code, out, err = run_cli("pull", run_id_of(out), "f", "--to", str(home))
    assert (code, out) == (2, "")
    assert one_line(err) == (
        f"error: cannot pull into {home}: {home} is a file, not a folder "
        "hint: name a folder (--to, or artifacts_to in the inventory)"
    )


def test_a_file_two_tasks_of_one_host_share_lands_once_and_the_summary_says_where(
    tmp_path: Path,
    state: Path,  # noqa: F811
) -> None:
    """Both workers run in the host's one code directory of the run: each once got the other's
    file in its own folder (worker-0/from-worker-1 and worker-1/from-worker-0)."""
    write = "printf $TFDEPLOY_TASK > from-{task_index}"
    code, out, err = run_cli("up", str(local_job(tmp_path, write, tasks=2)))
    assert code == 0, out + err
    run_id = run_id_of(out)
    home = tmp_path / "home"
    code, out, err = run_cli("pull", run_id, "from-*", "--to", str(home))
    assert (code, err) == (0, ""), one_line(out + err)
    base = home / run_id
    landed = sorted(str(p.relative_to(base)) for p in base.rglob("*") if p.is_file())
    assert landed == ["worker-0/from-0", "worker-0/from-1"]
    assert (base / "worker-0" / "from-1").read_text() == "worker:1"
    assert one_line(out).endswith(
        f"pulled 2 files into {base}: 16 bytes sent (2 files); worker:0 and worker:1 share one "
        "directory on local: 2 files landed once, in worker-0/"
    ), out


def test_a_pull_that_matches_nothing_on_every_task_exits_5_naming_what_and_where(
    tmp_path: Path,
    state: Path,  # noqa: F811
) -> None:
    """It said `no file matched ...; nothing was pulled` and exited 0, which a script takes for
    its checkpoints having come."""
    code, out, err = run_cli("up", str(local_job(tmp_path, "printf x > f", tasks=2)))
    assert code == 0, out + err
    run_id = run_id_of(out)
    home = tmp_path / "home"
    code, out, err = run_cli("pull", run_id, "ckpt/**", "nope.txt", "--to", str(home))
    assert (code, out) == (5, ""), one_line(out + err)
    assert one_line(err).startswith(
        "error: no file matched ckpt/**, nope.txt on worker:0@local, worker:1@local; nothing "
        "was pulled hint: a relative pattern names files below the task's directory"
    ), err
    assert not (home / run_id).exists() or not any((home / run_id).rglob("*"))
    code, out, err = run_cli("pull", run_id, "nope.txt", "f", "--to", str(home))
    assert code == 0, one_line(out + err)  # one pattern matched: the rest is not an error


def test_a_pulled_file_gets_this_machines_umask_as_scp_gives_it(
    tmp_path: Path,
    state: Path,  # noqa: F811
) -> None:
    """Issue 47: a host's mode was kept `& 0o777` only, so a file the host made group- and
    world-writable (0666, 0777) landed so here, whatever the user's umask said."""
    write = "printf a > open && chmod 666 open && printf b > run && chmod 777 run"
    code, out, err = run_cli("up", str(local_job(tmp_path, write)))
    assert code == 0, out + err
    run_id = run_id_of(out)
    old = os.umask(0o027)
    try:
        code, out, err = run_cli("pull", run_id, "open", "run", "--to", str(tmp_path / "home"))
    finally:
        os.umask(old)
    assert code == 0, one_line(out + err)
    folder = tmp_path / "home" / run_id / "worker-0"
    assert stat.S_IMODE((folder / "open").stat().st_mode) == 0o640
    assert stat.S_IMODE((folder / "run").stat().st_mode) == 0o750


def test_a_file_past_path_max_is_named_and_the_pull_exits_4(
    tmp_path: Path,
    state: Path,  # noqa: F811
) -> None:
    """Issue 47: a folder whose path exceeds PATH_MAX could not be listed, and the walk passed
    over it without a word: `pulled 1 file`, exit 0, the deep checkpoint silently missing."""
    deep = (
        "import os\n"
        "os.makedirs('deep', exist_ok=True); os.chdir('deep')\n"
        "for _ in range(24):\n"  # 24 x 201 characters: past Linux's PATH_MAX (4096) from /
        "    os.mkdir('d' * 200); os.chdir('d' * 200)\n"
        "open('ckpt', 'w').write('lost')\n"
    )
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "deep.py").write_text(deep)
    job = local_job(tmp_path, f"{sys.executable} deep.py && printf ok > deep/near")
    code, out, err = run_cli("up", str(job))
    assert code == 0, out + err
    run_id = run_id_of(out)
    code, out, err = run_cli("pull", run_id, "deep/**", "--to", str(tmp_path / "home"))
    said = one_line(out + err)
    assert code == 4, said
    assert "not pulled: worker:0@local: deep/" in said and "could not be listed" in said, said
    assert "1 file or folder the hosts could not read did not come" in said, said
    assert (tmp_path / "home" / run_id / "worker-0" / "deep" / "near").read_text() == "ok"
