"""What preflight demands of each host's facts; nothing starts anywhere unless every host passes."""

from __future__ import annotations

from collections.abc import Mapping

from deployer.errors import HostError, HostsFailed
from deployer.inventory import Job
from deployer.sync import Manifest

MIN_FREE_DISK = 100 * 1024 * 1024


def agreed_tensorflow(facts: Mapping[str, Mapping[str, object]]) -> list[str]:
    """The TensorFlow version the hosts share; hosts that disagree would fail mid-training."""
    versions = {name: f.get("tensorflow") for name, f in facts.items()}
    known = {str(v) for v in versions.values() if v}
    if len(known) > 1:
        raise HostsFailed(
            [HostError(n, f"TensorFlow {v or 'missing'}") for n, v in sorted(versions.items())],
            what="hosts disagree on the TensorFlow version",
        )
    return sorted(known)


def host_problems(
    host: str, facts: Mapping[str, object], *, python: str, job: Job, manifest: Manifest
) -> list[HostError]:
    """Busy TF ports, a missing TensorFlow (unless setup may install it), too little disk."""
    problems = []
    busy = facts.get("busy_ports") or []
    if busy:
        ports = ", ".join(str(p) for p in busy)  # type: ignore[attr-defined]
        problems.append(
            HostError(
                host,
                f"TF port(s) {ports} already in use",
                hint="stop what holds them (`tfdeploy status` lists runs) or set another port",
            )
        )
    if not facts.get("tensorflow") and not job.setup:
        problems.append(
            HostError(
                host,
                f"TensorFlow is not installed for {python}",
                hint="install tensorflow on the host or add it to job.setup",
            )
        )
    free = int(facts.get("disk_free") or 0)  # type: ignore[call-overload]
    needed = MIN_FREE_DISK + 2 * manifest.total_bytes
    if free < needed:
        problems.append(
            HostError(
                host,
                f"only {free // 2**20} MiB free in {facts.get('workdir')}, "
                f"need {needed // 2**20} MiB",
            )
        )
    return problems
