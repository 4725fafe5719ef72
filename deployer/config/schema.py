"""Typed reading of one TOML table, so every inventory mistake names its file, key path and fix."""

from __future__ import annotations

import difflib
import ipaddress
import math
import posixpath
import re
from collections.abc import Iterable, Mapping
from typing import Any, NoReturn, TypeVar, overload

from deployer.core.errors import InventoryError

T = TypeVar("T")

# What `sh` can export and every tool reads back: "", "A B" or "A=B" would break the task's start.
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_ENV_NAME_RULE = "of letters, digits and _, not starting with a digit"
# execve takes C strings: a NUL would end the value early, so Python refuses to pass one.
_NUL = (
    "expected a string without NUL characters (\\0): no command, path or environment value "
    "can hold one"
)

# A DNS name (or an ssh_config alias written like one); IP addresses are checked by ipaddress.
_LABEL = r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
_HOST_NAME = re.compile(rf"^{_LABEL}(?:\.{_LABEL})*\.?$")
_CPU_LIST = re.compile(r"^\d+(-\d+)?(,\d+(-\d+)?)*$")

_TYPE_NAMES = {
    str: "a string",
    int: "an integer",
    float: "a number",
    bool: "true or false",
    list: "a list",
    dict: "a table",
}


def describe(value: object) -> str:
    """Names a TOML value's type the way a user wrote it, for 'expected X, got Y' messages."""
    if isinstance(value, bool):
        return f"boolean {str(value).lower()}"
    if isinstance(value, int | float):
        return f"number {value}"
    if isinstance(value, str):
        return f"string {value!r}"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a table"
    return type(value).__name__


