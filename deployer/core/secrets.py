"""Which environment values are secret, and how they look when printed: never in clear."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

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
    extra = tuple(extra)
    for name, value in env.items():
        if value and len(value) >= 4 and is_secret(name, extra):
            text = text.replace(value, MASK)
    return text
