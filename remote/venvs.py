"""A job's Python environment on a host: one venv per environment hash, built offline, once.

WORKDIR/envs/<hash>/ is the venv. It counts as built only when its `.complete` marker exists,
and the marker is written last. A venv cannot be built elsewhere and renamed into place: its
scripts' shebangs, `pyvenv.cfg` and `bin/activate` hold its absolute path, so a moved venv runs
the wrong (or no) interpreter. Instead the build happens at the final path, under a lock, and a
directory there without the marker is a half-built env: never used, and removed by the next
build before it starts.

The lock is sharedlock.SharedLock (an atomic mkdir with owner and heartbeat, see there for why
not fcntl): on an NFS/EFS home shared by several hosts, one host builds and the others wait and
reuse; two jobs on one host likewise. Each use of a built env leaves WORKDIR/envs/<hash>/.uses/
<run id> (one file per run: no appends racing across hosts), whose mtimes say when it was last
used, for pruning.

Wheels arrive as contents of the store (WORKDIR/store/<sha256>); `link_wheels` gives them their
file names (hard links) in a directory pip and uv read with `--find-links`.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import bytecode
import installers
import sharedlock

COMPLETE = ".complete"
USES = ".uses"
UV_CACHE = "uv-cache"
WHEELS = "wheels"
INSTALLERS = ("auto", "uv", "pip")
_HASH_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_WHEEL_RE = re.compile(r"[A-Za-z0-9_.+!-]+\.whl")
_PROBE = (
    "import sys, site, importlib.util as u; print(sys.version.split()[0]); "
    "print(*[m for m in ('venv', 'ensurepip') if u.find_spec(m) is None]); "
    "print(*(site.getsitepackages() if sys.prefix != sys.base_prefix else []))"
)
BASE_PTH = "_tfdeploy_base_venv.pth"


class EnvError(Exception):
    """An environment that cannot be built here; the message says what and the fix."""


def envs_dir(workdir: Path) -> Path:
    return workdir / "envs"


def env_path(workdir: Path, env_hash: str) -> Path:
    if not _HASH_RE.fullmatch(env_hash):
        raise EnvError(f"environment hash {env_hash!r} is not allowed: letters, digits, . _ -")
    return envs_dir(workdir) / env_hash


def uv_cache(workdir: Path, host_id: str) -> Path:
    """This host's uv cache, WORKDIR/hosts/<host>/uv-cache: a new environment that shares
    wheels with an earlier one links them from here instead of unpacking them again. One per
    host, never shared across hosts of a shared workdir: uv's cache locks are file locks, which
    an NFS/EFS home cannot be trusted with across machines. Only a speed-up: prune may empty
    it at any time a build does not hold it (prune.py)."""
    return workdir / "hosts" / host_id / UV_CACHE


def is_complete(venv: Path) -> bool:
    """Built to the end. Listing the directory first makes an NFS client revalidate it, so a
    marker another host wrote a moment ago is seen (close-to-open consistency)."""
    try:
        return COMPLETE in os.listdir(str(venv))
    except OSError:
        return False


def wheels_dir(workdir: Path, host_id: str) -> Path:
    """This host's wheel directory, WORKDIR/hosts/<host>/wheels: every environment's wheels
    under their file names, hard links into the store. One directory for all environments,
    because uv's cache knows a `--find-links` wheel by its directory: a second environment that
    names the same wheel in the same directory links it from the cache (uv_cache); named from
    another directory, uv unpacks it again. The pinned requirements (name==version, hash) pick
    each environment's own wheels among the others'."""
    return workdir / "hosts" / host_id / WHEELS


def link_wheels(store: Path, wheels: Sequence[tuple[str, str]], dest: Path) -> Path:
    """A directory of the wheels [(file name, sha256)], hard links into the store (copies where
    the file system has none), for `--find-links`. A name already there for other bytes (a
    local wheel rebuilt under the same version) is replaced."""
    dest.mkdir(parents=True, exist_ok=True)
    for name, digest in wheels:
        if not _WHEEL_RE.fullmatch(name) or name.startswith("."):
            raise EnvError(f"{name!r} is not a wheel file name")
        source, target = store / digest, dest / name
        try:
            held = os.stat(str(source))
        except FileNotFoundError:
            raise EnvError(f"the store lacks the wheel {name} ({digest[:12]})") from None
        with contextlib.suppress(FileNotFoundError):
            there = os.stat(str(target))
            if (there.st_dev, there.st_ino) == (held.st_dev, held.st_ino) or (
                there.st_size,
                there.st_mtime_ns,
            ) == (held.st_size, held.st_mtime_ns):
                continue  # this content (its link, or its copy with the store's mtime)
        tmp = dest / f".{name}.{os.getpid()}.{os.urandom(3).hex()}"
        try:
            os.link(str(source), str(tmp))
        except OSError:
            shutil.copy2(str(source), str(tmp))
        os.replace(str(tmp), str(target))
    return dest


def record_use(venv: Path, run_id: str) -> None:
    """Marks the env as used by run_id now (this host's clock): prune keeps what runs use."""
    uses = venv / USES
    uses.mkdir(mode=0o700, exist_ok=True)
    path = uses / run_id
    os.close(os.open(str(path), os.O_WRONLY | os.O_CREAT, 0o600))
    now = time.time()
    os.utime(str(path), (now, now))


def last_used(venv: Path) -> float | None:
    try:
        return max((e.stat().st_mtime for e in os.scandir(str(venv / USES))), default=None)
    except OSError:
        return None


def ensure(
    workdir: Path,
    env_hash: str,
    *,
    python: str,
    requirements: str,
    wheels: Path,
    host_id: str,
    run_id: str | None = None,
    system_site_packages: bool = False,
    installer: str = "auto",
    on_wait: Callable[[dict[str, Any]], None] | None = None,
    online: bool = False,
) -> dict[str, Any]:
    """The venv of env_hash, built now if no complete one is there; what happened.

    Returns {"venv", "built", "waited", "installer", "seconds"} ("installer" is None when the
    env was reused). Raises EnvError for anything the user must fix. `online`: pip installs
    with the host's own configuration (index, mirror) instead of from `wheels` alone.
    """
    if installer not in INSTALLERS:
        raise EnvError(f"installer {installer!r} is not one of {', '.join(INSTALLERS)}")
    venv = env_path(workdir, env_hash)
    waited = []
    result = {"venv": str(venv), "built": False, "installer": None, "seconds": 0.0}
    if run_id is not None and is_complete(venv):
        # The use first, then the marker: a prune (prune.py) removing the venv meanwhile either
        # sees this record and puts the venv back, or removed it first and this finds none.
        with contextlib.suppress(FileNotFoundError):
            record_use(venv, run_id)
    if not is_complete(venv):
        envs = _make_dirs(envs_dir(workdir))
        lock = sharedlock.SharedLock(envs / f"{env_hash}.lock", host_id)

        def told(owner: dict[str, Any]) -> None:
            waited.append(owner)
            if on_wait is not None:
                on_wait(owner)

        with lock.held(told):
            if not is_complete(venv):
                started = time.monotonic()
                _clean_leftovers(envs, env_hash, host_id)
                spec = _Build(venv, python, requirements, wheels, system_site_packages, installer)
                spec.online = online
                result["installer"] = _build(spec, lock, host_id)
                result.update(built=True, seconds=round(time.monotonic() - started, 3))
    if run_id is not None:
        record_use(venv, run_id)
    result["waited"] = bool(waited)
    return result


class _Build:
    def __init__(
        self, venv: Path, python: str, reqs: str, wheels: Path, system: bool, installer: str
    ) -> None:
        self.venv, self.python, self.requirements, self.wheels = venv, python, reqs, wheels
        self.system_site_packages, self.installer = system, installer
        self.version = "?"
        self.online = False
        self.work = venv.with_name(f".work-{venv.name}-{os.getpid()}-{os.urandom(3).hex()}")


def _build(spec: _Build, lock: sharedlock.SharedLock, host_id: str) -> str:
    """Builds spec.venv; on any failure nothing of it is left. The installer used."""
    try:
        spec.work.mkdir(mode=0o700)
        version, missing, base_sites = _probe_all(spec.python)
        spec.version = version
        uv = (
            None
            if spec.installer == "pip" or spec.online
            else installers.uv_binary(spec.wheels, spec.work)
        )
        if uv is None and spec.installer == "uv":
            raise EnvError(f"no uv wheel that runs on this host among {spec.wheels}")
        if missing and (uv is None or "venv" in missing):
            raise EnvError(_no_venv(spec.python, version, missing))
        reqs = spec.work / "requirements.txt"
        reqs.write_text(spec.requirements)

        def started(pid: int) -> None:
            _write_json(spec.work / "installer.json", {"host": host_id, "pgid": pid})

        argv = [spec.python, "-m", "venv"] + (["--without-pip"] if uv else [])
        argv += ["--system-site-packages"] if spec.system_site_packages else []
        installers.run([*argv, str(spec.venv)], _plain_env(), started)
        if spec.system_site_packages and base_sites:
            _see_base_venv(spec.venv, version, base_sites)
        if uv is not None:
            cache = uv_cache(spec.venv.parent.parent, host_id)
            installers.uv_install(uv, spec.venv, spec.wheels, reqs, cache, started)
            store = bytecode.store_dir(spec.venv.parent.parent, host_id)
            bytecode.seed(spec.venv, version, _siblings(spec.venv), store)
        else:
            installers.pip_install(spec.venv, spec.wheels, reqs, started, spec.online)
        lock.check()
        _write_json(spec.venv / COMPLETE, {"python": version, "installer": (uv and "uv") or "pip"})
        return "uv" if uv else "pip"
    except BaseException as exc:
        shutil.rmtree(str(spec.venv), ignore_errors=True)
        error = _explain(exc, spec)
        if error is not None:
            raise error from exc
        raise
    finally:
        shutil.rmtree(str(spec.work), ignore_errors=True)


SEED_FROM = 3  # environments whose bytecode a new one may start with: the last used


def _siblings(venv: Path) -> list[Path]:
    """The host's other built environments, the most recently used first."""
    try:
        built = [p for p in venv.parent.iterdir() if p != venv and is_complete(p)]
    except OSError:
        return []
    return sorted(built, key=lambda p: last_used(p) or 0.0, reverse=True)[:SEED_FROM]


def _explain(exc: BaseException, spec: _Build) -> EnvError | None:
    """The sentence for an expected failure (None: let it propagate as it is)."""
    where = spec.venv.parent
    full = (isinstance(exc, OSError) and exc.errno == errno.ENOSPC) or (
        isinstance(exc, installers.InstallFailed) and exc.disk_full
    )
    if full:
        free = shutil.disk_usage(str(where)).free if where.exists() else 0
        return EnvError(
            f"{installers.ENOSPC_TEXT} in {where} while installing the environment "
            f"{spec.venv.name} ({free // (1 << 20)} MiB free): the half-built environment "
            "was removed; free space there or set a workdir on a larger disk"
        )
    if (
        isinstance(exc, installers.InstallFailed)
        and exc.tool == "venv"
        and "ensurepip" in exc.output
    ):
        return EnvError(_no_venv(spec.python, spec.version, ["ensurepip"]))
    if isinstance(exc, installers.InstallFailed):
        said = "\n  ".join(exc.lines)
        return EnvError(f"{exc.tool} could not build the environment {spec.venv.name}:\n  {said}")
    if isinstance(exc, sharedlock.LockLost):
        return EnvError(f"{exc}; the environment {spec.venv.name} was not finished here")
    if isinstance(exc, OSError):
        return EnvError(f"cannot build the environment in {where}: {exc}")
    return exc if isinstance(exc, EnvError) else None


def _probe(python: str) -> tuple[str, list[str]]:
    """(version, missing modules among venv/ensurepip) of the base interpreter."""
    version, missing, _ = _probe_all(python)
    return version, missing


def _probe_all(python: str) -> tuple[str, list[str], list[str]]:
    """Also the base's own site-packages when it is itself a venv (see _see_base_venv)."""
    try:
        done = subprocess.run(
            [python, "-I", "-c", _PROBE], capture_output=True, text=True, timeout=60
        )
    except OSError as exc:
        raise EnvError(f"cannot run the host's python {python}: {exc}") from exc
    lines = done.stdout.splitlines()
    if done.returncode != 0 or not lines:
        said = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise EnvError(f"the host's python {python} does not run: {said[0]}")
    return (
        lines[0],
        (lines[1].split() if len(lines) > 1 else []),
        (lines[2].split() if len(lines) > 2 else []),
    )


def _see_base_venv(venv: Path, version: str, sites: list[str]) -> None:
    """`--system-site-packages` on a python that is itself a venv (an AMI's or the user's TF
    venv) would see only the base *installation's* packages, not that venv's: a .pth file makes
    the base venv's site-packages visible too, after the job's own packages."""
    minor = ".".join(version.split(".")[:2])
    target = venv / "lib" / f"python{minor}" / "site-packages" / BASE_PTH
    target.write_text("".join(f"{site}\n" for site in sites))


def _no_venv(python: str, version: str, missing: list[str]) -> str:
    minor = ".".join(version.split(".")[:2])
    return (
        f"{python} (Python {version}) lacks {' and '.join(missing)}, which building the job's "
        f"environment needs: install the package python{minor}-venv (or python3-venv) on the "
        "host (Debian, Ubuntu: apt-get install python3-venv), or send a uv wheel with it"
    )


def _plain_env() -> dict[str, str]:
    """The build's environment: no PYTHON* variable may point the interpreter elsewhere."""
    return {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}


def _clean_leftovers(envs: Path, env_hash: str, host_id: str) -> None:
    """Removes what a killed build of env_hash left: its installer (still running, if it was on
    this host), its work directory and its half-built venv. Called under the env's lock."""
    for work in envs.glob(f".work-{env_hash}-*"):
        _stop_installer(work / "installer.json", host_id)
        shutil.rmtree(str(work), ignore_errors=True)
    shutil.rmtree(str(envs / env_hash), ignore_errors=True)


def _stop_installer(record: Path, host_id: str) -> None:
    try:
        owner = json.loads(record.read_text())
    except (OSError, ValueError):
        return
    if owner.get("host") == host_id and isinstance(owner.get("pgid"), int):
        with contextlib.suppress(OSError):  # gone already
            os.killpg(owner["pgid"], signal.SIGKILL)
        for _ in range(50):  # its files must stop appearing before the tree is removed
            try:
                os.killpg(owner["pgid"], 0)
            except OSError:
                return
            time.sleep(0.02)


def _make_dirs(path: Path) -> Path:
    for directory in reversed([path, *path.parents]):
        if not directory.exists():
            with contextlib.suppress(FileExistsError):  # another host of a shared workdir
                directory.mkdir(mode=0o700)
    return path


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(str(tmp), str(path))


def main(argv: list[str] | None = None) -> int:
    """`python venvs.py build ...`: one ensure() from the command line, its result as JSON."""
    parser = argparse.ArgumentParser(prog="venvs.py")
    parser.add_argument("action", choices=["build"])
    parser.add_argument("--workdir", required=True, type=Path)
    parser.add_argument("--hash", required=True)
    parser.add_argument("--python", required=True)
    parser.add_argument("--wheels", required=True, type=Path)
    parser.add_argument("--requirements", required=True, type=Path)
    parser.add_argument("--run-id")
    parser.add_argument("--host-id")
    parser.add_argument("--installer", default="auto", choices=INSTALLERS)
    parser.add_argument("--system-site-packages", action="store_true")
    args = parser.parse_args(argv)
    if args.host_id is None:
        import hostid

        args.host_id = hostid.identity()
    try:
        result = ensure(
            Path(os.path.abspath(os.path.expanduser(str(args.workdir)))),
            args.hash,
            python=args.python,
            requirements=args.requirements.read_text(),
            wheels=args.wheels,
            host_id=args.host_id,
            run_id=args.run_id,
            system_site_packages=args.system_site_packages,
            installer=args.installer,
            on_wait=lambda owner: print(json.dumps({"waiting": owner}), flush=True),
        )
    except EnvError as exc:
        print(json.dumps({"error": str(exc)}), flush=True)
        return 1
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
