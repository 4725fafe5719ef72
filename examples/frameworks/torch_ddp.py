"""PyTorch DistributedDataParallel on CPU (gloo), one process per tfdeploy task.

tfdeploy's `framework = "torch"` gives each task torchrun's variables (MASTER_ADDR, MASTER_PORT,
RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE), which `init_process_group("gloo")` reads by
itself (its env:// default). Each rank trains on its own shard of a fixed synthetic problem;
DDP averages the gradients, so every rank ends with the same weights: the last line prints
their checksum, equal on all ranks only when the collective worked.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn


def data(rank: int, world: int, n: int = 512) -> tuple[torch.Tensor, torch.Tensor]:
    """A linear problem every rank generates alike; each keeps its own shard of the rows."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(n, 8, generator=generator)
    y = x @ torch.arange(1.0, 9.0).unsqueeze(1) + 0.5
    return x[rank::world], y[rank::world]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--fail-rank", type=int, default=-1, help="this rank exits 1 (tests)")
    args = parser.parse_args()
    dist.init_process_group("gloo")  # MASTER_ADDR/PORT, RANK, WORLD_SIZE from the environment
    rank, world = dist.get_rank(), dist.get_world_size()
    print(f"rank {rank} of {world} (local {os.environ.get('LOCAL_RANK')})", flush=True)
    if rank == args.fail_rank:
        raise SystemExit(f"rank {rank}: failing on purpose (--fail-rank)")
    torch.manual_seed(0)  # the same initial weights on every rank (DDP also broadcasts rank 0's)
    model = nn.parallel.DistributedDataParallel(nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = data(rank, world)
    for step in range(args.steps):
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()  # gradients averaged across the ranks here
        optimizer.step()
        if step % 10 == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
    checksum = sum(float(p.detach().double().sum()) for p in model.parameters())
    print(f"weights checksum {checksum:.6f}", flush=True)
    leave(rank, world)


def leave(rank: int, world: int) -> None:
    """Every rank tears its group down before rank 0 tears down its own. Rank 0 hosts the
    rendezvous store and one end of every gloo pair: a rank still inside its teardown when
    rank 0's pairs closed aborted at exit ("terminate called without an active exception",
    SIGABRT: gloo's receive is not interruptible), even after a barrier. So the others say
    through the store that they are done, and rank 0 waits for them before it leaves. A rank
    that said so ends at once (os._exit after flushing its output): its interpreter's own
    shutdown, which tears down the store's client while rank 0 may already have closed the
    store, aborted the same way under load."""
    store = dist.distributed_c10d._get_default_store()  # the TCPStore, kept past the group
    dist.barrier()
    if rank != 0:
        dist.destroy_process_group()
        store.add("ranks_left", 1)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    deadline = time.monotonic() + 60  # a rank that died after the barrier never says so
    while store.add("ranks_left", 0) < world - 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
