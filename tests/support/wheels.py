"""Python packages made inside a test, and a package index served from tmp_path, so that tests of
environments never reach a real index.

- `make_wheel`: a wheel written by hand (METADATA, WHEEL, RECORD), with any tag, so a wheel
  for a platform unlike this machine's (aarch64, cp39) is a file name away; by default one
  module `<name>` with `VALUE = version`;
- `make_sdist`: a source distribution whose build backend lives inside it (`backend-path`,
  no build requirements), so pip builds it with nothing from an index; `pure=False` makes it
  build a wheel for this machine's interpreter and platform (`cp311-cp311-linux_x86_64`);
- `write_index`: a PEP 503 simple index of a folder of files;
- `IndexServer`: that index over HTTP on loopback, with a log of the paths asked for;
- `pip_env`: this process's environment with this machine's pip configuration shut out;
- `uv_binary`, `make_uv_wheel`: uv's own binary packed as the platform wheel a host would get.
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import io
import os
import re
import tarfile
import threading
import zipfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

_WHEEL_WRITER = """
import base64, hashlib, zipfile

def write_wheel(directory, name, version, tag, requires):
    dist = f"{name.replace('-', '_')}-{version}"
    files = {
        f"{name.replace('-', '_')}/__init__.py": f"VERSION = {version!r}\\n",
        f"{dist}.dist-info/METADATA": f"Metadata-Version: 2.1\\nName: {name}\\n"
        f"Version: {version}\\n" + "".join(f"Requires-Dist: {r}\\n" for r in requires),
        f"{dist}.dist-info/WHEEL": "Wheel-Version: 1.0\\nGenerator: tests\\n"
        f"Root-Is-Purelib: {'true' if tag.endswith('-none-any') else 'false'}\\nTag: {tag}\\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{path},sha256={digest.decode()},{len(text.encode())}")
    record.append(f"{dist}.dist-info/RECORD,,")
    files[f"{dist}.dist-info/RECORD"] = "\\n".join(record) + "\\n"
    filename = f"{dist}-{tag}.whl"
    with zipfile.ZipFile(f"{directory}/{filename}", "w") as z:
        for path, text in files.items():
            z.writestr(path, text)
    return filename
"""
_BACKEND = """
import sys, sysconfig

def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    if PURE:
        tag = "py3-none-any"
    else:
        py = f"cp{sys.version_info[0]}{sys.version_info[1]}"
        plat = sysconfig.get_platform().replace("-", "_").replace(".", "_")
        tag = f"{py}-{py}-{plat}"
    return write_wheel(wheel_directory, NAME, VERSION, tag, REQUIRES)
"""
_namespace: dict[str, object] = {}
exec(_WHEEL_WRITER, _namespace)  # the same writer the sdists' backends carry


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest},{len(data)}"


def make_wheel(
    dest: Path,
    name: str,
    version: str = "1.0",
    *,
    files: dict[str, bytes] | None = None,
    requires: Sequence[str] = (),
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
    metadata += "".join(f"Requires-Dist: {r}\n" for r in requires)
    purelib = "true" if tag.endswith("-none-any") else "false"
    wheel_meta = f"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: {purelib}\nTag: {tag}\n"
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


def make_sdist(
    directory: Path, name: str, version: str, *, pure: bool = True, requires: Sequence[str] = ()
) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    base = f"{name.replace('-', '_')}-{version}"
    files = {
        "pyproject.toml": '[build-system]\nrequires = []\nbuild-backend = "backend"\n'
        'backend-path = ["."]\n',
        "backend.py": _WHEEL_WRITER
        + f"NAME, VERSION, PURE, REQUIRES = {name!r}, {version!r}, {pure!r}, {list(requires)!r}\n"
        + _BACKEND,
        "PKG-INFO": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
    }
    path = directory / f"{base}.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for rel, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"{base}/{rel}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_index(root: Path, files: Path) -> Path:
    """`root/simple/<project>/index.html` for every file in `files`, linking `root/files/`."""
    projects: dict[str, list[Path]] = {}
    for f in sorted(files.iterdir()):
        project = re.sub(r"[-_.]+", "-", re.split(r"-\d", f.name, maxsplit=1)[0]).lower()
        projects.setdefault(project, []).append(f)
    (root / "files").mkdir(parents=True, exist_ok=True)
    for project, paths in projects.items():
        page = root / "simple" / project / "index.html"
        page.parent.mkdir(parents=True, exist_ok=True)
        links = "".join(
            f'<a href="../../files/{p.name}#sha256={sha256(p)}">{p.name}</a>\n' for p in paths
        )
        page.write_text(f"<!DOCTYPE html><html><body>\n{links}</body></html>\n")
        for p in paths:
            (root / "files" / p.name).write_bytes(p.read_bytes())
    return root / "simple"


class IndexServer:
    """`root` over HTTP on 127.0.0.1; `requests` lists every path asked for."""

    def __init__(self, root: Path) -> None:
        self.requests: list[str] = []
        log = self.requests

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *args: object, **kwargs: object) -> None:
                super().__init__(*args, directory=str(root), **kwargs)  # type: ignore[arg-type]

            def log_message(self, format: str, *args: object) -> None:
                log.append(self.path)

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/simple/"

    @contextmanager
    def running(self) -> Iterator[IndexServer]:
        thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self._server.shutdown()
            self._server.server_close()


def pip_env(tmp: Path, **settings: str) -> dict[str, str]:
    """This process's environment without this machine's pip configuration (files and PIP_*),
    with a pip cache of the test's own, plus `settings` (PIP_* names)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env |= {"PIP_CONFIG_FILE": os.devnull, "PIP_CACHE_DIR": str(tmp / "pip-cache")}
    return env | settings


def uv_binary() -> Path | None:
    """A uv binary of this machine (the dev extra installs one into tfdeploy's venv)."""
    import shutil
    import sys

    found = shutil.which("uv") or shutil.which("uv", path=str(Path(sys.executable).parent))
    return Path(found) if found else None


def make_uv_wheel(dest: Path, uv: Path, version: str = "0.0.1", machine: str = "x86_64") -> Path:
    """A uv wheel as PyPI ships it (the binary under `uv-<v>.data/scripts/`), around `uv`
    (`machine`: the platform its tag claims; the binary is this machine's all the same).

    Stored, not deflated: the binary is ~40 MB and the test needs it in milliseconds.
    """
    tag = f"py3-none-manylinux_2_17_{machine}"
    path = make_wheel(dest, "uv", version, files={"uv/__init__.py": b""}, tag=tag)
    with zipfile.ZipFile(path, "a", zipfile.ZIP_STORED) as archive:
        archive.write(uv, f"uv-{version}.data/scripts/uv")
    return path
