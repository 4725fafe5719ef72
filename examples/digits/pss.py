"""Digits on ParameterServerStrategy: the chief runs this loop, ps and workers tfdeploy:server."""

from __future__ import annotations

import argparse
import sys

import common


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--steps-per-epoch", type=int, default=50)
    parser.add_argument(
        "--steps", type=int, default=None, help="total steps; overrides --epochs (rounded up)"
    )
    parser.add_argument("--batch", type=int, default=64, help="batch size per worker step")
    parser.add_argument("--lr", type=float, default=0.01)
    args = parser.parse_args(argv)
    if args.steps is not None:
        args.epochs = max(1, -(-args.steps // args.steps_per_epoch))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    common.quiet_tensorflow()
    common.print_env_banner()
    config = common.tf_config()
    task_type = config.get("task", {}).get("type")
    if task_type != "chief":
        sys.exit(f"error: pss.py runs on the chief only; {task_type!r} tasks use tfdeploy:server")
    x_train, y_train, x_test, y_test = common.load_digits()

    import keras  # after the banner, so a slow import still shows the env first
    import tensorflow as tf

    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    # Blocks until every ps and worker answers (no timeout: the deployer enforces one).
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
    common.log(f"chief: {len(resolver.cluster_spec().as_dict().get('worker', []))} workers up")

    def dataset_fn() -> tf.data.Dataset:
        # Runs on each worker; different shuffles per worker are fine for async training.
        return (
            tf.data.Dataset.from_tensor_slices((x_train, y_train))
            .shuffle(len(y_train))
            .repeat()
            .batch(args.batch, drop_remainder=True)
        )

    with strategy.scope():
        model = common.build_model()
        optimizer = keras.optimizers.Adam(learning_rate=args.lr)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    per_worker_iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))

    @tf.function
    def train_step(iterator: tf.data.Iterator) -> tf.Tensor:
        def replica_step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=True))
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            return loss

        x, y = next(iterator)
        per_replica = strategy.run(replica_step, args=(x, y))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    for epoch in range(1, args.epochs + 1):
        losses = [
            coordinator.schedule(train_step, args=(per_worker_iterator,))
            for _ in range(args.steps_per_epoch)
        ]
        coordinator.join()
        mean = sum(float(loss.fetch()) for loss in losses) / len(losses)
        common.log(f"epoch {epoch} loss {mean:.4f}")

    common.report_accuracy(common.accuracy(model(x_test, training=False), y_test))
    # The servers stay in join() forever; stopping them is the deployer's job, not ours.
    return 0


if __name__ == "__main__":
    sys.exit(main())
