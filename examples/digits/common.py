"""Shared bits of the digits examples: env banner, offline data, model and task identity."""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

TEST_FRACTION = 0.2
SPLIT_SEED = 0
NUM_CLASSES = 10


def quiet_tensorflow() -> None:
    """Silence TF's C++ logs and oneDNN notices unless the user chose otherwise."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")


def print_env_banner() -> None:
    """One line with what the deployer gave this task, so tests and humans can check it."""
    print(
        "tfdeploy-env"
        f" TF_CONFIG={os.environ.get('TF_CONFIG', '')}"
        f" CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')}"
        f" TFDEPLOY_TASK={os.environ.get('TFDEPLOY_TASK', '<unset>')}",
        flush=True,
    )


def log(message: str) -> None:
    print(message, flush=True)


def tf_config() -> dict[str, Any]:
    raw = os.environ.get("TF_CONFIG")
    if not raw:
        sys.exit("error: TF_CONFIG is not set; run this script through tfdeploy")
    try:
        config = json.loads(raw)
    except json.JSONDecodeError as exc:
        sys.exit(f"error: TF_CONFIG is not valid JSON: {exc}")
    if not isinstance(config, dict):
        sys.exit("error: TF_CONFIG must be a JSON object")
    return config


def task_name() -> str:
    """This task as "worker:1": TFDEPLOY_TASK if set, else derived from TF_CONFIG."""
    name = os.environ.get("TFDEPLOY_TASK")
    if name:
        return name
    task = json.loads(os.environ.get("TF_CONFIG") or "{}").get("task", {})
    return f"{task.get('type', '?')}:{task.get('index', '?')}"


def _digits_csv() -> Path:
    # find_spec locates sklearn without importing it (that import costs ~1 s and pulls scipy).
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("error: scikit-learn is not installed; it ships the digits data set")
    path = Path(next(iter(spec.submodule_search_locations))) / "datasets" / "data" / "digits.csv.gz"
    if not path.is_file():
        sys.exit(f"error: {path} is missing; reinstall scikit-learn")
    return path


def load_digits() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Return x_train, y_train, x_test, y_test; the split is the same on every host."""
    with gzip.open(_digits_csv(), "rt") as fh:
        table = np.loadtxt(fh, delimiter=",", dtype=np.float32)
    x = table[:, :-1] / 16.0  # pixel values are 0..16
    y = table[:, -1].astype(np.int64)
    order = np.random.default_rng(SPLIT_SEED).permutation(len(y))
    n_test = int(len(y) * TEST_FRACTION)
    test, train = order[:n_test], order[n_test:]
    return x[train], y[train], x[test], y[test]


def build_model(hidden: int = 64) -> Any:
    """A small MLP of Keras 3 layers; returns logits. Call inside the strategy's scope."""
    import keras  # keep `import common` cheap for the TF1-style script

    model = keras.Sequential(
        [
            keras.Input(shape=(64,)),
            keras.layers.Dense(hidden, activation="relu"),
            keras.layers.Dense(NUM_CLASSES),
        ]
    )
    return model


def accuracy(logits: Any, labels: np.ndarray) -> float:
    return float(np.mean(np.argmax(np.asarray(logits), axis=1) == labels))


def report_accuracy(value: float) -> None:
    log(f"test_accuracy={value:.3f}")
