"""The lab's real Slurm cluster itself (tests/lab/slurm.py): what tfdeploy's Slurm source and
its tests rely on, checked against slurmctld/slurmd as they run here."""

from __future__ import annotations

from tests.lab import SlurmCluster


def test_batch_job_runs_on_both_nodes(slurm: SlurmCluster) -> None:
    out = slurm.shared / "both.out"
    job = slurm.sbatch(f"-N2 --ntasks-per-node=1 -o {out} --wrap 'srun hostname'")
    slurm.wait_job(job, "COMPLETED", timeout=60)
    names = sorted(out.read_text().split())
    assert names == sorted(h.hostname for h in slurm.nodes)


def test_srun_across_both_nodes(slurm: SlurmCluster) -> None:
    out = slurm.check("srun -N2 -n2 sh -c 'echo $SLURM_PROCID $SLURMD_NODENAME'")
    assert sorted(out.split("\n")[:2]) == ["0 h2", "1 h3"], out
