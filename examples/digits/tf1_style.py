"""Digits, TF1 launcher style: cluster from --ps_hosts/--worker_hosts flags, between-graph training.

Flags (host:port lists are comma-separated, as a TF1 launcher passes them):
  --job_name ps|worker|chief   --task_index N   --ps_hosts LIST   --worker_hosts LIST
  [--chief_hosts LIST]   [--epochs N] [--batch N] [--lr X]

With tfdeploy, put the placeholders in the task command (TF_CONFIG is ignored here):
  python3 tf1_style.py --job_name={task_type} --task_index={task_index} \
      --ps_hosts={ps_hosts} --worker_hosts={worker_hosts} [--chief_hosts={chief_hosts}]

ps tasks serve and join forever (the deployer stops them). Every worker (and the chief, if any)
trains asynchronously against the variables on the ps with tf.compat.v1 between-graph replication,
prints test_accuracy and exits 0. The chief, else worker 0, initialises the variables.
"""

from __future__ import annotations

import argparse
import sys
import time

import common
import numpy as np


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Digits, TF1 launcher style (see module doc).")
    parser.add_argument("--job_name", required=True, choices=["ps", "worker", "chief"])
    parser.add_argument("--task_index", type=int, required=True)
    parser.add_argument("--ps_hosts", required=True)
    parser.add_argument("--worker_hosts", required=True)
    parser.add_argument("--chief_hosts", default="")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.005)
    parser.add_argument("--init-timeout", type=float, default=60.0, help="seconds to wait for init")
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

    cluster = tf.train.ClusterSpec(jobs)
    server = tf.distribute.Server(cluster, job_name=args.job_name, task_index=args.task_index)
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

    v1 = tf.compat.v1
    v1.disable_eager_execution()
    my_device = f"/job:{args.job_name}/task:{args.task_index}"
    with v1.device(v1.train.replica_device_setter(worker_device=my_device, cluster=cluster)):
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
        init_op = v1.global_variables_initializer()
        # Only waiters build this op: an op nobody runs makes TF log an error at exit.
        uninitialized = None if is_chief else v1.report_uninitialized_variables()

    # Talk only to the ps and ourselves: a finished (exited) peer worker must not break us.
    config = v1.ConfigProto(device_filters=["/job:ps", my_device])
    with v1.Session(server.target, config=config) as sess:
        if uninitialized is None:
            sess.run(init_op)
        else:
            deadline = time.monotonic() + args.init_timeout
            while len(sess.run(uninitialized)):
                if time.monotonic() > deadline:
                    sys.exit(
                        f"error: {me}: variables still uninitialised after "
                        f"{args.init_timeout:.0f} s; is {trainers[0]} running?"
                    )
                time.sleep(0.2)
        rng = np.random.default_rng(rank)
        for epoch in range(1, args.epochs + 1):
            order = rng.permutation(len(y_mine))
            losses = []
            for start in range(0, len(order) - args.batch + 1, args.batch):
                batch = order[start : start + args.batch]
                _, value = sess.run([train_op, loss], {x: x_mine[batch], y: y_mine[batch]})
                losses.append(value)
            step = sess.run(global_step)
            common.log(f"epoch {epoch} loss {sum(losses) / len(losses):.4f} global_step {step}")
        common.report_accuracy(common.accuracy(sess.run(logits, {x: x_test}), y_test))
    return 0


if __name__ == "__main__":
    sys.exit(main())
