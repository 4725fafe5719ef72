"""Pythons of this machine older than the controller's, for the host side (3.8+)."""

from __future__ import annotations

import glob
import os


def old_pythons() -> list[str]:
    """Python 3.8 and 3.9 builds on this machine (pyenv shims excluded).

    3.8 is the oldest the agent supports; 3.9 is the system Python of Amazon Linux 2023,
    Debian 11 and RHEL 9.
    """
    found = []
    for version in ("3.8", "3.9"):
        for pattern in ("/usr/bin/python{}", "/usr/local/bin/python{}"):
            found += glob.glob(pattern.format(version))
        pyenv = f"~/.pyenv/versions/{version}.*/bin/python{version}"
        found += glob.glob(os.path.expanduser(pyenv))
    return sorted(found)
