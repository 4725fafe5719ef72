"""The hint for a script that reads another cluster convention than its task was given.

A PyTorch script started under `framework = "tensorflow"` dies of its own words ("environment
variable RANK expected, but not set"), which do not say that tfdeploy could have set them. The
failure report keeps those words and adds which `framework` the script wanted
(docs/frameworks.md). Only the script's own, stable error messages are recognised: a tail that
says none of them gets no hint.
"""

from __future__ import annotations

from collections.abc import Iterable

from deployer.config.frameworks import Framework

# What each framework's initialisation says when its variables are missing (measured with
# torch 2.13, jax 0.10.2 and keras 3.15.1): the words, and the frameworks that would set them.
_SIGNS: tuple[tuple[str, tuple[Framework, ...]], ...] = (
    ("using env:// rendezvous", (Framework.TORCH,)),
    ("MASTER_ADDR", (Framework.TORCH,)),
    # keras.distribution.initialize() and jax.distributed.initialize() say the same.
    ("coordinator_address should be defined", (Framework.KERAS, Framework.JAX)),
    ("KERAS_DISTRIBUTION_", (Framework.KERAS,)),
    ("TF_CONFIG", (Framework.TENSORFLOW,)),
)


def convention_hint(tail: Iterable[str], framework: Framework) -> str | None:
    """`set [job] framework = "torch"` when the task's last lines show a script that looked for
    another convention's variables than `framework`'s."""
    text = "\n".join(tail)
    for words, wanted in _SIGNS:
        if words in text and framework not in wanted:
            choices = " or ".join(f'framework = "{f}"' for f in wanted)
            return (
                f"the script looks for the variables of another cluster convention than this "
                f'task\'s ("{framework}"): set [job] {choices} (or role_frameworks for its role; '
                "docs/frameworks.md)"
            )
    return None
