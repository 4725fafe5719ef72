"""Host sources: plug-ins that turn a top-level inventory table into hosts and that launch,
replace and terminate machines over a job's life (the interface: deployer/config/sources.py).

This registry is the one place that names them. A new source is a package here (like `aws/`)
with a `read(table, context) -> Sourced` function, plus one line in READERS.
"""

from __future__ import annotations

import functools
import importlib
from pathlib import Path

from deployer.config.inventory import Inventory
from deployer.config.inventory import load_inventory as _load
from deployer.config.sources import SourceReader, SourceReaders

# Table name -> module with `read`; imported only by an inventory that has the table.
MODULES = {"aws": "deployer.sources.aws", "slurm": "deployer.sources.slurm"}
# The `plan --json` key of a source's machines -> the module whose `price` says what they cost
# (deployer/sources/costs.py); imported only for a run that has such machines.
PRICING = {"instances": "deployer.sources.aws.cost"}


def _reader(module: str) -> SourceReader:
    reader: SourceReader = importlib.import_module(module).read
    return reader


READERS: SourceReaders = {key: functools.partial(_reader, m) for key, m in MODULES.items()}


def load_inventory(path: str | Path) -> Inventory:
    """An inventory file read with every source tfdeploy ships."""
    return _load(path, READERS)
