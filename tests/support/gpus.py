"""The nvidia-smi stand-in (tests/fakes/nvidia-smi) and the GPU UUIDs it prints."""

from __future__ import annotations

from pathlib import Path

FAKE = Path(__file__).resolve().parent.parent / "fakes" / "nvidia-smi"


def uuid(i: int) -> str:
    return f"GPU-fa4e0000-0000-4000-8000-00000000000{i}"
