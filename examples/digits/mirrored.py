"""Digits on MirroredStrategy: one process trains on every GPU it is given (one host).

TensorFlow's "Distributed training with Keras" tutorial, as it is: a MirroredStrategy over the
visible GPUs, the model built and compiled in `strategy.scope()`, then Keras' `model.fit` and
`model.evaluate` (Keras 3 `fit` works under MirroredStrategy). What differs: the data
(scikit-learn's digits; the tutorial's tfds MNIST downloads) and the model (common.py's MLP).

Several such tasks may share a host: tfdeploy gives each its own CUDA_VISIBLE_DEVICES (4 GPUs,
2 tasks: "0,1" and "2,3"), and TF_CONFIG is not read (MirroredStrategy stays in one process).
Where TensorFlow sees no GPU (tensorflow-cpu, a CPU host) but the mask names several, the CPU is
split into that many logical devices, which stand in for the GPUs: the strategy then mirrors over
as many replicas as it would on the GPUs of the mask.
"""

from __future__ import annotations

import argparse
import os
import sys

import common

BATCH_PER_REPLICA = 32


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--lr", type=float, default=0.01)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    common.quiet_tensorflow()
    common.print_env_banner()
    me = common.task_name()
    x_train, y_train, x_test, y_test = common.load_digits()

    import keras  # after the banner, so a slow import still shows the env first
    import tensorflow as tf

    devices = None  # MirroredStrategy's default: every visible GPU
    mask = [g for g in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if g not in ("", "-1")]
    if not tf.config.list_physical_devices("GPU") and len(mask) > 1:
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration() for _ in mask]
        )
        devices = [d.name for d in tf.config.list_logical_devices("CPU")]
        common.log(f"{me}: no GPU visible: {len(devices)} CPU devices stand in for GPUs {mask}")
    strategy = tf.distribute.MirroredStrategy(devices)
    replicas = strategy.num_replicas_in_sync
    common.log(f"{me}: {replicas} replicas: {', '.join(strategy.extended.worker_devices)}")

    with strategy.scope():
        model = common.build_model()
        model.compile(
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            optimizer=keras.optimizers.Adam(learning_rate=args.lr),
            metrics=["accuracy"],
        )
    callbacks = []
    try:  # tfdeploy's live view, `status`, `runs` and `report` show its step, rate and loss
        from tfdeploy_metrics import KerasMetrics

        callbacks.append(KerasMetrics())
    except ImportError:  # not run by tfdeploy
        pass
    model.fit(
        x_train,
        y_train,
        batch_size=BATCH_PER_REPLICA * replicas,
        epochs=args.epochs,
        verbose=2,
        callbacks=callbacks,
    )
    _, test_accuracy = model.evaluate(x_test, y_test, verbose=0)
    common.report_accuracy(float(test_accuracy))
    return 0


if __name__ == "__main__":
    sys.exit(main())
