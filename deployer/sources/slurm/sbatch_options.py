"""sbatch's long options, as the getopt_long of Slurm 22.05's sbatch reads them: data, and the
prefix rule that turns what a user wrote into the option sbatch takes it for.

sbatch accepts any unambiguous prefix of a long option (`--job-n=x` is `--job-name=x`), so
`sbatch_options` are refused by what sbatch would take them for, never by their spelling.

Where the list comes from: the lab's sbatch (slurm-wlm 22.05.8, Debian 12), by
`SlurmCluster.sbatch_long_options()` in tests/lab/slurm.py: the names `sbatch --help` and
`sbatch --usage` print and those getopt_long lists when a prefix is ambiguous (`sbatch --c`:
"option '--c' is ambiguous; possibilities: ..."), each name's argument from getopt_long's own
words ("requires an argument", "doesn't allow an argument", or neither: optional).
tests/integration/test_slurm_lab.py checks this table against that sbatch, and every prefix of
every name against what it answers. Measured there too: no two names that share a prefix are
one option (getopt_long takes the first of several candidates only when they are the same
option), so a prefix of two or more names is ambiguous, and sbatch refuses it.
"""

from __future__ import annotations

from dataclasses import dataclass

REQUIRED = "required"  # --name=VALUE (or the next word: tfdeploy asks for '=')
NONE = "none"  # --name alone
OPTIONAL = "optional"  # --name or --name=VALUE

LONG_OPTIONS: dict[str, str] = {
    "account": REQUIRED,
    "acctg-freq": REQUIRED,
    "array": REQUIRED,
    "batch": REQUIRED,
    "bb": REQUIRED,
    "bbf": REQUIRED,
    "begin": REQUIRED,
    "chdir": REQUIRED,
    "cluster": REQUIRED,
    "cluster-constraint": REQUIRED,
    "clusters": REQUIRED,
    "comment": REQUIRED,
    "constraint": REQUIRED,
    "container": REQUIRED,
    "context": REQUIRED,
    "contiguous": NONE,
    "core-spec": REQUIRED,
    "cores-per-socket": REQUIRED,
    "cpu-freq": REQUIRED,
    "cpus-per-gpu": REQUIRED,
    "cpus-per-task": REQUIRED,
    "deadline": REQUIRED,
    "delay-boot": REQUIRED,
    "dependency": REQUIRED,
    "distribution": REQUIRED,
    "error": REQUIRED,
    "exclude": REQUIRED,
    "exclusive": OPTIONAL,
    "export": REQUIRED,
    "export-file": REQUIRED,
    "extra-node-info": REQUIRED,
    "get-user-env": OPTIONAL,
    "gid": REQUIRED,
    "gpu-bind": REQUIRED,
    "gpu-freq": REQUIRED,
    "gpus": REQUIRED,
    "gpus-per-node": REQUIRED,
    "gpus-per-socket": REQUIRED,
    "gpus-per-task": REQUIRED,
    "gres": REQUIRED,
    "gres-flags": REQUIRED,
    "help": NONE,
    "hint": REQUIRED,
    "hold": NONE,
    "ignore-pbs": NONE,
    "input": REQUIRED,
    "job-name": REQUIRED,
    "kill-on-invalid-dep": REQUIRED,
    "licenses": REQUIRED,
    "mail-type": REQUIRED,
    "mail-user": REQUIRED,
    "mcs-label": REQUIRED,
    "mem": REQUIRED,
    "mem-bind": REQUIRED,
    "mem-per-cpu": REQUIRED,
    "mem-per-gpu": REQUIRED,
    "mincpus": REQUIRED,
    "network": REQUIRED,
    "nice": OPTIONAL,
    "no-kill": OPTIONAL,
    "no-requeue": NONE,
    "nodefile": REQUIRED,
    "nodelist": REQUIRED,
    "nodes": REQUIRED,
    "ntasks": REQUIRED,
    "ntasks-per-core": REQUIRED,
    "ntasks-per-gpu": REQUIRED,
    "ntasks-per-node": REQUIRED,
    "ntasks-per-socket": REQUIRED,
    "ntasks-per-tres": REQUIRED,
    "open-mode": REQUIRED,
    "output": REQUIRED,
    "overcommit": NONE,
    "oversubscribe": NONE,
    "parsable": NONE,
    "partition": REQUIRED,
    "power": REQUIRED,
    "prefer": REQUIRED,
    "priority": REQUIRED,
    "profile": REQUIRED,
    "propagate": OPTIONAL,
    "qos": REQUIRED,
    "quiet": NONE,
    "reboot": NONE,
    "requeue": NONE,
    "reservation": REQUIRED,
    "signal": REQUIRED,
    "sockets-per-node": REQUIRED,
    "spread-job": NONE,
    "switches": REQUIRED,
    "tasks-per-node": REQUIRED,
    "test-only": NONE,
    "thread-spec": REQUIRED,
    "threads-per-core": REQUIRED,
    "time": REQUIRED,
    "time-min": REQUIRED,
    "tmp": REQUIRED,
    "uid": REQUIRED,
    "usage": NONE,
    "use-min-nodes": NONE,
    "verbose": NONE,
    "version": NONE,
    "wait": NONE,
    "wait-all-nodes": REQUIRED,
    "wckey": REQUIRED,
    "wrap": REQUIRED,
}


@dataclass(frozen=True)
class Resolved:
    """What sbatch takes `--WRITTEN` for: one option (`name`), or none, or several."""

    written: str
    name: str | None  # the long option sbatch reads; None: unknown to 22.05, or ambiguous
    candidates: tuple[str, ...] = ()  # the names it may abbreviate (more than one: ambiguous)

    @property
    def ambiguous(self) -> bool:
        return len(self.candidates) > 1


def resolve(written: str) -> Resolved:
    """getopt_long's rule for `--WRITTEN` (without the dashes): an exact name wins; else the one
    name it is a prefix of; a prefix of several names is ambiguous (sbatch refuses it); a prefix
    of none is unknown here (a later Slurm's option: sbatch itself judges it)."""
    if written in LONG_OPTIONS:
        return Resolved(written, written, (written,))
    candidates = tuple(n for n in LONG_OPTIONS if n.startswith(written))
    if len(candidates) == 1:
        return Resolved(written, candidates[0], candidates)
    return Resolved(written, None, candidates)