class Table:
    """A TOML table being read: each getter checks one key; `finish` rejects keys nobody read.

    Reading through this class is what guarantees that an unknown or misspelled key is an error
    with a suggestion instead of being silently ignored.
    """

    def __init__(self, data: Mapping[str, Any], path: str, file: str) -> None:
        self._data = data
        self._seen: set[str] = set()
        self.path = path
        self.file = file

    def key_path(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def fail(self, key: str, expected: str, *, hint: str | None = None) -> NoReturn:
        raise InventoryError(
            self.file, self.key_path(key) if key else self.path, expected, hint=hint
        )

    def has(self, key: str) -> bool:
        return key in self._data

    def written_keys(self) -> list[str]:
        """The keys as written, in file order (read or not)."""
        return list(self._data)

    def entries(self) -> list[tuple[str, Any]]:
        """Every key and raw value of a table whose keys the user names (e.g. EC2 filters).

        Marks them all read: the caller checks each value itself, with `fail(key, ...)`.
        """
        self._seen.update(self._data)
        return list(self._data.items())

    def _get(self, key: str, kind: type[T], default: T | None, required: bool) -> T | None:
        self._seen.add(key)
        if key not in self._data:
            if required:
                unread = [k for k in self._data if k not in self._seen]
                close = difflib.get_close_matches(key, unread, n=1, cutoff=0.6)
                hint = f"found {close[0]!r}: did you mean {key!r}?" if close else None
                self.fail(key, f"is missing: expected {_TYPE_NAMES[kind]}", hint=hint)
            return default
        value = self._data[key]
        ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value, ok = float(value), True
        if not ok:
            self.fail(key, f"expected {_TYPE_NAMES[kind]}, got {describe(value)}")
        return value  # type: ignore[no-any-return]

    @overload
    def string(self, key: str, default: str, *, required: bool = False) -> str: ...
    @overload
    def string(self, key: str, default: None = None, *, required: bool = False) -> str | None: ...
    def string(self, key: str, default: str | None = None, *, required: bool = False) -> str | None:
        value = self._get(key, str, default, required)
        if value is not None and not value.strip():
            self.fail(key, "expected a non-empty string")
        if value is not None and "\0" in value:
            self.fail(key, _NUL)
        return value

    def required_string(self, key: str) -> str:
        value = self.string(key, required=True)
        assert value is not None
        return value

    def integer(
        self, key: str, default: int, *, minimum: int = 0, maximum: int | None = None
    ) -> int:
        value = self._get(key, int, default, False)
        assert value is not None
        if value < minimum or (maximum is not None and value > maximum):
            upper = f" and at most {maximum}" if maximum is not None else ""
            self.fail(key, f"expected an integer of at least {minimum}{upper}, got {value}")
        return value

    def optional_integer(self, key: str, *, minimum: int, maximum: int) -> int | None:
        """An integer in a range, or None when absent: for keys with no default value."""
        value = self.integer(key, minimum, minimum=minimum, maximum=maximum)
        return value if self.has(key) else None

    @overload
    def number(self, key: str, default: float, *, minimum: float = 0.0) -> float: ...
    @overload
    def number(self, key: str, default: None, *, minimum: float = 0.0) -> float | None: ...
    def number(self, key: str, default: float | None, *, minimum: float = 0.0) -> float | None:
        value = self._get(key, float, default, False)
        if value is not None and not math.isfinite(value):
            self.fail(key, f"expected a finite number, got {value}")
        if value is not None and value < minimum:
            self.fail(key, f"expected a number of at least {minimum:g}, got {value:g}")
        return value

    def boolean(self, key: str, default: bool) -> bool:
        value = self._get(key, bool, default, False)
        assert value is not None
        return value

    def choice(self, key: str, choices: Iterable[str], default: str) -> str:
        allowed = list(choices)
        value = self.string(key, default)
        assert value is not None
        if value not in allowed:
            options = " or ".join(repr(c) for c in allowed)
            self.fail(key, f"expected {options}, got {value!r}")
        return value

    def string_list(self, key: str) -> tuple[str, ...]:
        items = self._get(key, list, [], False) or []
        for i, item in enumerate(items):
            if not isinstance(item, str):
                self.fail(f"{key}[{i}]", f"expected a string, got {describe(item)}")
            if "\0" in item:
                self.fail(f"{key}[{i}]", _NUL)
        return tuple(items)

    def string_or_list(self, key: str) -> str | tuple[str, ...] | None:
        """A string or a list of strings (`requirements`: a file, or the lines themselves)."""
        if isinstance(self._data.get(key), list):
            return self.string_list(key)
        if key in self._data and not isinstance(self._data[key], str):
            self._seen.add(key)
            self.fail(
                key, f"expected a string or a list of strings, got {describe(self._data[key])}"
            )
        return self.string(key)

    def env_names(self, key: str) -> tuple[str, ...]:
        """A list of environment variable names (secret_env, forward_env)."""
        names = self.string_list(key)
        for i, name in enumerate(names):
            if not _ENV_NAME.match(name):
                self.fail(
                    f"{key}[{i}]",
                    f"expected an environment variable name {_ENV_NAME_RULE}, got {name!r}",
                )
        return names

    def index_list(self, key: str, *, what: str, maximum: int | None = None) -> tuple[int, ...]:
        """A list of distinct integers >= 0 (and <= maximum), such as GPU indices."""
        items = self._get(key, list, [], False) or []
        bounds = "an integer >= 0" if maximum is None else f"0-{maximum}"
        for i, item in enumerate(items):
            if (
                not isinstance(item, int)
                or isinstance(item, bool)
                or item < 0
                or (maximum is not None and item > maximum)
            ):
                self.fail(f"{key}[{i}]", f"expected {what} ({bounds}), got {describe(item)}")
        if len(set(items)) != len(items):
            self.fail(key, f"lists an entry twice: {items}")
        return tuple(items)

    def string_map(self, key: str) -> dict[str, str]:
        """A table whose values must all be strings (environment variables, role commands)."""
        table = self._get(key, dict, {}, False) or {}
        for name, value in table.items():
            if not isinstance(value, str):
                self.fail(
                    f"{key}.{name}",
                    f"expected a string, got {describe(value)}",
                    hint='quote the value, e.g. NAME = "1"',
                )
            if "\0" in value:
                self.fail(f"{key}.{name}", _NUL)
        return dict(table)

    def env_map(self, key: str) -> dict[str, str]:
        """Environment variables: a table of names to string values."""
        env = self.string_map(key)
        for name in env:
            if not _ENV_NAME.match(name):
                self.fail(key, f"expected variable names {_ENV_NAME_RULE}, got {name!r}")
        return env

    def host_address(self, key: str, value: str, *, port_key: str = "port") -> str:
        """`value` (read from `key`) as a host name or an IP address, without port; an IPv6
        address may be written in brackets, and is returned without.

        The plan builds HOST:PORT itself (with brackets for IPv6): a port here would end up twice.
        """
        bare = value[1:-1] if value.startswith("[") and value.endswith("]") else value
        if _is_ip(bare) or (bare == value and len(value) <= 253 and _HOST_NAME.match(value)):
            return bare
        host, colon, port = value.rpartition(":")
        if colon and host and port.isdigit():
            self.fail(
                key,
                f"expected a host name or an IP address without a port, got {value!r}",
                hint=f"give the port with {port_key}",
            )
        hint = "give the user with ssh.user" if "@" in value else None
        self.fail(key, f"expected a host name or an IP address, got {value!r}", hint=hint)

    def remote_dir(self, key: str, default: str) -> str:
        """A directory on the hosts: absolute or ~-relative, never relative.

        The local transport would resolve a relative one against the controller's current
        directory and SSH against the login directory: `status` from elsewhere would miss runs.
        """
        value = self.string(key, default)
        if not value.startswith(("/", "~")):
            self.fail(
                key,
                f"expected an absolute path or one starting with ~, got {value!r}",
                hint="a relative path depends on where tfdeploy runs; write e.g. "
                f'"~/{posixpath.normpath(value)}"',
            )
        return value

    def cpu_list(self, key: str) -> str | None:
        """A Linux CPU list ("0-3", "0,2,4-5"), as taskset and cgroups write them."""
        cpus = self.string(key)
        if cpus is None:
            return None
        if not _CPU_LIST.match(cpus):
            self.fail(key, f'expected a CPU list such as "0-3" or "0,2", got {cpus!r}')
        for part in cpus.split(","):
            first, _, last = part.partition("-")
            if last and int(last) < int(first):
                self.fail(key, f"expected ranges from low to high, got {part!r} in {cpus!r}")
        return cpus

    def sub_table(self, key: str, *, required: bool = False) -> Table:
        value = self._get(key, dict, {}, required) or {}
        return Table(value, self.key_path(key), self.file)

    def table_list(self, key: str, *, required: bool = False) -> list[Table]:
        items = self._get(key, list, [], required) or []
        if required and not items:
            self.fail(key, "expected at least one entry")
        tables = []
        for i, item in enumerate(items):
            if not isinstance(item, dict):
                self.fail(f"{key}[{i}]", f"expected a table, got {describe(item)}")
            tables.append(Table(item, f"{self.key_path(key)}[{i}]", self.file))
        return tables

    def finish(self) -> None:
        """Rejects keys that no getter asked for, suggesting the closest known key."""
        for key in self._data:
            if key not in self._seen:
                close = difflib.get_close_matches(key, sorted(self._seen), n=1, cutoff=0.6)
                hint = f"did you mean {close[0]!r}?" if close else None
                known = ", ".join(sorted(self._seen))
                self.fail(key, f"unknown key (known keys here: {known})", hint=hint)


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True
