"""The hint for a script that reads another cluster convention than its task was given.

A PyTorch script started under `framework = "tensorflow"` dies of its own words ("environment
variable RANK expected, but not set"), which do not say that tfdeploy could have set them. The
failure report keeps those words and adds which `framework` the script wanted
(docs/frameworks.md). Only the script's own, stable error messages are recognised (each
framework record's `signs`, config/frameworks.py): a tail that says none of them gets no hint.
"""

from __future__ import annotations

from collections.abc import Iterable

from deployer.config.frameworks import RECORDS, WRONG_CONVENTION_HINT, Framework


def _signs() -> dict[str, tuple[Framework, ...]]:
    """Each sign in a task's output, and the frameworks whose initialisation says it (Keras 3's
    and JAX's say the same), in the records' order."""
    signs: dict[str, tuple[Framework, ...]] = {}
    for r in RECORDS.values():
        for words in r.signs:
            signs[words] = (*signs.get(words, ()), r.name)
    return signs


_SIGNS = _signs()


def convention_hint(tail: Iterable[str], framework: Framework) -> str | None:
    """`set [job] framework = "torch"` when the task's last lines show a script that looked for
    another convention's variables than `framework`'s."""
    text = "\n".join(tail)
    for words, wanted in _SIGNS.items():
        if words in text and framework not in wanted:
            choices = " or ".join(f'framework = "{f}"' for f in wanted)
            return WRONG_CONVENTION_HINT.format(framework=framework, choices=choices)
    return None
