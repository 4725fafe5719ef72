"""Digits, TF1 between-graph replication: the distributed TensorFlow how-to's program.

The program of TensorFlow 1's "Distributed TensorFlow" how-to (and of "Learning TensorFlow",
chapter 9), under tf.compat.v1: the cluster from --ps_hosts/--worker_hosts flags into a
`tf.train.ClusterSpec`, a `tf.train.Server` per task, ps tasks `server.join()` forever, workers
build the graph under `tf.train.replica_device_setter` (variables on the ps, ops on the worker)
and train in a `tf.train.MonitoredTrainingSession` until a `StopAtStepHook`'s global step. What
differs, and why: the data is scikit-learn's digits (the book's `input_data.read_data_sets`
downloads MNIST), the model a small MLP, each trainer prints its test accuracy, and each
session's ConfigProto has `device_filters` (the ps and the trainer itself), as TF1 advised for
between-graph replication: without them a session created after a peer trainer exited waits for
that peer forever (measured: a worker that first looked before the chief had initialised, then
slept 30 s while the chief trained to the end and exited, hung for good).

Flags (host:port lists are comma-separated, as a TF1 launcher passes them):
  --job_name ps|worker|chief   --task_index N   --ps_hosts LIST   --worker_hosts LIST
  [--chief_hosts LIST]   [--steps N] [--batch N] [--lr X] [--checkpoint_dir DIR]

With tfdeploy, put the placeholders in the task command (TF_CONFIG is ignored here):
  python3 tf1_style.py --job_name={task_type} --task_index={task_index} \
      --ps_hosts={ps_hosts} --worker_hosts={worker_hosts} [--chief_hosts={chief_hosts}]

The chief (the chief task, else worker 0) initialises the variables; the others wait for it:
MonitoredTrainingSession's non-chief sessions check every 30 s (SessionManager's
recovery_wait_secs), so a worker that looks before the chief has initialised starts up to 30 s
later. Every trainer stops once the shared global step reaches --steps, prints test_accuracy and
exits 0; the ps serve until the deployer stops them.
"""

from __future__ import annotations

import argparse
import sys

import common
import numpy as np


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Digits, TF1 between-graph (see module doc).")
    parser.add_argument("--job_name", required=True, choices=["ps", "worker", "chief"])
    parser.add_argument("--task_index", type=int, required=True)
    parser.add_argument("--ps_hosts", required=True)
    parser.add_argument("--worker_hosts", required=True)
    parser.add_argument("--chief_hosts", default="")
    parser.add_argument("--steps", type=int, default=600, help="global steps, all trainers")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.005)
    parser.add_argument("--checkpoint_dir", default=None, help="the chief's checkpoints")
    return parser.parse_args(argv)


def cluster_jobs(args: argparse.Namespace) -> dict[str, list[str]]:
    jobs = {"ps": args.ps_hosts, "worker": args.worker_hosts, "chief": args.chief_hosts}
    cluster = {name: [h for h in hosts.split(",") if h] for name, hosts in jobs.items()}
    cluster = {name: hosts for name, hosts in cluster.items() if hosts}
    if "ps" not in cluster or "worker" not in cluster:
        sys.exit("error: --ps_hosts and --worker_hosts must each name at least one host:port")
    if args.task_index < 0 or args.task_index >= len(cluster.get(args.job_name, [])):
        sys.exit(f"error: --task_index {args.task_index} is outside --{args.job_name}_hosts")
    return cluster


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    common.quiet_tensorflow()
    common.print_env_banner()
    jobs = cluster_jobs(args)
    me = f"{args.job_name}:{args.task_index}"

    import tensorflow as tf  # after the banner, so a slow import still shows the env first

    v1 = tf.compat.v1
    v1.disable_eager_execution()
    cluster = v1.train.ClusterSpec(jobs)
    server = v1.train.Server(cluster, job_name=args.job_name, task_index=args.task_index)
    if args.job_name == "ps":
        common.log(f"{me}: serving on {jobs['ps'][args.task_index]}")
        server.join()
        return 0

    x_train, y_train, x_test, y_test = common.load_digits()
    trainers = [f"chief:{i}" for i in range(len(jobs.get("chief", [])))]
    trainers += [f"worker:{i}" for i in range(len(jobs["worker"]))]
    rank = trainers.index(me)
    # Each trainer takes its own slice of the training set.
    x_mine, y_mine = x_train[rank :: len(trainers)], y_train[rank :: len(trainers)]
    is_chief = rank == 0

    worker_device = f"/job:{args.job_name}/task:{args.task_index}"
    with v1.device(v1.train.replica_device_setter(worker_device=worker_device, cluster=cluster)):
        x = v1.placeholder(tf.float32, [None, 64])
        y = v1.placeholder(tf.int64, [None])
        init = v1.glorot_uniform_initializer(seed=7)  # same start on every trainer
        w1 = v1.get_variable("w1", [64, 64], initializer=init)
        b1 = v1.get_variable("b1", [64], initializer=v1.zeros_initializer())
        w2 = v1.get_variable("w2", [64, common.NUM_CLASSES], initializer=init)
        b2 = v1.get_variable("b2", [common.NUM_CLASSES], initializer=v1.zeros_initializer())
        logits = tf.matmul(tf.nn.relu(tf.matmul(x, w1) + b1), w2) + b2
        loss = tf.reduce_mean(
            tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits)
        )
        global_step = v1.train.get_or_create_global_step()
        train_op = v1.train.AdamOptimizer(args.lr).minimize(loss, global_step=global_step)

    hooks = [v1.train.StopAtStepHook(last_step=args.steps)]
    # Each trainer's sessions talk to the ps and itself only (TF1's advice for between-graph
    # replication): else a session created after a peer trainer exited waits for it forever.
    config = v1.ConfigProto(device_filters=["/job:ps", worker_device])
    rng = np.random.default_rng(rank)
    order = rng.permutation(len(y_mine))
    position, epoch, losses = 0, 1, []
    with v1.train.MonitoredTrainingSession(
        master=server.target,
        is_chief=is_chief,
        checkpoint_dir=args.checkpoint_dir,
        hooks=hooks,
        config=config,
        log_step_count_steps=None,
    ) as sess:
        while not sess.should_stop():
            if position + args.batch > len(order):
                step = sess.run_step_fn(lambda step_context: step_context.session.run(global_step))
                common.log(f"epoch {epoch} loss {np.mean(losses):.4f} global_step {step}")
                order, position, epoch, losses = rng.permutation(len(y_mine)), 0, epoch + 1, []
            batch = order[position : position + args.batch]
            position += args.batch
            _, value = sess.run([train_op, loss], {x: x_mine[batch], y: y_mine[batch]})
            losses.append(value)
        # The raw session, without the hooks: evaluation is no training step.
        predicted = sess.run_step_fn(
            lambda step_context: step_context.session.run(logits, {x: x_test})
        )
    common.report_accuracy(common.accuracy(predicted, y_test))
    return 0


if __name__ == "__main__":
    sys.exit(main())
