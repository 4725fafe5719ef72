"""Keras 3 DataParallel on the JAX backend across hosts, one process per tfdeploy task.

tfdeploy's `framework = "keras"` gives each task KERAS_DISTRIBUTION_JOB_ADDRESSES,
KERAS_DISTRIBUTION_NUM_PROCESSES and KERAS_DISTRIBUTION_PROCESS_ID, which
`keras.distribution.initialize()` reads by itself; it then calls jax.distributed.initialize with
the first address as the coordinator. On CPU, JAX's cross-process collectives need gloo. Each
process trains on its own shard, gradients are all-reduced, and the last line prints the
weights' checksum: equal on every process only when the collective worked.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("KERAS_BACKEND", "jax")

import functools

import jax
from jax._src import xla_bridge

jax.config.update("jax_cpu_collectives_implementation", "gloo")
if os.environ.get("GLOO_SOCKET_IFNAME"):
    # gloo binds to the address the host's name resolves to; where it resolves to nothing (the
    # lab's namespace hosts) it fails ("device.cc:99 rv == 0. -3 vs 0"). jax 0.10.2 has no
    # public setting for gloo's interface (torch reads GLOO_SOCKET_IFNAME itself): hand it on.
    make = xla_bridge._jax.make_gloo_tcp_collectives
    xla_bridge._jax.make_gloo_tcp_collectives = functools.partial(
        make, interface=os.environ["GLOO_SOCKET_IFNAME"]
    )

import keras  # noqa: E402
import numpy as np  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    keras.distribution.initialize()  # the KERAS_DISTRIBUTION_* variables tfdeploy set
    rank, world = jax.process_index(), jax.process_count()
    print(f"process {rank} of {world}, devices {jax.device_count()}", flush=True)
    # Each process feeds its own shard (numpy arrays: Keras shards only a tf.data.Dataset).
    keras.distribution.set_distribution(keras.distribution.DataParallel(auto_shard_dataset=False))
    keras.utils.set_random_seed(0)  # the same initial weights on every process
    rng = np.random.default_rng(0)
    x = rng.normal(size=(512, 8)).astype("float32")
    y = (x @ np.arange(1.0, 9.0, dtype="float32")[:, None] + 0.5).astype("float32")
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    model.fit(x[rank::world], y[rank::world], batch_size=64, epochs=args.epochs, verbose=2)
    checksum = sum(float(np.asarray(w, dtype="float64").sum()) for w in model.get_weights())
    print(f"weights checksum {checksum:.6f}", flush=True)


if __name__ == "__main__":
    main()
