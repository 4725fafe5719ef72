"""The `[aws]` host source: EC2 instances found by tags, launched when missing, ended when due.

This module is the plug-in (what deployer/sources/__init__.py names): `read` turns the table
into an `AwsSource`, which does what `HostSource` asks across a job's life. settings.py holds
the table as data, discovery.py finds instances, launch.py creates and ends them.
"""

from __future__ import annotations

from dataclasses import dataclass

from deployer.config.model import Host
from deployer.config.schema import Table
from deployer.config.sources import Discovered, Provisioned, Say, SourceContext, Sourced
from deployer.sources.aws import launch
from deployer.sources.aws.discovery import discover_all
from deployer.sources.aws.settings import AwsSettings, parse_settings


@dataclass(frozen=True)
class AwsSource:
    """One inventory's `[aws]`, as a `HostSource`."""

    settings: AwsSettings

    @property
    def key(self) -> str:
        return self.settings.key

    def discover(self, file: str, *, preview: bool = False) -> Discovered:
        return discover_all(self.settings, file, preview)

    def provision(self, file: str, say: Say, *, detach: bool = False) -> Provisioned:
        """What it launched is ended when due (`terminate`), not held by one `up`."""
        if not self.settings.launches:
            return Provisioned(self.discover(file))
        return Provisioned(launch.provision(self.settings, file, say))

    def replace(self, file: str, gone: Host, say: Say) -> Host | None:
        return launch.replace_host(self.settings, file, gone, say)

    def terminate(self, when: tuple[str, ...], say: Say) -> None:
        launch.terminate_launched(self.settings, when, say)


def read(t: Table, context: SourceContext) -> Sourced:
    """`[aws]`: pure; its hosts are found later, when `discover_hosts` calls `discover`."""
    return Sourced(pending=AwsSource(parse_settings(t, context)))
