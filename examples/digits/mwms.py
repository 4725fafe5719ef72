"""Digits on MultiWorkerMirroredStrategy, custom training loop; every chief, worker and evaluator
runs it.

The evaluator (optional) builds the same strategy and model, then evaluates each checkpoint the
chief writes until the last epoch's: give it and the chief one checkpoint directory they both
see (`--checkpoint-dir` or $CHECKPOINT_DIR on shared storage).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import common


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch", type=int, default=64, help="global batch size")
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--fail-at-epoch", type=int, default=None, help="inject a failure")
    parser.add_argument("--fail-task", default="worker:1", help="task that fails, e.g. worker:1")
    under_tfdeploy = "TFDEPLOY_RUN_ID" in os.environ
    parser.add_argument(
        "--checkpoint-dir",
        default=os.environ.get("CHECKPOINT_DIR")
        or os.environ.get("TFDEPLOY_CHECKPOINT_DIR")  # [job] checkpoint_dir: the job's own
        or ("ckpt" if under_tfdeploy else ""),
        help="where each epoch is checkpointed and training resumes from; default: ckpt/ in the "
        "task's directory under tfdeploy (a restart-job attempt shares it with the one before), "
        "none otherwise",
    )
    parser.add_argument(
        "--eval-timeout",
        type=float,
        default=120.0,
        help="the evaluator fails when the chief writes no new checkpoint for this long",
    )
    return parser.parse_args(argv)


def own_checkpoint_dir(base: str, me: str) -> str:
    """MWMS saves are collective: every worker saves. The chief (worker:0 when the cluster has
    no chief) writes `base`, the others a directory of their own beside it. Replicas hold the
    same values, so each worker resumes from its own copy, and no shared filesystem is needed.
    """
    chief = me == "chief:0" or (me == "worker:0" and "chief" not in common.tf_config()["cluster"])
    return base if chief else os.path.join(base, "workers", me.replace(":", "-"))


def common_epoch(strategy: Any, manager: Any, epochs: int) -> int:
    """The newest epoch every worker holds a checkpoint of (0: none, start afresh).

    Each worker restores its own copy, and a whole-job restart can stop one worker before it
    saved the epoch its peers saved: restoring each one's latest would leave the ranks an epoch
    apart, disagreeing on the steps left (a hang or a crash at the next collective). So the
    workers count, in one collective sum, which epochs each holds, and all take the newest one
    that every replica holds."""
    import tensorflow as tf

    if manager is None:  # no worker checkpoints (the same arguments everywhere)
        return 0
    held = [0.0] * (epochs + 1)
    held[0] = 1.0
    for path in manager.checkpoints:
        number = int(path.rsplit("-", 1)[1])
        if 0 < number <= epochs:
            held[number] = 1.0
    local = tf.constant(held, dtype=tf.float32)
    counts = strategy.reduce(
        tf.distribute.ReduceOp.SUM, strategy.run(lambda: tf.identity(local)), axis=None
    )
    everyone = strategy.num_replicas_in_sync
    return max(e for e, n in enumerate(counts.numpy().tolist()) if round(n) == everyone)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    common.quiet_tensorflow()
    common.print_env_banner()
    common.tf_config()  # a clear error beats MWMS silently training as a single worker
    me = common.task_name()
    x_train, y_train, x_test, y_test = common.load_digits()

    import keras  # after the banner, so a slow import still shows the env first
    import tensorflow as tf

    # Blocks until every peer in TF_CONFIG is up (no timeout: the deployer enforces one). On the
    # evaluator it needs "evaluator" in its own cluster dict (KeyError: 'evaluator' otherwise).
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    common.log(f"{me}: {strategy.num_replicas_in_sync} replicas in sync")
    if me.startswith("evaluator:"):
        return evaluate(args, strategy, me, x_test, y_test)

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

    # The training state a whole-job restart (on_failure = "restart-job") resumes from.
    epoch_done = tf.Variable(0, dtype=tf.int64)
    step = tf.Variable(0, dtype=tf.int64)
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, epoch=epoch_done, step=step)
    manager = None
    if args.checkpoint_dir:
        directory = own_checkpoint_dir(args.checkpoint_dir, me)
        # Three kept: a worker stopped before it saved the epoch its peers saved is one behind.
        manager = tf.train.CheckpointManager(checkpoint, directory, max_to_keep=3)
    resume = common_epoch(strategy, manager, args.epochs)
    if manager is not None and resume:
        path = os.path.join(manager.directory, f"ckpt-{resume}")
        with strategy.scope():  # Keras builds optimizer slots lazily: build them to restore them
            optimizer.build(model.trainable_variables)
        checkpoint.restore(path).assert_existing_objects_matched()
        common.log(
            f"{me}: resumed from {path} after epoch {int(epoch_done)} "
            f"(step {int(step)}), attempt {os.environ.get('TFDEPLOY_ATTEMPT', '0')}"
        )

    # Progress for tfdeploy's live view, `status`, `runs` and `report` (TFDEPLOY_METRICS):
    # tfdeploy puts tfdeploy_metrics on the task's PYTHONPATH; elsewhere this reports nothing.
    try:
        from tfdeploy_metrics import report
    except ImportError:

        def report(step: int, total_steps: int | None = None, **values: float) -> None:
            pass

    per_epoch = len(y_train) // args.batch
    total_steps = per_epoch * args.epochs
    first_step = True
    for epoch in range(int(epoch_done) + 1, args.epochs + 1):
        if args.fail_at_epoch == epoch and me == args.fail_task:
            common.log(f"{me}: injected failure at epoch {epoch} (--fail-at-epoch), exiting 1")
            # A normal exit blocks ~20 s in MWMS's shutdown barrier waiting for the peers;
            # a failing task should die at once, like a crash.
            os._exit(1)
        total, steps = 0.0, 0
        for x, y in dist_dataset:
            loss = float(train_step(x, y))
            total += loss
            steps += 1
            report(int(step) + steps, total_steps, loss=loss, epoch=epoch)
            if first_step:
                # "Time to first step": when the environment, the cluster and the first
                # collective all worked (bench.env reads this line).
                common.log(f"{me}: first step done")
                first_step = False
        step.assign_add(steps)
        epoch_done.assign(epoch)
        if manager is not None:
            manager.save(checkpoint_number=epoch)  # collective: every worker saves
        common.log(f"epoch {epoch} loss {total / max(steps, 1):.4f} step {int(step)}")

    common.report_accuracy(common.accuracy(model(x_test, training=False), y_test))
    return 0


def evaluate(
    args: argparse.Namespace, strategy: object, me: str, x_test: object, y_test: object
) -> int:
    """The evaluator: each new checkpoint of the chief, until the one of the last epoch."""
    import tensorflow as tf

    with strategy.scope():  # type: ignore[attr-defined]
        model = common.build_model()
    epoch = tf.Variable(0, dtype=tf.int64)
    checkpoint = tf.train.Checkpoint(model=model, epoch=epoch)
    directory = args.checkpoint_dir or "ckpt"
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
