"""The built-in `tfdeploy:server` task: serve this task's slot of TF_CONFIG's cluster, forever."""

from __future__ import annotations

import json
import os
import sys

import protocol

# An evaluator is in no other task's cluster dict (its own lists it alone, at port 0) and must not
# start a server here (TF_NOTES; deployer/config/roles.py).
_SERVING_TYPES = protocol.CLUSTER_ROLES


class ConfigError(Exception):
    """TF_CONFIG cannot describe a server for this task."""


def parse_tf_config(raw: str | None) -> tuple[str, int, str]:
    """Return (task type, index, address) of this task, or raise ConfigError."""
    if not raw:
        raise ConfigError("TF_CONFIG is not set; tfdeploy:server needs the cluster and its task")
    try:
        config = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"TF_CONFIG is not valid JSON ({exc.msg} at char {exc.pos})") from None
    if not isinstance(config, dict):
        raise ConfigError("TF_CONFIG must be a JSON object with 'cluster' and 'task'")
    cluster, task = config.get("cluster"), config.get("task")
    if not isinstance(cluster, dict) or not isinstance(task, dict):
        raise ConfigError("TF_CONFIG must have a 'cluster' object and a 'task' object")
    task_type, index = task.get("type"), task.get("index")
    if task_type == "evaluator":
        raise ConfigError("an evaluator runs the user's script, it must not start a server")
    if task_type not in _SERVING_TYPES:
        raise ConfigError(f"task type {task_type!r} is not one of {', '.join(_SERVING_TYPES)}")
    if not isinstance(index, int) or isinstance(index, bool) or index < 0:
        raise ConfigError(f"task index {index!r} is not a non-negative integer")
    addresses = cluster.get(task_type)
    if not isinstance(addresses, list) or index >= len(addresses):
        raise ConfigError(f"cluster has no {task_type}:{index} (its {task_type} list: {addresses})")
    address = addresses[index]
    if not isinstance(address, str) or ":" not in address:
        raise ConfigError(f"{task_type}:{index} address {address!r} is not HOST:PORT")
    return task_type, index, address


def main() -> int:
    try:
        task_type, index, address = parse_tf_config(os.environ.get("TF_CONFIG"))
    except ConfigError as exc:
        print(f"tfdeploy:server: error: {exc}", file=sys.stderr, flush=True)
        return 2
    # Hide TF's INFO chatter (oneDNN notices) but keep warnings and errors in the task log.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    # One inter-op thread on a PSS server deadlocks training silently (TF_NOTES); 2 works.
    if os.environ.get("TF_NUM_INTEROP_THREADS") == "1":
        os.environ["TF_NUM_INTEROP_THREADS"] = "2"
    import tensorflow as tf  # only this remote file may import TF, and only here

    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    server = tf.distribute.Server(
        resolver.cluster_spec(),
        job_name=task_type,
        task_index=index,
        protocol="grpc",
        start=True,
    )
    port = address.rsplit(":", 1)[1]
    print(f"tfdeploy:server {task_type}:{index} serving on port {port}", flush=True)
    server.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
