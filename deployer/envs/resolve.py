"""Resolving an environment on the controller: the wheels every host of one platform installs.

pip does it (`pip download --only-binary=:all:` with the host's target options), run as a
subprocess of this machine's Python in the user's own environment, so whatever this machine's
pip is configured with holds here too: `pip config list` files, `PIP_*` variables, index, extra
indexes, find-links, constraints, certificates, proxy. docs/environments.md says why pip and
not uv (docs/bench/env_tools.md has the numbers).

The result is cached by (requirements text with every file it reaches, Python, platform) and
reused until that changes or `refresh=True`: a warm `up` never waits on the index. A set that
only adds requirements to one resolved before keeps its pins, and pip resolves the added lines
alone (extend.py). Any other changed set is seeded with the wheels earlier resolutions stored
(wheelhouse.py's store), so pip fetches only the new ones.

A requirement with only a source distribution is built here (`pip wheel`) when the wheel it
makes runs on the host: a pure-Python wheel always, a platform wheel only when this machine's
platform matches the host's. Otherwise the error names the requirement and the platform,
before anything travels.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn
from urllib.parse import unquote

from deployer.core.errors import ExitStatus, TfdeployError
from deployer.core.statedir import state_dir
from deployer.envs import extend, wheelhouse
from deployer.envs.platform import HostPlatform
from deployer.envs.spec import EnvSpec, env_hash
from deployer.envs.wheelhouse import Wheelhouse, canonical

# Each sdist-only requirement costs one more pass; a longer chain than this is a loop.
MAX_PASSES = 20
_MISSING = re.compile(r"No matching distribution found for (.+?)\s*$", re.MULTILINE)
_TAIL_LINES = 15
_NAME = re.compile(r"[\s;<>=!~\[@(]")  # what ends a project name in a requirement
# pip -vv: "Found link URL (from PAGE), version: V" and "Skipping link: WHY: URL (from PAGE)";
# the link is the first URL of such a line.
_LINK = re.compile(r"(?:Found link|Skipping link:).*?(?P<url>\b(?:https?|file)://[^\s)]+)")
# A location pip could not read for another reason than "no such page".
_UNREACHABLE = re.compile(
    r"Could not fetch URL|NewConnectionError|Max retries exceeded|ProxyError|"
    r"Temporary failure in name resolution|Name or service not known|Connection refused"
)
_NOT_FOUND = re.compile(r"\b404\b|Not Found")
_TAKEN = re.compile(r"^\s*(?:File was already downloaded|Saved) (.+?)\s*$", re.MULTILINE)


class ResolveError(TfdeployError):
    """The environment cannot be resolved for a host platform; nothing was sent. Exit 3, as
    a preflight failure: these hosts cannot get this environment."""

    exit_status = ExitStatus.UNREACHABLE


@dataclass(frozen=True)
class _Pass:
    ok: bool
    output: str


def cache_root() -> Path:
    return state_dir() / "envs"


def resolve(
    spec: EnvSpec,
    target: HostPlatform,
    *,
    cache: Path | None = None,
    refresh: bool = False,
    env: Mapping[str, str] | None = None,
    pip: Sequence[str] | None = None,
    sdists: bool = True,
) -> Wheelhouse:
    """The wheelhouse of `spec` for hosts of `target`, from the cache unless `refresh`.

    `env`: the environment pip runs in (default: this process's, so the user's PIP_* hold);
    `pip`: the command that runs pip (default: this interpreter's `-m pip`); `sdists`: False
    for a requirement that must not be built here (uv: a Rust build), only downloaded.
    """
    key = env_hash(spec, target)
    root = cache or cache_root()
    final = root / key
    if not refresh and (found := wheelhouse.load(final, key)) is not None:
        return found
    environ = dict(env if env is not None else os.environ)
    lines = tuple(spec.for_target(target).splitlines())
    extension = None if refresh else extend.find(root, lines, target.describe())
    extended = extension is not None and _extend(
        root, key, spec, lines, target, environ, pip, extension
    )
    # Seeded from the wheel store unless asked afresh (`--refresh-env`: every wheel fetched).
    for reuse in () if extended else (True, False) if not refresh else (False,):
        if _attempt(root, key, spec, lines, target, environ, pip, sdists, reuse=reuse):
            break
    result = wheelhouse.load(final, key)
    assert result is not None, final  # written whole just above
    return result


def _attempt(
    root: Path,
    key: str,
    spec: EnvSpec,
    lines: tuple[str, ...],
    target: HostPlatform,
    env: dict[str, str],
    pip: Sequence[str] | None,
    sdists: bool,
    *,
    reuse: bool,
) -> bool:
    """One resolution into a new entry of `root`, seeded from its wheel store when `reuse`.
    False when a seeded wheel proved damaged (its bytes are not its sha256's): it left the
    store, and the caller resolves again unseeded."""
    work = _fresh(root / f".{key}.{os.getpid()}.tmp")
    try:
        seeded = _fill(work, spec, target, env, pip, sdists, root if reuse else None)
        house = wheelhouse.write(work, key, target.describe(), spec.text, lines)
        damaged = [w for w in house.wheels if seeded.get(w.file, w.sha256) != w.sha256]
        for w in damaged:
            wheelhouse.forget(root, seeded[w.file])
        if damaged:
            return False
        wheelhouse.share(house, wheelhouse.store_of(root))
        _replace(work, root / key)
        return True
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _extend(
    root: Path,
    key: str,
    spec: EnvSpec,
    lines: tuple[str, ...],
    target: HostPlatform,
    env: dict[str, str],
    pip: Sequence[str] | None,
    extension: extend.Extension,
) -> bool:
    """The added lines resolved against the base's pins and wheels (extend.py says why) into a
    new entry of `root`; False, and nothing written, when pip cannot (the added lines need
    other versions, or a build) or the base's wheels are not as resolved: the caller then
    resolves the whole set."""
    work = _fresh(root / f".{key}.{os.getpid()}.tmp")
    try:
        wheels = work / wheelhouse.WHEELS
        wheels.mkdir()
        for w in extension.base.wheels:
            os.link(extension.base.wheel_dir / w.file, wheels / w.file)
        pins = work / "pins.txt"
        pins.write_text(extension.pins())
        main = work / "requirements.in"
        main.write_text(extension.requirements(lines, pins))
        argv = ["download", "--only-binary=:all:", *target.pip_args()]
        argv += ["--find-links", str(wheels), "-d", str(wheels), "-r", str(main)]
        runner = _Pip(list(pip or [sys.executable, "-m", "pip"]), env, spec.base)
        if not runner.run(argv).ok:
            return False
        for scratch in (main, pins):
            scratch.unlink()
        house = wheelhouse.write(work, key, target.describe(), spec.text, lines)
        if not extend.consistent(house, extension.base):
            return False
        wheelhouse.share(house, wheelhouse.store_of(root))
        _replace(work, root / key)
        return True
    except OSError:
        return False  # the base went away under us (a prune): resolve the whole set
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _fill(
    work: Path,
    spec: EnvSpec,
    target: HostPlatform,
    env: dict[str, str],
    pip: Sequence[str] | None,
    sdists: bool = True,
    reuse: Path | None = None,
) -> dict[str, str]:
    """Downloads every wheel into work/wheels, building the sdist-only ones that may be.

    `reuse`: the cache whose stored wheels seed the download folder (wheelhouse.seed), so pip
    fetches only what no earlier resolution brought. Returns {file: sha256} of the seeded
    wheels this resolution kept (the caller checks their bytes: a damaged store is not reused).
    """
    main = work / "requirements.in"
    main.write_text(spec.for_target(target))
    runner = _Pip(list(pip or [sys.executable, "-m", "pip"]), env, spec.base)
    built = work / "built"
    built.mkdir()
    wheels = work / wheelhouse.WHEELS
    seeded = wheelhouse.seed(reuse, wheels, target.describe()) if reuse is not None else {}
    local_build = False
    for _ in range(MAX_PASSES):
        argv = ["download", "--only-binary=:all:", *target.pip_args(local_build=local_build)]
        argv += ["--find-links", str(built), "-d", str(wheels), "-r", str(main)]
        result = runner.run(argv)
        if result.ok and seeded and not _keep_used(wheels, seeded, result.output):
            shutil.rmtree(wheels)  # which seeded wheels pip took is not known: again, unseeded
            seeded = {}
            continue
        if result.ok:
            _build_named(runner, spec, target, work)
            for scratch in (built, work / "sdists", work / "build"):
                shutil.rmtree(scratch, ignore_errors=True)
            return seeded
        missing = _missing(result.output)
        if missing is not None and not sdists:
            raise ResolveError(f"{missing}: no wheel for {target.describe()}")
        if missing is None:
            raise ResolveError(_failure(result.output, target), hint=_hint(result.output))
        local_build |= _build_sdist(runner, missing, target, work, built)
    raise ResolveError(
        f"resolving for {target.describe()} did not settle after {MAX_PASSES} passes"
    )


def _keep_used(wheels: Path, seeded: dict[str, str], output: str) -> bool:
    """Removes the seeded wheels pip did not take; False when pip's words do not say which it
    took (each it took is "File was already downloaded PATH", each new one "Saved PATH", and
    "Successfully downloaded NAMES" names every project): then nothing can be trusted."""
    said = re.search(r"^Successfully downloaded (.+)$", output, re.MULTILINE)
    if said is None:
        return False
    taken = {Path(m.strip()).name for m in _TAKEN.findall(output)}
    for name in list(seeded):
        if name not in taken:
            (wheels / name).unlink(missing_ok=True)
            del seeded[name]
    present = {canonical(p.name.split("-", 1)[0]) for p in wheels.iterdir()}
    return all(canonical(n) in present for n in said.group(1).split())


def _build_sdist(
    runner: _Pip, requirement: str, target: HostPlatform, work: Path, built: Path
) -> bool:
    """Builds the sdist of a requirement that has no wheel for the target into `built`.

    True when the wheel is platform-specific (and this machine matches the host), so the next
    pass must accept this machine's `linux_<machine>` tag.
    """
    sdists, out = work / "sdists", work / "build"
    fetched = runner.run(
        ["download", "--no-deps", "--no-binary=:all:", "-vv", "-d", str(sdists), requirement]
    )
    if not fetched.ok and not _offered(fetched.output, project_of(requirement)):
        _raise_unknown(requirement, fetched.output)
    if not fetched.ok:
        raise ResolveError(
            f"{requirement}: no wheel for {target.describe()} and no source distribution",
            hint=_no_wheel_hint(requirement, target),
        )
    for sdist in sorted(sdists.iterdir()):
        _wheel_of(runner, requirement, sdist, out)
        sdist.unlink()
    return _take_built(requirement, target, out, built)


def _build_named(runner: _Pip, spec: EnvSpec, target: HostPlatform, work: Path) -> None:
    """The distributions the requirements name by path or URL, built into wheels: `pip
    download` saves a named source archive as it is and a named folder not at all, and only
    wheels are installed on a host, so without this such a requirement vanished ("0 wheels",
    the task ran without the package)."""
    wheels, out = work / wheelhouse.WHEELS, work / "named"
    wheels.mkdir(exist_ok=True)
    sources = [p for p in sorted(wheels.iterdir()) if not p.name.endswith(".whl")]
    sources += _local_folders(spec, target)
    for source in sources:
        _wheel_of(runner, str(source), source, out)
        if source.parent == wheels:
            source.unlink()
    if sources:
        _take_built(", ".join(s.name for s in sources), target, out, wheels)
    shutil.rmtree(out, ignore_errors=True)


def _local_folders(spec: EnvSpec, target: HostPlatform) -> list[Path]:
    """The project folders the requirements name (`./pkg`, `file:../x`, `x @ file:///p`)."""
    found = []
    for line in spec.for_target(target).splitlines():
        if line.startswith("-"):
            continue
        word = line.split(" @ ", 1)[1] if " @ " in line else line
        word = word.split(" ", 1)[0].split(";", 1)[0]
        if re.match(r"^\w+://", word) and not word.startswith("file:"):
            continue
        path = Path(word.removeprefix("file://").removeprefix("file:").split("#", 1)[0])
        path = path if path.is_absolute() else spec.base / path
        if path.is_dir():
            found.append(path.resolve())
    return found


def project_of(requirement: str) -> str:
    """The canonical project name a requirement names (PEP 503: runs of -_. are one -)."""
    return canonical(_NAME.split(requirement.strip(), maxsplit=1)[0])


def _offered(output: str, project: str) -> bool:
    """Some index or find-links location offered a file of `project`: pip -vv logs each link
    it takes (`Found link URL`) or passes over (`Skipping link: WHY: URL`). Only a link whose
    file is the project's counts: a find-links HTML page (PyTorch's, JAX's) lists every
    project's files, and pip passes over each of them by name for any request, so counting
    every skipped link said "no wheel for your platform" of a name no index has."""
    for line in output.splitlines():
        found = _LINK.search(line)
        if found is not None and _file_of(found.group("url"), project):
            return True
    return False


def _file_of(url: str, project: str) -> bool:
    """Whether the file a link names is a distribution of `project` (a wheel's or an sdist's
    name is the project's, normalized, before the first dash that starts its version)."""
    name = unquote(url.split("#", 1)[0].split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1])
    if name.endswith(".whl"):
        return canonical(name.split("-", 1)[0]) == project
    stem = canonical(re.sub(r"\.(tar\.gz|tar\.bz2|tgz|zip|tar)$", "", name))
    return stem.startswith(project + "-") and stem[len(project) + 1 : len(project) + 2].isdigit()


def _raise_unknown(requirement: str, output: str) -> NoReturn:
    """No location offered a file of the project. An index that answered 404 (or a page with
    none of its files) has no project of that name; an index that could not be asked at all
    (no network, a proxy refusing) proves nothing, and is said as such."""
    said = _unknown_words(output)
    if _UNREACHABLE.search(output) and not _NOT_FOUND.search(output):
        raise ResolveError(
            f"{requirement}: pip could not ask the package index about it; pip said:\n" + said,
            hint="check this machine's network and pip configuration (`pip config list`, "
            "PIP_INDEX_URL, proxy); `pip download --no-deps NAME` shows the same",
        )
    raise ResolveError(
        f"{requirement}: the package index has no package of that name; pip said:\n" + said,
        hint="check the name's spelling (`pip index versions NAME` asks the index pip uses "
        "here; a name is found as pip spells it: `scikit-learn`, not `sklearn`)",
    )


def _unknown_words(output: str) -> str:
    """pip's own lines that say so: where it looked, what the index answered, its errors."""
    said = [
        line
        for line in output.splitlines()
        if line.startswith(("Looking in", "ERROR:")) or line.startswith("Could not fetch URL")
    ]
    return "\n".join(f"  {line.strip()}" for line in said[-_TAIL_LINES:])


def _wheel_of(runner: _Pip, requirement: str, source: Path, out: Path) -> None:
    made = runner.run(["wheel", "--no-deps", "-w", str(out), str(source)])
    if not made.ok:
        raise ResolveError(
            f"{requirement}: building its source distribution {source.name} here failed:\n"
            + _tail(made.output)
        )


def _take_built(requirement: str, target: HostPlatform, out: Path, dest: Path) -> bool:
    """The wheels built into `out` moved to `dest`, each checked to run on the target. True
    when one is platform-specific (and this machine matches the host)."""
    platform_specific = False
    for wheel in sorted(out.glob("*.whl")):
        if not wheelhouse.is_pure(wheel.name):
            if not target.builds_here():
                raise ResolveError(
                    f"{requirement}: no wheel for {target.describe()}, and its source "
                    f"distribution builds a platform-specific wheel ({wheel.name}) that only runs "
                    f"on {HostPlatform.here().describe()}, this machine's platform",
                    hint=_no_wheel_hint(requirement, target),
                )
            platform_specific = True
        shutil.move(wheel, dest / wheel.name)
    return platform_specific


class _Pip:
    """pip as a subprocess, in the user's environment, from the requirements' folder."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path) -> None:
        self.argv, self.cwd = argv, cwd
        # pip's own progress and version check are noise in a captured tail.
        # Not quiet: which wheels a seeded download took is read from pip's lines (_keep_used).
        self.env = env | {
            "PIP_PROGRESS_BAR": "off",
            "PIP_DISABLE_PIP_VERSION_CHECK": "1",
            "PIP_QUIET": "0",
        }

    def run(self, args: list[str]) -> _Pass:
        try:
            r = subprocess.run(
                [*self.argv, *args],
                cwd=self.cwd,
                env=self.env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
            )
        except OSError as e:
            raise ResolveError(f"cannot run pip ({' '.join(self.argv)}): {e}") from None
        return _Pass(r.returncode == 0, r.stdout + r.stderr)


def _missing(output: str) -> str | None:
    """The requirement pip found no wheel for, unless the failure is something else."""
    if "conflicting dependencies" in output or "ResolutionImpossible" in output:
        return None
    found = _MISSING.findall(output)
    # "beta>=1 (from alpha==1.0)": the requirement, without where it came from.
    return re.sub(r"\s*\(from [^)]*\)\s*$", "", found[-1]).strip() if found else None


def _failure(output: str, target: HostPlatform) -> str:
    """pip's words, cut to what failed: a conflict's cause block, or pip's last errors."""
    if "conflicting dependencies" in output or "ResolutionImpossible" in output:
        return f"dependency conflict resolving for {target.describe()}:\n" + _conflict(output)
    if "DO NOT MATCH THE HASHES" in output or "Hashes are required" in output:
        start = output.find("ERROR: ")
        return f"hash check failed resolving for {target.describe()}:\n" + _tail(output[start:])
    return f"pip failed resolving for {target.describe()}:\n" + _tail(output)


def _conflict(output: str) -> str:
    """pip's "Cannot install ..." line and its "The conflict is caused by" block, without the
    advice after it (pip prints the two on different streams, in either order)."""
    lines = output.splitlines()
    kept = [x for x in lines if "Cannot install" in x]
    start = next((i for i, x in enumerate(lines) if "conflict is caused by" in x), len(lines))
    for line in lines[start:]:
        if line.startswith(("To fix this", "ERROR:")):
            break
        kept.append(line)
    kept = [x for x in kept if x.strip()]
    return "\n".join(f"  {x.removeprefix('ERROR: ').strip()}" for x in kept[: 2 * _TAIL_LINES])


def _tail(output: str) -> str:
    lines = [x for x in output.splitlines() if x.strip() and not x.startswith("WARNING: ")]
    return "\n".join(f"  {x.strip()}" for x in lines[-_TAIL_LINES:])


def _hint(output: str) -> str | None:
    if "conflicting dependencies" in output or "ResolutionImpossible" in output:
        return "loosen or change the pins named above so one version of each package fits all"
    return None


def _no_wheel_hint(requirement: str, target: HostPlatform) -> str:
    name = _NAME.split(requirement, maxsplit=1)[0]
    tag = (target.platform_tags() or ["pure Python"])[0]
    return (
        f"pick a version of {name} that publishes a wheel for {target.python_tag} {tag}, or "
        "build one on a machine of that platform and name the .whl file in the requirements"
    )


def _fresh(path: Path) -> Path:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def _replace(work: Path, final: Path) -> None:
    """The new entry takes the place of any old one (refresh) in one rename each."""
    old = final.with_name(f".{final.name}.{os.getpid()}.old")
    with contextlib.suppress(FileNotFoundError):
        final.rename(old)
    # Failing: another resolution of the same key landed first, and both are the same entry.
    with contextlib.suppress(OSError):
        work.rename(final)
    shutil.rmtree(old, ignore_errors=True)
