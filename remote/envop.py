"""The env op: the job's venv on this host, from wheels the push left in the store.

The wheels arrive as contents of the store (sent once, through the fan-out, like code); this op
gives them their file names (venvs.link_wheels), builds or reuses WORKDIR/envs/<hash>/
(venvs.ensure: once per host and environment, under a lock that holds on shared homes), and
answers what preflight must check in that venv: its Python, its TensorFlow, its frameworks beside
TensorFlow (torch, jax, keras: the framework rule's, deployer/up/frameworkrule.py), and whether
each task's first word is the venv's interpreter once the venv is activated.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any, NamedTuple

import hostfacts
import hostid
import interpreters
import layout
import params
import protocol
import venvs

# The venv's Python version, its TensorFlow and its frameworks beside TensorFlow, read from
# package metadata (importing TensorFlow or torch costs seconds), one `WORD VALUE...` per line;
# -I: the host's PYTHON* variables cannot point elsewhere.
_PROBE = (
    "import sys\n"
    "from importlib import metadata\n"
    "def found(d):\n"
    "    try:\n"
    "        return metadata.version(d)\n"
    "    except metadata.PackageNotFoundError:\n"
    "        return None\n"
    "print('python', sys.version.split()[0])\n"
    f"for d in {hostfacts.TF_DISTRIBUTIONS!r}:\n"
    "    v = found(d)\n"
    "    if v:\n"
    "        print('tensorflow', v); break\n"
    f"for d in {hostfacts.FRAMEWORK_DISTRIBUTIONS!r}:\n"
    "    v = found(d)\n"
    "    if v:\n"
    "        print('framework', d, v)\n"
)
_FRAMEWORKS = hostfacts.FRAMEWORK_DISTRIBUTIONS  # the only names a probe's line may give


class _Probed(NamedTuple):
    """What the venv's own interpreter says of itself."""

    python: str
    tensorflow: str | None
    frameworks: dict[str, str]  # those of hostfacts.FRAMEWORK_DISTRIBUTIONS it has


def op_env(req: dict[str, Any]) -> protocol.EnvReply:
    workdir = layout.workdir_path(req)
    run_id = params.check_name(params.param(req, "run_id", str), "run id")
    env_hash = params.param(req, "hash", str)
    python = params.param(req, "python", str)
    requirements = params.param(req, "requirements", str)
    wheels = [_wheel(item) for item in params.param(req, "wheels", list, [])]
    installer = params.param(req, "installer", str, "auto")
    words = params.param(req, "words", list, [])
    if not all(isinstance(w, str) for w in words):
        raise params.AgentError("words must be strings")
    try:
        venv = venvs.env_path(workdir, env_hash)
        here = hostid.identity()
        found = venvs.link_wheels(workdir / "store", wheels, venvs.wheels_dir(workdir, here))
        result = venvs.ensure(
            workdir,
            env_hash,
            python=python,
            requirements=requirements,
            wheels=found,
            host_id=here,
            run_id=run_id,
            system_site_packages=params.param(req, "system_site_packages", bool, False),
            installer=installer,
            online=params.param(req, "online", bool, False),
        )
    except venvs.EnvError as exc:
        raise params.AgentError(str(exc)) from None
    probed = _probe(venv)
    path = interpreters.venv_env(str(venv), os.environ).get("PATH")
    return {
        "venv": str(venv),
        "built": bool(result["built"]),
        "waited": bool(result["waited"]),
        "installer": result["installer"],
        "seconds": float(result["seconds"]),
        "python": probed.python,
        "tensorflow": probed.tensorflow,
        "frameworks": probed.frameworks,
        "interpreters": interpreters.answer(str(venv / "bin" / "python"), words, path),
    }


def op_env_progress(req: dict[str, Any]) -> protocol.EnvProgressReply:
    """How far a build of the env is: which of its projects are ready. pip installs one project
    after the other, each leaving its .dist-info in the venv; uv first unpacks every wheel into
    the host's uv cache (most of its time, all wheels at once) and links them all into the venv
    at the very end, so a uv build counts the projects its cache holds unpacked too (a project
    an earlier environment unpacked counts at once: uv links it, it has nothing to unpack).
    Read from the file system, so it answers while the env op that builds runs on another
    session."""
    workdir = layout.workdir_path(req)
    venv = venvs.env_path(workdir, params.param(req, "hash", str))
    names = params.param(req, "names", list)
    if not all(isinstance(n, str) for n in names):
        raise params.AgentError("names must be strings")
    found = _unpacked(venvs.uv_cache(workdir, hostid.identity()))
    for site in venv.glob("lib/python*/site-packages"):
        found |= {normalized(e.split("-", 1)[0]) for e in _listed(site) if e.endswith(".dist-info")}
    return {"installed": len(found & set(names)), "complete": venvs.is_complete(venv)}


def _unpacked(cache: Path) -> set[str]:
    """The projects uv's cache holds unpacked: uv keeps each wheel it unpacked as
    wheels-v<N>/<source>/<source id>/<project>/<version-tags> (a link to the unpacked files,
    written once they are all there) beside a `.lock` it takes while unpacking."""
    found: set[str] = set()
    for project in cache.glob("wheels-v*/*/*/*"):
        if any(not e.endswith(".lock") for e in _listed(project)):
            found.add(normalized(project.name))
    return found


def _listed(folder: Path) -> list[str]:
    try:
        return os.listdir(str(folder))
    except OSError:
        return []


def normalized(name: str) -> str:
    """A project's name as wheel and .dist-info names spell it, compared: lower case, every run
    of `-`, `_`, `.` as one `_`."""
    return re.sub(r"[-_.]+", "_", name).lower()


def _wheel(item: Any) -> tuple[str, str]:
    if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)):
        raise params.AgentError(f"each of 'wheels' must be [file name, sha256], got {item!r:.80}")
    return item[0], params.check_hash(item[1])


def _probe(venv: Path) -> _Probed:
    """The venv's Python, TensorFlow and frameworks as its own interpreter sees them: with
    system_site_packages, those of the base python count, as they do for tasks."""
    try:
        done = subprocess.run(
            [str(venv / "bin" / "python"), "-I", "-c", _PROBE],
            capture_output=True,
            text=True,
            timeout=120,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        said = f"the environment's python {venv}/bin/python does not run: {exc}"
        raise params.AgentError(said) from None
    probed = _parsed(done.stdout) if done.returncode == 0 else None
    if probed is None:
        why = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise params.AgentError(f"the environment's python {venv}/bin/python does not run: {why}")
    return probed


def _parsed(out: str) -> _Probed | None:
    """The probe's lines as values (None without its Python's): a line of another shape, or a
    framework the probe did not ask for, is left out."""
    python, tensorflow, frameworks = None, None, {}
    for words in map(str.split, out.splitlines()):
        if len(words) == 2 and words[0] == "python":
            python = words[1]
        elif len(words) == 2 and words[0] == "tensorflow":
            tensorflow = words[1]
        elif len(words) == 3 and words[0] == "framework" and words[1] in _FRAMEWORKS:
            frameworks[words[1]] = words[2]
    return None if python is None else _Probed(python, tensorflow, frameworks)
