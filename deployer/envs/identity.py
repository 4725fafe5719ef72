"""What makes a venv besides its requirements, and the name that covers all of it.

A venv on a host is named by a hash (WORKDIR/envs/<hash>/) and reused whenever a job asks for
that hash, so the hash must change with everything that changes what the venv holds or sees:

- the requirements, as they read for the host's platform (spec.env_hash, which is also the
  controller's wheelhouse key: the wheels depend on nothing else);
- the base interpreter it is built over: its real path, its sys.prefix (a venv's python
  resolves to its base's binary, so the path alone cannot tell a TensorFlow venv from the bare
  system Python) and its version;
- `system_site_packages`: whether the base's packages (its TensorFlow) are visible;
- `wheels_from`: the controller's resolved wheels, or the host's own index;
- the installer (pip or uv), which may lay out the same wheels differently.

Before this, the hash covered the requirements and platform only: a venv built without
system_site_packages was reused by a job that set it, and a job on another interpreter was told
the TensorFlow of a venv built over a different one.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Interpreter:
    """The base interpreter as the host's hello saw it (the configured path when an older
    agent did not say its real path)."""

    path: str
    prefix: str
    version: str

    @classmethod
    def of(cls, configured: str, facts: Mapping[str, object]) -> Interpreter:
        path = facts.get("executable")
        prefix = facts.get("prefix")
        return cls(
            str(path) if isinstance(path, str) and path else configured,
            str(prefix) if isinstance(prefix, str) else "",
            str(facts.get("python") or ""),
        )


@dataclass(frozen=True)
class EnvIdentity:
    """One venv's identity: `requirements` is spec.env_hash (requirements and platform)."""

    requirements: str
    interpreter: Interpreter
    system_site_packages: bool
    wheels_from: str
    installer: str = "auto"

    def text(self) -> str:
        """Every field, one per line: what the venv hash is made of."""
        i = self.interpreter
        return (
            f"requirements {self.requirements}\n"
            f"interpreter {i.path}\nprefix {i.prefix}\nversion {i.version}\n"
            f"system_site_packages {str(self.system_site_packages).lower()}\n"
            f"wheels_from {self.wheels_from}\ninstaller {self.installer}\n"
        )

    @property
    def hash(self) -> str:
        """The venv's name on the host."""
        return hashlib.sha256(self.text().encode()).hexdigest()
