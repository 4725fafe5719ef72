"""Slurm's outputs and a [slurm] table as the lab's Slurm 22.05 prints and tfdeploy reads them,
shared by the Slurm tests of both tiers (test files never import each other)."""

from __future__ import annotations

JOB_DETAIL = (
    "JobId=1 JobName=tfdeploy-x UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901759 "
    "Nice=0 Account=(null) QOS=(null) JobState=RUNNING Reason=None Dependency=(null) Requeue=1 "
    "Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 DerivedExitCode=0:0 RunTime=00:00:01 "
    "TimeLimit=00:10:00 TimeMin=N/A Partition=gpu NodeList=h2-ec7e,h3-ec7e BatchHost=h2-ec7e "
    "NumNodes=2 NumCPUs=2 NumTasks=2 CPUs/Task=1 ReqB:S:C:T=0:0:*:* TRES=cpu=2,node=2,billing=2 "
    "Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* JOB_GRES=gpu:2   Nodes=h2-ec7e,h3-ec7e "
    "CPU_IDs=0 Mem=0 GRES=gpu:1(IDX:0) MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0 "
    "Features=(null) DelayBoot=00:00:00 OverSubscribe=OK Contiguous=0 Licenses=(null) "
    "Network=(null) Command=/tmp/s49/b.sh WorkDir=/tmp StdErr=/dev/null StdIn=/dev/null "
    "StdOut=/dev/null Power= TresPerNode=gres:gpu:1 \n"
)

NODES = (
    "NodeName=h2-ec7e Arch=x86_64 CoresPerSocket=1  CPUAlloc=1 CPUEfctv=2 CPUTot=2 CPULoad=6.38 "
    "AvailableFeatures=(null) ActiveFeatures=(null) Gres=gpu:2 NodeAddr=10.77.16.12 "
    "NodeHostName=h2-ec7e Version=22.05.8 OS=Linux 6.18.44-fc-v857 #1 SMP PREEMPT_DYNAMIC @0  "
    "RealMemory=1024 AllocMem=0 FreeMem=20174 Sockets=2 Boards=1 State=MIXED ThreadsPerCore=1 "
    "TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A Partitions=gpu,urgent\n"
    "NodeName=h3-ec7e Arch=x86_64 CoresPerSocket=1  CPUAlloc=1 CPUEfctv=2 CPUTot=2 CPULoad=6.44 "
    "AvailableFeatures=(null) ActiveFeatures=(null) Gres=gpu:2 NodeAddr=10.77.16.13 "
    "NodeHostName=h3-ec7e Version=22.05.8 OS=Linux 6.18.44-fc-v857 #1 SMP PREEMPT_DYNAMIC @0  "
    "RealMemory=1024 AllocMem=0 FreeMem=20327 Sockets=2 Boards=1 State=MIXED ThreadsPerCore=1 "
    "TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A Partitions=gpu,urgent\n"
)

PARTITION = (
    "PartitionName=gpu AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL AllocNodes=ALL Default=YES "
    "QoS=N/A DefaultTime=NONE DisableRootJobs=NO ExclusiveUser=NO GraceTime=0 Hidden=NO "
    "MaxNodes=UNLIMITED MaxTime=04:00:00 MinNodes=0 LLN=NO MaxCPUsPerNode=UNLIMITED "
    "Nodes=h2-ec7e,h3-ec7e PriorityJobFactor=1 PriorityTier=1 RootOnly=NO ReqResv=NO "
    "OverSubscribe=NO OverTimeLimit=NONE PreemptMode=REQUEUE State=UP TotalCPUs=4 TotalNodes=2 "
    "SelectTypeParameters=NONE JobDefaults=(null) DefMemPerNode=UNLIMITED MaxMemPerNode=UNLIMITED "
    "TRES=cpu=4,mem=2G,node=2,billing=4\n"
)

BASE = """\
[job]
name = "digits"
code = "."
command = "python3 mwms.py"

[slurm]
login = "login.example.edu"
partition = "gpu"
time = "02:00:00"
{extra}
[[slurm.hosts]]
nodes = 2
gpus = 4
tasks = [{{ role = "worker" }}]
{group}
"""
