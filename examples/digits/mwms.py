"""Digits on MultiWorkerMirroredStrategy, custom training loop; every chief, worker and evaluator
runs it.

The evaluator (optional) builds the same strategy and model, then evaluates each checkpoint the
chief writes until the last epoch's: give it and the chief one checkpoint directory they both
see (`--checkpoint-dir` or $CHECKPOINT_DIR on shared storage).

A notice (SIGTERM: a spot interruption, a stop; SIGUSR1: Slurm's `[slurm] signal = "USR1@..."`)
reaches TensorFlow's `PreemptionCheckpointHandler`: every worker saves a checkpoint at the same
step, past the last epoch's, and exits 143 (128 + SIGTERM); the next attempt resumes from it.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from typing import Any

import common

# What a worker that saved on a notice exits with: 128 + SIGTERM, as a shell reports a process
# SIGTERM ended (and TF's own exit code on GCP). Under tfdeploy's on_failure = "restart-job" a
# code of 128+ is retryable, so a worker that saved because a PEER got the notice (a spot
# interruption reaches one host) is restarted with the rest; the noticed tasks end `preempted`.
NOTICE_EXIT = 143
KEPT = 8  # checkpoints a worker can hold: 3 of epochs and 2 of notices


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
        "--notice-signals",
        default="TERM,USR1",
        help="signals that mean 'this machine is going away': every worker saves a checkpoint "
        f"at the same step and exits {NOTICE_EXIT} (SIGTERM: a spot notice or a stop; SIGUSR1: "
        "the example of [slurm] signal); empty: none",
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


def checkpoints_by_step(managers: list[tuple[Any, int]]) -> dict[int, str]:
    """Each checkpoint these managers hold, by the global step it was saved at: `(manager,
    steps per number)`, the notice ones numbered by step, the epoch ones by epoch. At a step
    both hold, the first manager's."""
    held: dict[int, str] = {}
    for manager, steps in managers:
        for path in manager.checkpoints:
            held.setdefault(int(path.rsplit("-", 1)[1]) * steps, path)
    return held


def common_step(strategy: Any, held: dict[int, str]) -> int:
    """The newest step every worker holds a checkpoint of (0: none, start afresh).

    Each worker restores its own copy, and a whole-job restart can stop one worker before it
    saved the checkpoint its peers saved: restoring each one's latest would leave the ranks
    apart, disagreeing on the steps left (a hang or a crash at the next collective). So the
    workers gather, in one collective, the steps each holds (its newest KEPT; the managers
    keep fewer), and all take the newest one that every worker holds."""
    import tensorflow as tf

    newest = sorted(held, reverse=True)[:KEPT]
    local = tf.constant([newest + [-1] * (KEPT - len(newest))], dtype=tf.int64)
    rows = strategy.gather(strategy.run(lambda: tf.identity(local)), axis=0).numpy().tolist()
    everyone = set.intersection(*(set(row) for row in rows)) - {-1}
    return max(everyone, default=0)


def notice_signals(names: str) -> list[signal.Signals]:
    """`TERM,USR1` as signals; an unknown name is the user's mistake, said at once."""
    found = []
    for name in filter(None, (n.strip().upper() for n in names.split(","))):
        try:
            found.append(signal.Signals["SIG" + name.removeprefix("SIG")])
        except KeyError:
            sys.exit(f"error: --notice-signals: no signal {name!r}")
    return found


