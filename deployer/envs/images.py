"""The job's container image saved here as an OCI layout, for `image_from = "controller"`.

An OCI layout directory names each blob (layer, config, manifest) by its sha256 digest, so the
content store, which names contents by sha256 too, keeps one copy of each and sends a host only
the blobs it lacks: a re-deploy of an image whose top layer changed sends about that layer's
bytes, and of the same image nothing. The directory is kept under the state directory by image
ID, so an image is saved once however often it is deployed.

Podman saves it (`podman save --format oci-dir`); skopeo is not needed. A controller with only
docker is not handled here: `docker save` writes a tar archive, not a directory of blobs.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from deployer.core.digest import sha256_file
from deployer.core.errors import LocalError

SAVE_TIMEOUT = 1800.0


@dataclass(frozen=True)
class Blob:
    digest: str  # "sha256:<hex>", the file's own name under blobs/sha256/
    size: int


@dataclass(frozen=True)
class OciLayout:
    """One saved image: its directory (index.json, oci-layout, blobs/sha256/*) and its blobs."""

    image: str
    image_id: str
    path: Path
    blobs: tuple[Blob, ...]

    @property
    def size(self) -> int:
        return sum(b.size for b in self.blobs)


def _podman(*args: str, timeout: float = 120.0) -> str:
    argv = ["podman", *args]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError:
        raise LocalError(
            "podman is not installed on this machine: install it to send images from here "
            '(image_from = "controller"), or let hosts pull the image themselves'
        ) from None
    except subprocess.TimeoutExpired:
        raise LocalError(f"`{' '.join(argv)}` did not finish within {timeout:.0f} s") from None
    if done.returncode != 0:
        said = (done.stderr.strip() or "no output").splitlines()[-1]
        raise LocalError(f"`{' '.join(argv)}` failed (exit {done.returncode}): {said}")
    return done.stdout


def image_id(image: str) -> str:
    """The local image's ID (its config digest, hex); LocalError names a missing image."""
    try:
        out = _podman("image", "inspect", "--format", "{{.Id}}", image)
    except LocalError as exc:
        raise LocalError(
            f"image {image} is not on this machine ({exc}): build it or `podman pull` it here"
        ) from None
    return out.strip().splitlines()[0]


def image_platform(image: str) -> str:
    """`os/arch` of a local image, as a host's runtime says its platform (`linux/amd64`)."""
    out = _podman("image", "inspect", "--format", "{{.Os}}/{{.Architecture}}", image)
    return out.strip().splitlines()[0]


def export_oci(image: str, root: Path) -> OciLayout:
    """The image as an OCI layout under `root/<image id>/`, saved only if not there yet.

    Saved into a sibling and renamed, so an interrupted save never leaves a partial layout that
    a later deploy would take for whole.
    """
    ident = image_id(image)
    dest = root / ident
    if not (dest / "index.json").exists():
        root.mkdir(parents=True, exist_ok=True)
        partial = root / f".{ident}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        _podman("save", "--format", "oci-dir", "-o", str(partial), image, timeout=SAVE_TIMEOUT)
        partial.rename(dest)
    return OciLayout(image, ident, dest, layout_blobs(dest))


def layout_blobs(path: Path) -> tuple[Blob, ...]:
    """Every blob of a layout, checked against its name: the store's dedupe by content relies on
    a blob's name being its digest, and a wrong one would load as a corrupt image on a host."""
    layout = json.loads((path / "oci-layout").read_text())
    if layout.get("imageLayoutVersion") != "1.0.0":
        raise LocalError(f"{path} is not an OCI image layout 1.0.0: {layout}")
    blobs = []
    for f in sorted((path / "blobs" / "sha256").iterdir()):
        digest = sha256_file(f)
        if digest != f.name:
            raise LocalError(
                f"blob {f} holds sha256:{digest}, not what its name says: delete {path}"
            )
        blobs.append(Blob(f"sha256:{digest}", f.stat().st_size))
    return tuple(blobs)
