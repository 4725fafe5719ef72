"""Which environment values are secret, and how they look when printed: never in clear."""

from __future__ import annotations

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
