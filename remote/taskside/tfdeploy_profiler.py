"""tfdeploy starts TensorFlow's profiler server in a task ([job] profiler = true): this file is
copied as `sitecustomize.py` into the task's lib folder, first on its PYTHONPATH, so every
Python the task starts runs it before its own code (docs/profile.md).

It imports nothing heavy and changes nothing: a daemon thread waits until the process has
imported TensorFlow (a data script that never does costs one dictionary look-up every half
second), then starts the server on TFDEPLOY_PROFILER_PORT. Of several Pythons in one task only
the first to import TensorFlow gets the port; the others say so on stderr. The sitecustomize
this one hides (a distribution's or a venv's) still runs, as Python would have run it.
"""

import os
import sys
import threading
import time

_PORT_ENV = "TFDEPLOY_PROFILER_PORT"  # protocol.PROFILER_PORT_ENV (test_profile checks)
_START_ENV = "TFDEPLOY_PROFILER_START"  # protocol.PROFILER_START_ENV
_LOOK_EVERY = 0.5


def _imported():
    """The tensorflow module once its import has finished (None before)."""
    module = sys.modules.get("tensorflow")
    spec = getattr(module, "__spec__", None)
    if module is None or getattr(spec, "_initializing", False):
        return None
    return module


def _serve(port):
    module = _imported()
    while module is None:
        time.sleep(_LOOK_EVERY)
        module = _imported()
    try:
        module.profiler.experimental.server.start(port)
    except Exception as exc:  # a second Python of the task, or a TensorFlow without it
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        sys.stderr.write(f"tfdeploy: no profiler server on port {port} here: {first}\n")
        return
    sys.stderr.write(f"tfdeploy: TensorFlow's profiler serves on port {port}\n")


def _start():
    if os.environ.get(_START_ENV) != "tfdeploy":
        return
    try:
        port = int(os.environ.get(_PORT_ENV, ""))
    except ValueError:
        return
    threading.Thread(target=_serve, args=(port,), name="tfdeploy-profiler", daemon=True).start()


def _chain():
    """Runs the next sitecustomize.py on sys.path, the one this file hides."""
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        if not entry or os.path.abspath(entry) == here:
            continue
        found = os.path.join(entry, "sitecustomize.py")
        if os.path.isfile(found):
            import importlib.util

            spec = importlib.util.spec_from_file_location("_tfdeploy_hidden_sitecustomize", found)
            if spec is None or spec.loader is None:
                return
            module = importlib.util.module_from_spec(spec)
            try:
                spec.loader.exec_module(module)
            except Exception as exc:  # as site does: said, never fatal
                sys.stderr.write(f"Error in sitecustomize ({found}); set PYTHONVERBOSE: {exc}\n")
            return


_start()
_chain()
