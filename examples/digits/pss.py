"""Digits on ParameterServerStrategy, one script for every role (the TF tutorial's layout).

- chief: the coordinator's training loop; with --checkpoint-dir (or $CHECKPOINT_DIR) it saves a
  checkpoint after every epoch;
- ps, worker: a tf.distribute.Server that joins forever (what `tfdeploy:server` does; under
  tfdeploy give workers `tfdeploy:server`: a worker running your command is awaited, and a
  joining server never ends);
- evaluator: the side-car evaluation: each new checkpoint of the chief, until the last epoch's.
  The chief and the evaluator must see one checkpoint directory (shared storage).
"""

from __future__ import annotations

import argparse
import os
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
    parser.add_argument(
        "--checkpoint-dir",
        default=os.environ.get("CHECKPOINT_DIR", ""),
        help="the chief saves a checkpoint there after every epoch; the evaluator reads them",
    )
    parser.add_argument(
        "--eval-timeout",
        type=float,
        default=120.0,
        help="the evaluator fails when the chief writes no new checkpoint for this long",
    )
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
    if task_type not in ("chief", "ps", "worker", "evaluator"):
        sys.exit(f"error: pss.py: unknown task type {task_type!r} in TF_CONFIG")
    x_train, y_train, x_test, y_test = common.load_digits()

    import keras  # after the banner, so a slow import still shows the env first
    import tensorflow as tf

    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    if task_type in ("ps", "worker"):
        server = tf.distribute.Server(
            resolver.cluster_spec(),
            job_name=resolver.task_type,
            task_index=resolver.task_id,
            protocol=resolver.rpc_layer or "grpc",
            start=True,
        )
        common.log(f"{common.task_name()}: serving")
        server.join()  # forever: stopping it is the deployer's job
        return 0
    if task_type == "evaluator":
        return evaluate(args, x_test, y_test)

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
    epoch_done = tf.Variable(0, dtype=tf.int64)
    checkpoint = tf.train.Checkpoint(model=model, epoch=epoch_done)
    manager = None
    if args.checkpoint_dir:
        manager = tf.train.CheckpointManager(checkpoint, args.checkpoint_dir, max_to_keep=2)

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
        if manager is not None:
            epoch_done.assign(epoch)
            manager.save(checkpoint_number=epoch)

    common.report_accuracy(common.accuracy(model(x_test, training=False), y_test))
    # The servers stay in join() forever; stopping them is the deployer's job, not ours.
    return 0


def evaluate(args: argparse.Namespace, x_test: object, y_test: object) -> int:
    """The side-car evaluator: each new checkpoint of the chief, until the last epoch's."""
    import tensorflow as tf

    me = common.task_name()
    model = common.build_model()
    epoch = tf.Variable(0, dtype=tf.int64)
    checkpoint = tf.train.Checkpoint(model=model, epoch=epoch)
    directory = args.checkpoint_dir
    if not directory:
        sys.exit(f"error: {me}: no --checkpoint-dir (or $CHECKPOINT_DIR) to evaluate")
    common.log(f"{me}: evaluating the checkpoints in {directory}")
    for path in tf.train.checkpoints_iterator(
        directory, min_interval_secs=0.2, timeout=args.eval_timeout
    ):
        checkpoint.restore(path).expect_partial()
        value = common.accuracy(model(x_test, training=False), y_test)
        common.log(f"{me}: {os.path.basename(path)} (epoch {int(epoch)}): accuracy {value:.3f}")
        if int(epoch) >= args.epochs:
            common.report_accuracy(value)
            return 0
    sys.exit(
        f"error: {me}: no new checkpoint in {os.path.abspath(directory)} for "
        f"{args.eval_timeout:g} s; is it storage the chief writes to (--checkpoint-dir)?"
    )


if __name__ == "__main__":
    sys.exit(main())
