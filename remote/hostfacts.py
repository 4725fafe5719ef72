"""What the hello says of this host's Python: its prefix, glibc, and the versions of TensorFlow
and of the frameworks beside it (read from their install metadata, never imported: a hello
must stay fast, and importing TensorFlow takes seconds and hundreds of MB)."""

from __future__ import annotations

import os
import shutil
import sys

TF_DISTRIBUTIONS = ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tf-nightly")
FRAMEWORK_DISTRIBUTIONS = ("torch", "jax", "jaxlib", "keras")  # `frameworks` in the hello


# Non-interactive SSH commands get sshd's PATH, not a login shell's: Debian's ~/.profile adds
# these two only for logins, so a user's own nvidia-smi (or a wrapper) there is looked up too.
NVIDIA_SMI_DIRS = ("~/bin", "~/.local/bin")


def nvidia_smi() -> str | None:
    """The host's nvidia-smi (the GPU ops run it; a hello with `runs` says whether there is
    one, so `status` asks for GPU use only where it can be read)."""
    found = shutil.which("nvidia-smi")
    if found:
        return found
    for directory in NVIDIA_SMI_DIRS:
        path = os.path.join(os.path.expanduser(directory), "nvidia-smi")
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def prefix() -> str:
    """The interpreter's prefix, a venv's own when it is a venv's python. Under -S the `site`
    module, which sets sys.prefix from pyvenv.cfg, never ran: look for the file where site.venv
    looks (next to the executable, or one folder up)."""
    exe_dir = os.path.dirname(os.path.abspath(sys.executable))
    venv = os.path.dirname(exe_dir)
    for candidate in (exe_dir, venv):
        if os.path.isfile(os.path.join(candidate, "pyvenv.cfg")):
            return venv
    return sys.prefix


def glibc() -> str | None:
    """The C library's glibc version ("2.36"), None without glibc (musl): which manylinux
    wheels this host installs (the controller resolves for it)."""
    try:
        said = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError):
        return None
    name, _, version = said.partition(" ")
    return version if name == "glibc" and version else None


def tensorflow_version() -> str | None:
    """Read from package metadata: importing TensorFlow costs seconds and half a gigabyte."""
    found = _dist_info_version()
    if found is not None:
        return found
    # No wheel-style dist-info found: the general (and ~35 ms of CPU slower) lookup, with the
    # site-packages that the -S bootstrap did not put on sys.path.
    import site

    site.main()
    from importlib import metadata

    for dist in TF_DISTRIBUTIONS:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def _dist_info_version() -> str | None:
    """`tensorflow_cpu-2.21.0.dist-info` in a site-packages directory: one listdir per directory.

    importlib.metadata answers the same but costs ~35 ms of host CPU in its imports and scans, more
    than the rest of hello; on 100 hosts that is most of preflight.
    """
    found = _dist_info_versions({d.replace("-", "_") for d in TF_DISTRIBUTIONS})
    return next(iter(found.values()), None)


def framework_versions() -> dict[str, str]:
    """The frameworks beside TensorFlow this python has (docs/frameworks.md), by their wheels'
    dist-info: what preflight checks a torch, jax or keras job's host python against."""
    return _dist_info_versions(set(FRAMEWORK_DISTRIBUTIONS))


def _dist_info_versions(wanted: set[str]) -> dict[str, str]:
    """Normalized distribution name -> version, for the `wanted` ones found, the first
    directory on the path winning."""
    import site

    prefixes = [sys.prefix]
    exe_dir = os.path.dirname(os.path.abspath(sys.executable))
    for cfg in (os.path.join(exe_dir, "pyvenv.cfg"), os.path.join(exe_dir, "..", "pyvenv.cfg")):
        if os.path.isfile(cfg):  # a venv: under -S, site did not make it sys.prefix
            with open(cfg, encoding="utf-8") as f:
                system = "include-system-site-packages = true" in f.read().lower()
            venv = os.path.dirname(os.path.abspath(cfg))
            prefixes = [venv, *prefixes] if system else [venv]
            break
    version = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    dirs = [os.path.join(p, "lib", version, "site-packages") for p in prefixes]
    dirs += [*site.getsitepackages(prefixes), site.getusersitepackages(), *sys.path]
    found: dict[str, str] = {}
    for directory in dict.fromkeys(dirs):
        try:
            names = os.listdir(directory or ".")
        except OSError:
            continue
        for name in names:
            if name.endswith(".dist-info"):
                dist, _, number = name[: -len(".dist-info")].partition("-")
                dist = dist.lower().replace("-", "_").replace(".", "_")
                if dist in wanted and number:
                    found.setdefault(dist, number)
    return found
