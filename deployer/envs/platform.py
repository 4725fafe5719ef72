"""A host's facts as pip's target options: which wheels its Python can install.

The controller resolves for its hosts, whatever its own OS, so pip must be told the host's
interpreter and platform instead of reading this machine's (`pip download --python-version
--implementation --abi --platform`). A glibc host installs any manylinux wheel whose glibc is
not newer than its own (PEP 600), so every `manylinux_2_X` from 2_17 up to the host's glibc is
listed, with the legacy aliases of the old ones (manylinux2014 = 2_17, manylinux2010 = 2_12,
manylinux1 = 2_5). A host without glibc (musl) gets only `musllinux`/pure wheels: it is named
here so the error says so rather than offering wheels that would not load.
"""

from __future__ import annotations

import platform as _platform
import re
import sys
from dataclasses import dataclass

# The oldest manylinux glibc still built for (manylinux2014); older ones only through aliases.
OLDEST_GLIBC_MINOR = 17
# The newest glibc minor taken from a host (glibc is at 2.42 in 2025): one tag is listed per
# minor, and "2.999999999" from a hostile host listed a billion (the reply edge refuses it first,
# deployer/hosts/reply_bounds.py; this bound holds for facts from anywhere else, the cache too).
NEWEST_GLIBC_MINOR = 100
_PYTHON = re.compile(r"\s*([0-9]{1,2})\.([0-9]{1,3})(\.[0-9]{1,4})?\S{0,16}\s*")
# Legacy aliases (PEP 599/571/513): glibc minor each stands for, and where it exists.
_ALIASES = (
    ("manylinux2014", 17, ("x86_64", "i686", "aarch64", "armv7l", "ppc64", "ppc64le", "s390x")),
    ("manylinux2010", 12, ("x86_64", "i686")),
    ("manylinux1", 5, ("x86_64", "i686")),
)
_MACHINES = {"amd64": "x86_64", "arm64": "aarch64"}


@dataclass(frozen=True)
class HostPlatform:
    """What decides which wheels a host can install: its Python and its platform.

    `glibc` is (2, minor), or None for a host without glibc (Alpine's musl): such a host
    installs pure wheels only, here.
    """

    python: tuple[int, int]
    machine: str
    glibc: tuple[int, int] | None
    implementation: str = "cp"
    # For markers on `python_full_version` only: wheels are chosen by (major, minor).
    full_version: str = ""

    @classmethod
    def of(cls, python: str, machine: str, glibc: str | None) -> HostPlatform:
        """From facts as preflight reports them: "3.9.18", "aarch64", "2.31" (or None)."""
        match = _PYTHON.fullmatch(python)
        if match is None:
            raise ValueError(f"not a Python version: {python!r:.40}")
        major, minor = int(match.group(1)), int(match.group(2))
        full = python.strip() if match.group(3) else f"{major}.{minor}.0"
        return cls((major, minor), normalize_machine(machine), _glibc(glibc), "cp", full)

    def marker_environment(self) -> dict[str, str]:
        """PEP 508's marker variables as they read on the host (a Linux CPython)."""
        return {
            "implementation_name": "cpython",
            "implementation_version": self.full_version,
            "os_name": "posix",
            "platform_machine": self.machine,
            "platform_python_implementation": "CPython",
            "platform_release": "",
            "platform_system": "Linux",
            "platform_version": "",
            "python_full_version": self.full_version,
            "python_version": self.version,
            "sys_platform": "linux",
        }

    @classmethod
    def here(cls) -> HostPlatform:
        """This machine's own, for "does this machine's platform match the host's"."""
        libc, version = _platform.libc_ver()
        glibc = version if libc == "glibc" else None
        return cls.of(_platform.python_version(), _platform.machine(), glibc)

    @property
    def python_tag(self) -> str:
        return f"{self.implementation}{self.python[0]}{self.python[1]}"

    @property
    def version(self) -> str:
        return f"{self.python[0]}.{self.python[1]}"

    def platform_tags(self) -> list[str]:
        """Every platform tag the host accepts, most specific first (pip's order)."""
        if self.glibc is None:
            return []
        newest = min(self.glibc[1], NEWEST_GLIBC_MINOR)  # never a billion tags, whoever built it
        tags = [
            f"manylinux_2_{minor}_{self.machine}"
            for minor in range(newest, OLDEST_GLIBC_MINOR - 1, -1)
        ]
        for alias, minor, machines in _ALIASES:
            if self.glibc[1] >= minor and self.machine in machines:
                tags.append(f"{alias}_{self.machine}")
        return tags

    def pip_args(self, *, local_build: bool = False) -> list[str]:
        """pip's target options. `local_build`: also the `linux_<machine>` tag of wheels that
        `pip wheel` builds here, when this machine's platform matches the host's."""
        tags = self.platform_tags() + ([f"linux_{self.machine}"] if local_build else [])
        if not tags:
            tags = ["any"]  # pip needs one --platform; pure wheels match every platform
        args = ["--python-version", self.version, "--implementation", self.implementation]
        for abi in (self.python_tag, "abi3", "none"):
            args += ["--abi", abi]
        for tag in tags:
            args += ["--platform", tag]
        return args

    def describe(self) -> str:
        """For messages: "CPython 3.9, manylinux_2_31_aarch64"."""
        libc = (
            f"manylinux_2_{self.glibc[1]}_{self.machine}"
            if self.glibc
            else f"{self.machine} (no glibc)"
        )
        return f"CPython {self.version}, {libc}"

    def key(self) -> str:
        """What the resolution depends on, for the cache key."""
        libc = f"glibc{self.glibc[0]}.{self.glibc[1]}" if self.glibc else "noglibc"
        return f"{self.python_tag}-{self.machine}-{libc}"

    def builds_here(self) -> bool:
        """Whether a wheel built on this machine runs on the host: same interpreter and
        machine, and this machine's glibc not newer than the host's."""
        here = HostPlatform.here()
        if sys.implementation.name != "cpython" or here.implementation != self.implementation:
            return False
        if (here.python, here.machine) != (self.python, self.machine):
            return False
        return here.glibc is not None and self.glibc is not None and here.glibc <= self.glibc


def normalize_machine(machine: str) -> str:
    m = machine.strip().lower()
    return _MACHINES.get(m, m)


def _glibc(text: str | None) -> tuple[int, int] | None:
    if not text:
        return None
    match = re.fullmatch(r"\s*([0-9]{1,2})\.([0-9]{1,3})\S{0,32}\s*", text)
    if match is None or int(match.group(2)) > NEWEST_GLIBC_MINOR:
        raise ValueError(f"not a glibc version: {text!r:.40}")
    return int(match.group(1)), int(match.group(2))
