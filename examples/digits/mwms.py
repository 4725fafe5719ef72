"""Digits on MultiWorkerMirroredStrategy, custom training loop; every chief and worker runs it."""

from __future__ import annotations

import argparse
import os
import sys

import common


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch", type=int, default=64, help="global batch size")
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--fail-at-epoch", type=int, default=None, help="inject a failure")
    parser.add_argument("--fail-task", default="worker:1", help="task that fails, e.g. worker:1")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    common.quiet_tensorflow()
    common.print_env_banner()
    common.tf_config()  # a clear error beats MWMS silently training as a single worker
    me = common.task_name()
    x_train, y_train, x_test, y_test = common.load_digits()

    import keras  # after the banner, so a slow import still shows the env first
    import tensorflow as tf

    # Blocks until every peer in TF_CONFIG is up (no timeout: the deployer enforces one).
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    common.log(f"{me}: {strategy.num_replicas_in_sync} replicas in sync")

    dataset = (
        tf.data.Dataset.from_tensor_slices((x_train, y_train))
        # Same seed everywhere: DATA sharding needs every worker to see the same order.
        .shuffle(len(y_train), seed=1, reshuffle_each_iteration=True)
        .batch(args.batch, drop_remainder=True)
    )
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    dist_dataset = strategy.experimental_distribute_dataset(dataset.with_options(options))

    with strategy.scope():
        model = common.build_model()
        optimizer = keras.optimizers.Adam(learning_rate=args.lr)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

    def replica_step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            per_example = loss_fn(y, model(x, training=True))
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=args.batch)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    @tf.function
    def train_step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        per_replica = strategy.run(replica_step, args=(x, y))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    for epoch in range(1, args.epochs + 1):
        if args.fail_at_epoch == epoch and me == args.fail_task:
            common.log(f"{me}: injected failure at epoch {epoch} (--fail-at-epoch), exiting 1")
            # A normal exit blocks ~20 s in MWMS's shutdown barrier waiting for the peers;
            # a failing task should die at once, like a crash.
            os._exit(1)
        total, steps = 0.0, 0
        for x, y in dist_dataset:
            total += float(train_step(x, y))
            steps += 1
        common.log(f"epoch {epoch} loss {total / max(steps, 1):.4f}")

    common.report_accuracy(common.accuracy(model(x_test, training=False), y_test))
    return 0


if __name__ == "__main__":
    sys.exit(main())
