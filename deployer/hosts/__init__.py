"""Reaching hosts: the transport interface (SSH, local), sessions, the agent client, the fleet of
members called in parallel, and what hosts report about their GPUs."""

import importlib
import importlib.util
import sys
import types


class _Deferred(types.ModuleType):
    """Stands in `sys.modules` for a module whose code has not run: the first attribute read
    from it imports the real module (by its own name) and answers from it."""

    def __getattr__(self, name: str) -> object:
        real = sys.modules.get(self.__name__)
        if real is self:
            del sys.modules[self.__name__]
            real = importlib.import_module(self.__name__)
        return getattr(real, name)


def _defer_invoke() -> None:
    """paramiko imports invoke whenever it is installed, for `Match exec` lines in ssh_config
    only, and invoke's own imports (asyncio, unittest.mock, yaml) took ~40 ms: a quarter of
    every command's start. paramiko gets a stand-in; invoke's code runs at a `Match exec`.
    Here, in the package that imports paramiko, before any of its modules can. Without invoke
    nothing changes: paramiko's ImportError at a `Match exec` (hosts/ssh.py says what to do)."""
    if "invoke" not in sys.modules and importlib.util.find_spec("invoke") is not None:
        sys.modules["invoke"] = _Deferred("invoke")


_defer_invoke()
