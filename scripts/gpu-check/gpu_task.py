"""The tasks of scripts/gpu-check.sh: PyTorch programs, one per mode.

    see N     prints CUDA_VISIBLE_DEVICES and torch.cuda.device_count(); fails unless it is N
    hold S    allocates 1 GiB on its GPU, says so, and keeps it S seconds (down stops it)
    burn S    multiplies matrices for S seconds (the live view's GPU use column shows it)

Without PyTorch built with CUDA it exits 3 saying so: this check needs a GPU machine.
"""

import os
import sys
import time

NO_TORCH = "torch with CUDA not found: this check needs a GPU machine"


def main(mode: str, arg: str) -> int:
    try:
        import torch
    except ImportError:
        print(f"{NO_TORCH} (no torch for {sys.executable})", flush=True)
        return 3
    if torch.version.cuda is None:
        print(f"{NO_TORCH} (torch {torch.__version__} is a CPU build)", flush=True)
        return 3
    mask = os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>")
    count = torch.cuda.device_count()
    print(f"CUDA_VISIBLE_DEVICES={mask} torch.cuda.device_count()={count}", flush=True)
    if mode == "see":
        return 0 if count == int(arg) else 1
    if count < 1:
        print(f"{NO_TORCH} (no GPU visible with CUDA_VISIBLE_DEVICES={mask})", flush=True)
        return 3
    if mode == "hold":
        block = torch.empty(256 * 2**20, dtype=torch.float32, device="cuda")  # 1 GiB
        torch.cuda.synchronize()
        print(f"holding {block.numel() * 4 // 2**20} MiB on the GPU, pid {os.getpid()}", flush=True)
        time.sleep(float(arg))
        return 0
    a = torch.randn(4096, 4096, device="cuda")
    end = time.monotonic() + float(arg)
    steps = 0
    while time.monotonic() < end:
        a = torch.tanh(a @ a)
        steps += 1
        if steps % 200 == 0:
            torch.cuda.synchronize()
            print(f"{steps} matmuls", flush=True)
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "0"))
