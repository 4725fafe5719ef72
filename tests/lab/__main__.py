"""`python -m tests.lab up N --inventory FILE` / `down [ID]` / `list`: the lab for people."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import tests.lab
from tests.lab import LabError, cleanup, start_lab, visible
from tests.lab import containers as lab_containers
from tests.support.lab_inventories import write_slurm_inventory

# The README's first multi-host run: the bundled MWMS example, its checkpoints as artifacts.
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "digits"


def _up(args: argparse.Namespace) -> int:
    isolated = tests.lab.lab_mode() == "netns"
    # The hosts run the interpreter that started the lab (or --python): the quick start's .venv
    # or /opt/tfdeploy/venv, whichever has TensorFlow. They see this machine's files but /root
    # and /tmp: one that lives there (pyenv's) is refused or replaced before any host starts.
    choice = visible.choose(args.python, isolated=isolated)
    if args.containers and (why := lab_containers.available()) is not None:
        raise LabError(f"--containers: {why}")
    if choice.note is not None:
        print(f"note: {choice.note}")
    if args.proctrack != "cgroup" and not args.slurm:
        raise LabError("--proctrack is the Slurm cluster's: give --slurm too")
    if args.adopt and (not args.slurm or args.proctrack != "cgroup"):
        raise LabError("--adopt needs the cgroup Slurm cluster: give --slurm (not linuxproc)")
    lab = start_lab(
        args.n,
        args.topology,
        persistent=True,
        containers=args.containers,
        slurm=args.slurm,
        slurm_proctrack=args.proctrack,
        slurm_adopt=args.adopt,
    )
    tasks = [[{"role": "worker"}] for _ in lab.hosts]
    job = {
        "name": "digits",
        "code": str(Path(args.code).resolve()),
        "command": args.command,
        "python": choice.python,
        "artifacts": ["ckpt/**"],
    }
    user = lab.login_user if args.as_user else None
    if args.slurm:  # the login node reached over SSH, the compute nodes allocated by `up`
        inventory = write_slurm_inventory(lab, args.inventory, job=job, user=user)
    else:
        inventory = lab.write_inventory(args.inventory, tasks=tasks, job=job, user=user)
    kind = ("namespaces" if lab.isolated else "loopback") + (", podman" if args.containers else "")
    print(f"lab {lab.id} up: {len(lab.hosts)} hosts ({kind})")
    for h in lab.all_hosts:
        print(f"  {h.name:8} {h.address}:{h.port}  hostname {h.hostname}")
    print(f"inventory:  {inventory} (as {user or lab.user})")
    print(f"ssh:        ssh -F {lab.ssh_config} {lab.hosts[0].name}")
    if args.containers:
        print(f"podman:     CONTAINERS_CONF={lab.dir / 'containers.conf'} (this machine's podman)")
    slurm = getattr(lab, "slurm", None)
    if slurm is not None:
        print(f"slurm:      login node {slurm.login.name} {slurm.login.address} (slurmctld)")
        print(f"            process tracking: proctrack/{slurm.proctrack}")
        if slurm.adopt:
            print(
                "            compute nodes' sshd behind pam_slurm_adopt: "
                f"{lab.login_user} logs in to a node only while a job of theirs runs there"
            )
        print(f"            compute nodes {', '.join(h.name for h in slurm.nodes)} (slurmd)")
        print(f"            ssh -F {lab.ssh_config} {slurm.login.name} squeue")
        print(f"            outside the hosts: SLURM_CONF={slurm.conf_dir / 'slurm.conf'} squeue")
        print(f"            shared folder for job files: {slurm.shared}")
        print(f"            tfdeploy up {inventory} (a [slurm] inventory: docs/slurm.md)")
    print(f"stop with:  python -m tests.lab down {lab.id}")
    return 0


def _down(args: argparse.Namespace) -> int:
    ids = sorted(cleanup.all_ids()) if args.all else args.ids
    if not ids:
        print("nothing to stop (give a lab id, or --all)", file=sys.stderr)
        return 2
    for lab_id in ids:
        state = cleanup.read_state(lab_id) or {}
        owner = state.get("owner")
        if owner and cleanup.is_alive(lab_id) and not args.all:
            print(f"lab {lab_id} belongs to a running test (pid {owner['pid']}); skipped")
            continue
        cleanup.destroy(lab_id, subnets=state.get("unreachable", []))
        print(f"lab {lab_id} down")
    return 0


def _list(args: argparse.Namespace) -> int:
    for lab_id in sorted(cleanup.all_ids()):
        state = cleanup.read_state(lab_id) or {}
        hosts = ", ".join(f"{h['name']}={h['address']}" for h in state.get("hosts", []))
        alive = "alive" if cleanup.is_alive(lab_id) else "stale"
        print(f"{lab_id}  {alive}  {cleanup.lab_dir(lab_id)}  {hosts}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.lab", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start a lab that outlives this command")
    up.add_argument("n", type=int, help="number of hosts")
    up.add_argument("--topology", choices=["flat", "bastion"], default="flat")
    up.add_argument("--inventory", default="lab.toml", help="where to write the inventory")
    up.add_argument("--code", default=str(EXAMPLE), help="job.code of the inventory")
    up.add_argument("--command", default="python3 mwms.py", help="job.command of the inventory")
    up.add_argument(
        "--as-user",
        action="store_true",
        help="the inventory logs in as the lab's non-root user (private home on each host)",
    )
    up.add_argument(
        "--slurm",
        action="store_true",
        help="run a Slurm cluster: h1 the login node (slurmctld), the others compute nodes",
    )
    up.add_argument(
        "--proctrack",
        choices=("linuxproc", "cgroup"),
        default="cgroup",
        help="the Slurm cluster's process tracking: cgroup (default: proctrack/cgroup + "
        "task/cgroup, as production clusters run) or linuxproc (no cgroups)",
    )
    up.add_argument(
        "--adopt",
        action="store_true",
        help="the compute nodes' sshd behind pam_slurm_adopt (with the cgroup tracking): the "
        "non-root user logs in to a node only while a job of theirs runs there",
    )
    up.add_argument(
        "--python",
        default=sys.executable,
        help="the hosts' interpreter (default: this one), replaced or refused if hidden from them",
    )
    up.add_argument(
        "--containers",
        action="store_true",
        help="container-ready hosts: podman in each, own image store (root; docs/containers.md)",
    )
    down = sub.add_parser("down", help="stop labs by id")
    down.add_argument("ids", nargs="*")
    down.add_argument(
        "--all", action="store_true", help="every lab of this machine, also live ones"
    )
    sub.add_parser("list", help="show the labs of this machine")
    args = parser.parse_args(argv)
    try:
        return {"up": _up, "down": _down, "list": _list}[args.cmd](args)
    except LabError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
