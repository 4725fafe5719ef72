"""Report a task's progress to tfdeploy: `report(step, loss=...)`, a Keras callback, an
Estimator hook. No dependency: tfdeploy puts this file on every task's PYTHONPATH.

tfdeploy gives each task TFDEPLOY_METRICS, the path of a JSON-lines file in its task directory;
one object a line, at least `step`, optionally `total_steps`, `loss` and any other numbers. The
live view, `status`, `tfdeploy runs` and `tfdeploy report` read it. Outside tfdeploy (no
TFDEPLOY_METRICS) every call here does nothing, so a script runs the same on a laptop.

    from tfdeploy_metrics import report, KerasMetrics
    model.fit(ds, epochs=3, callbacks=[KerasMetrics()])     # tf.keras, Keras 3 or tf-keras
    report(step, loss=loss, total_steps=1000)              # a custom training loop
    tf.estimator.train_and_evaluate(..., hooks=[EstimatorMetrics(loss)])  # TF <= 2.15
"""

import json
import math
import os
import time

ENV = "TFDEPLOY_METRICS"  # protocol.METRICS_ENV (tests/unit/test_metrics_channel.py checks)
_file = None


def _out():
    global _file
    path = os.environ.get(ENV)
    if not path:
        return None
    if _file is None:
        _file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - kept open for every report
    return _file


def _number(value):
    """A plain finite number, or None (tensors and numpy scalars become floats)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def report(step, total_steps=None, flush=True, **values):
    """One record: the global step, and numbers (`loss=0.42`, `accuracy=0.9`); others are
    dropped. Cheap enough for every step; `flush=False` leaves the line in the buffer."""
    out = _out()
    if out is None:
        return
    record = {"step": int(step), "time": round(time.time(), 3)}
    if total_steps is not None:
        record["total_steps"] = int(total_steps)
    for key, value in values.items():
        number = _number(value)
        if number is not None:
            record[str(key)] = number
    out.write(json.dumps(record) + "\n")
    if flush:
        out.flush()


def _keras_base():
    """The Callback class the running Keras wants: tf.keras's (Keras 3 or tf-keras behind it),
    else standalone Keras 3's."""
    try:
        import tensorflow as tf

        return tf.keras.callbacks.Callback
    except ImportError:
        import keras

        return keras.callbacks.Callback


def KerasMetrics(total_steps=None, every_s=0.5):
    """A Keras callback that reports the global step and the batch's logs (loss, metrics) at
    most every `every_s` seconds, and at each epoch's end. `total_steps` defaults to epochs x
    steps per epoch when Keras knows them."""
    base = _keras_base()

    class _KerasMetrics(base):
        def __init__(self):
            super().__init__()
            self.step = 0
            self.total = total_steps
            self.last = 0.0
            self.reported = -1  # the step of the last record: one record per step

        def on_train_begin(self, logs=None):
            params = getattr(self, "params", None) or {}
            epochs, steps = params.get("epochs"), params.get("steps")
            if self.total is None and epochs and steps:
                self.total = int(epochs) * int(steps)

        def on_train_batch_end(self, batch, logs=None):
            self.step += 1
            now = time.monotonic()
            if now - self.last >= every_s:
                self.last, self.reported = now, self.step
                report(self.step, self.total, **(logs or {}))

        def on_epoch_end(self, epoch, logs=None):
            # The epoch's last step, unless it was just reported (a curve has one point per
            # step): its logs are the epoch's (mean loss, val_* metrics).
            if self.step != self.reported:
                self.last, self.reported = time.monotonic(), self.step
                report(self.step, self.total, epoch=epoch + 1, **(logs or {}))

    return _KerasMetrics()


def EstimatorMetrics(loss=None, total_steps=None, every_n_steps=10):
    """A SessionRunHook (TF <= 2.15 Estimators): the global step and `loss` (a tensor) every
    `every_n_steps` steps."""
    import tensorflow as tf

    v1 = tf.compat.v1

    class _EstimatorMetrics(v1.train.SessionRunHook):
        def begin(self):
            self.global_step = v1.train.get_global_step()

        def before_run(self, run_context):
            fetches = {"step": self.global_step}
            if loss is not None:
                fetches["loss"] = loss
            return v1.train.SessionRunArgs(fetches)

        def after_run(self, run_context, run_values):
            got = run_values.results
            step = int(got["step"])
            if step % every_n_steps == 0:
                report(step, total_steps, loss=got.get("loss"))

    return _EstimatorMetrics()
