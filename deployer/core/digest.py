"""The one way the control side names a file by its content: sha256, read in pieces."""

from __future__ import annotations

import hashlib
from pathlib import Path


def sha256_file(path: Path) -> str:
    """The hex sha256 of a file's bytes; hashlib reads it in pieces, so memory stays bounded."""
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()
