"""What one task runs in: the host's python, the job's environment, or a container image.

The environment and image phases of `up` decide it per task, the run keeps it (every start of
the task, restarts included, sends the same), and the start request carries it to the host's
supervisor (remote/taskops.py): one value from decision to wire, instead of a dict whose keys
each reader has to know.
"""

from __future__ import annotations

import dataclasses
import shlex
from dataclasses import dataclass

from remote import protocol


@dataclass(frozen=True)
class TaskRuntime:
    """`python`: the host's interpreter (its directory first on the task's PATH); `venv`: the
    job's environment built on the host, activated instead; `container`: the task runs in that
    image with the image's own Python, beside either."""

    python: str
    venv: str | None = None
    container: protocol.ContainerShape | None = None

    def in_container(self, container: protocol.ContainerShape | None) -> TaskRuntime:
        return dataclasses.replace(self, container=container)

    @property
    def interpreter(self) -> str:
        """The Python that runs a TF server task (`python3` inside an image)."""
        if self.container is not None:
            return "python3"
        return f"{self.venv}/bin/python" if self.venv is not None else self.python

    def server_command(self, agent_dir: str) -> str:
        """A TF server task's command: the agent's tfserver.py under this runtime's Python."""
        server = f"{agent_dir}/tfserver.py"
        return f"exec {shlex.quote(self.interpreter)} {shlex.quote(server)}"

    def apply(self, task: protocol.StartTask) -> None:
        """Sets the start item's runtime fields: `venv` or `python`, and `container`."""
        if self.venv is not None:
            task["venv"] = self.venv
        else:
            task["python"] = self.python
        if self.container is not None:
            task["container"] = self.container

    def setup_fields(self) -> dict[str, str]:
        """What `setup` commands run in on the host: `venv` or `python` (never a container)."""
        return {"venv": self.venv} if self.venv is not None else {"python": self.python}
