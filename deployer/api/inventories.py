"""What the Python API accepts as an inventory: a TOML file's path, or a dict of the file's shape.

A dict is validated by the same parser as a file, with the same key-path errors, so a pipeline
that builds its inventory in code gets the messages `tfdeploy plan FILE` would give.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeAlias

from deployer.config.inventory import Inventory, parse_inventory
from deployer.core.errors import UsageError
from deployer.sources import READERS, load_inventory

InventoryLike: TypeAlias = str | os.PathLike[str] | Mapping[str, Any]
# Where a dict inventory "lives": its relative paths resolve from `base`, and messages name it.
DICT_NAME = "<inventory dict>"


def load(inventory: InventoryLike, *, base: str | os.PathLike[str] | None = None) -> Inventory:
    """Reads and validates an inventory, touching no host (host sources are not asked yet).

    `base`: the folder a dict's relative paths (`job.code`, key files) are relative to; the
    current directory when None. A file's paths are relative to the file, so `base` is refused
    with one. Raises InventoryError naming the key path.
    """
    if isinstance(inventory, Mapping):
        folder = Path(base) if base is not None else Path.cwd()
        return parse_inventory(_plain(inventory), folder.absolute() / DICT_NAME, READERS)
    if base is not None:
        raise UsageError(
            "base is for a dict inventory: a file's relative paths are relative to the file"
        )
    return load_inventory(Path(inventory))


def _plain(value: Mapping[str, Any]) -> dict[str, object]:
    """The dict as tomllib would have returned it: dicts, lists and strings (a tuple is a
    list, a Path its string), so the parser's type checks read it like a file."""
    return {str(k): _value(v) for k, v in value.items()}


def _value(value: object) -> object:
    if isinstance(value, Mapping):
        return _plain(value)
    if isinstance(value, list | tuple):
        return [_value(v) for v in value]
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return value
