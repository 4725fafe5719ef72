"""Which environment values are secret, and how they look when printed: never in clear."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

SECRET_MARKERS = ("KEY", "TOKEN", "SECRET", "PASSWORD")
MASK = "********"


def is_secret(name: str, extra: Iterable[str] = ()) -> bool:
    """Names like AWS_SECRET_ACCESS_KEY or WANDB_API_KEY, plus those the job lists in secret_env."""
    upper = name.upper()
    return name in set(extra) or any(marker in upper for marker in SECRET_MARKERS)


def masked(env: Mapping[str, str], extra: Iterable[str] = ()) -> dict[str, str]:
    """A copy of env safe to print or log."""
    extra = tuple(extra)
    return {k: (MASK if is_secret(k, extra) else v) for k, v in env.items()}


def mask_text(text: str, env: Mapping[str, str], extra: Iterable[str] = ()) -> str:
    """Hides secret values wherever they appear inside a message (e.g. a failing command line)."""
    return Masker.of([env], extra)(text)


@dataclass(frozen=True)
class Masker:
    """Hides a run's secret values in any text: every value tfdeploy gives a task under a
    secret-looking name or one listed in secret_env, from the inventory's env tables or from
    this machine's environment (forward_env). Callable on a line, as cheap as it can be: no
    secret, no work."""

    values: tuple[str, ...] = ()  # longest first: a secret that contains another goes whole

    @classmethod
    def of(cls, envs: Iterable[Mapping[str, str]], extra: Iterable[str] = ()) -> Masker:
        extra = tuple(extra)
        found = {
            value
            for env in envs
            for name, value in env.items()
            if value and len(value) >= 4 and is_secret(name, extra)  # shorter: noise, not secret
        }
        return cls(tuple(sorted(found, key=lambda v: (-len(v), v))))

    def __call__(self, text: str) -> str:
        for value in self.values:
            if value in text:
                text = text.replace(value, MASK)
        return text

    def record(self, value: object) -> object:
        """A JSON-shaped value (a record written to disk) with the secrets masked in every
        text of it, keys included."""
        if not self.values:
            return value
        if isinstance(value, str):
            return self(value)
        if isinstance(value, Mapping):
            return {self(str(k)): self.record(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.record(v) for v in value]
        return value

    def blank(self, data: bytes) -> bytes:
        """`data` with each secret's bytes turned into as many `*`: the same length, so a
        file keeps the offsets of what it copies (the local log archive)."""
        for value in self._encoded:
            if value in data:
                data = data.replace(value, b"*" * len(value))
        return data

    @property
    def reach(self) -> int:
        """How many bytes before a write a secret cut between two writes may have left: what
        a writer of `blank`ed bytes reads back to blank such a secret whole (0: no secret)."""
        return max(map(len, self._encoded), default=1) - 1

    @functools.cached_property
    def _encoded(self) -> tuple[bytes, ...]:
        found = {value.encode("utf-8", "surrogateescape") for value in self.values}
        return tuple(sorted(found, key=lambda v: (-len(v), v)))
