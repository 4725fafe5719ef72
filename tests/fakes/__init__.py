"""Stand-ins for what the lab lacks: GPUs (nvidia-smi), the EC2 metadata service (imds)."""