def preemption_handler(
    strategy: Any, me: str, directory: str, save: Any, signals: list[signal.Signals]
) -> Any:
    """TensorFlow's PreemptionCheckpointHandler, told of a notice by any of `signals`.

    Left to itself on a machine outside GCP it watches SIGTERM only, restores the newest
    checkpoint of the manager it is given and exits 42. Here a signal handler of our own notes
    each notice signal and the handler polls the note (`termination_watcher_fn`, once a second);
    the worker that got it tells the others through the coordination service, every worker
    saves (`save_fn`) before the same step and exits NOTICE_EXIT. Its manager holds nothing
    and never saves, so it restores nothing and counts steps from 0 on every worker: the
    workers restore the newest checkpoint they all hold themselves (common_step).
    """
    import tensorflow as tf

    noticed = threading.Event()
    got: list[str] = []

    def note(signum: int, frame: object) -> None:  # no print here: it may interrupt one
        got.append(signal.Signals(signum).name)
        noticed.set()

    for sig in signals:
        signal.signal(sig, note)

    told = threading.Event()

    def watcher() -> bool:
        if noticed.is_set() and not told.is_set():
            told.set()
            common.log(f"{me}: {got[0]}: a notice, saving a checkpoint before the next step")
        return noticed.is_set()

    def leave() -> None:
        whose = "its" if noticed.is_set() else "a peer's"
        common.log(f"{me}: saved on {whose} notice, exiting {NOTICE_EXIT}")
        sys.exit(NOTICE_EXIT)

    # The handler reads its own deprecated step count when it saves: not the user's concern.
    tf.get_logger().addFilter(lambda record: "total_run_calls" not in record.getMessage())

    config = tf.distribute.experimental.TerminationConfig(
        termination_watcher_fn=watcher, exit_fn=leave, grace_period=0, save_fn=save
    )
    nothing = tf.train.CheckpointManager(
        tf.train.Checkpoint(), os.path.join(directory, "handler"), 1
    )
    return tf.distribute.experimental.PreemptionCheckpointHandler(
        strategy.cluster_resolver, nothing, termination_config=config
    )


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
    per_epoch = len(y_train) // args.batch
    total_steps = per_epoch * args.epochs
    manager = handler = None
    held: dict[int, str] = {}
    if args.checkpoint_dir:
        directory = own_checkpoint_dir(args.checkpoint_dir, me)
        # Three kept: a worker stopped before it saved the epoch its peers saved is one behind.
        manager = tf.train.CheckpointManager(checkpoint, directory, max_to_keep=3)
        # A notice's checkpoint (mid-epoch), numbered by its step; the evaluator never sees it.
        noticed = tf.train.CheckpointManager(checkpoint, os.path.join(directory, "notice"), 2)
        held = checkpoints_by_step([(noticed, 1), (manager, per_epoch)])

        def save_on_notice() -> None:
            at, done, began = int(step), int(epoch_done), time.monotonic()
            path = noticed.save(checkpoint_number=at)  # collective: every worker saves
            took, into = time.monotonic() - began, at - done * per_epoch
            common.log(
                f"{me}: saved {path} at step {at}, {into} into epoch {done + 1} in {took:.2f} s"
            )

        signals = notice_signals(args.notice_signals)
        if signals:
            handler = preemption_handler(strategy, me, directory, save_on_notice, signals)
    resume = common_step(strategy, held) if manager is not None else 0
    if resume:
        path = held[resume]
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

    first_step = True
    for epoch in range(int(epoch_done) + 1, args.epochs + 1):
        if args.fail_at_epoch == epoch and me == args.fail_task:
            common.log(f"{me}: injected failure at epoch {epoch} (--fail-at-epoch), exiting 1")
            # A normal exit blocks ~20 s in MWMS's shutdown barrier waiting for the peers;
            # a failing task should die at once, like a crash.
            os._exit(1)
        # A notice's checkpoint resumes mid-epoch: the batches trained before it are skipped.
        skip = int(step) - (epoch - 1) * per_epoch
        total, steps = 0.0, 0
        for x, y in dist_dataset:
            if skip > 0:
                skip -= 1
                continue
            # The handler saves (and exits) before a step when any worker got a notice.
            loss = float(handler.run(train_step, x, y) if handler else train_step(x, y))
            step.assign_add(1)
            total += loss
            steps += 1
            report(int(step), total_steps, loss=loss, epoch=epoch)
            if first_step:
                # "Time to first step": when the environment, the cluster and the first
                # collective all worked (bench.env reads this line).
                common.log(f"{me}: first step done")
                first_step = False
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
