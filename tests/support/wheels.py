"""Wheels written by hand for tests of environments: tiny, pure Python, made in milliseconds.

A wheel is a zip with the package's files and a `<name>-<version>.dist-info/` of METADATA,
WHEEL and RECORD (PEP 427); pip and uv install these like any from an index.
"""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest},{len(data)}"


def make_wheel(
    dest: Path,
    name: str,
    version: str = "1.0",
    *,
    files: dict[str, bytes] | None = None,
    requires: list[str] | None = None,
    tag: str = "py3-none-any",
) -> Path:
    """`dest/<name>-<version>-<tag>.whl`; by default one module `<name>` with VALUE = version.

    `files` maps paths inside the wheel (e.g. "pkg/__init__.py", "uv-1.0.data/scripts/uv")
    to their bytes.
    """
    dist = name.replace("-", "_")
    files = files if files is not None else {f"{dist}.py": f"VALUE = {version!r}\n".encode()}
    info = f"{dist}-{version}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    metadata += "".join(f"Requires-Dist: {r}\n" for r in requires or [])
    wheel_meta = f"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: {tag}\n"
    content = {**files, f"{info}/METADATA": metadata.encode(), f"{info}/WHEEL": wheel_meta.encode()}
    record = "".join(f"{path},{_record_hash(data)}\n" for path, data in content.items())
    record += f"{info}/RECORD,,\n"
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / f"{dist}-{version}-{tag}.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for inner, data in content.items():
            archive.writestr(inner, data)
        archive.writestr(f"{info}/RECORD", record)
    return path


def uv_binary() -> Path | None:
    """A uv binary of this machine (the dev extra installs one into tfdeploy's venv)."""
    import shutil
    import sys

    found = shutil.which("uv") or shutil.which("uv", path=str(Path(sys.executable).parent))
    return Path(found) if found else None


def make_uv_wheel(dest: Path, uv: Path) -> Path:
    """A uv wheel as PyPI ships it (the binary under `uv-<v>.data/scripts/`), around `uv`.

    Stored, not deflated: the binary is ~40 MB and the test needs it in milliseconds.
    """
    tag = "py3-none-manylinux_2_17_x86_64"
    path = make_wheel(dest, "uv", "0.0.1", files={"uv/__init__.py": b""}, tag=tag)
    with zipfile.ZipFile(path, "a", zipfile.ZIP_STORED) as archive:
        archive.write(uv, "uv-0.0.1.data/scripts/uv")
    return path
