"""The shipped Keras callback in a real `model.fit` (tf.keras: Keras 3 behind TF 2.16+, or
tf-keras with TF_USE_LEGACY_KERAS): one record per reported step, the total known, the loss."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HELPER = Path(__file__).resolve().parents[2] / "remote" / "taskside"
FIT = f"""
import sys
sys.path.insert(0, {str(HELPER)!r})
import numpy as np
import tensorflow as tf
from tfdeploy_metrics import KerasMetrics
x = np.random.rand(256, 4).astype("float32")
y = (x.sum(1) > 2).astype("int32")
model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(2)])
model.compile(
    loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), optimizer="adam"
)
model.fit(x, y, batch_size=32, epochs=3, verbose=0, callbacks=[KerasMetrics(every_s=0)])
"""


@pytest.mark.starts_tf
@pytest.mark.slow
def test_keras_metrics_reports_each_step_once_with_total_and_loss(tmp_path: Path) -> None:
    pytest.importorskip("tensorflow")
    metrics = tmp_path / "metrics.jsonl"
    env = os.environ | {"TFDEPLOY_METRICS": str(metrics), "TF_CPP_MIN_LOG_LEVEL": "3"}
    subprocess.run([sys.executable, "-c", FIT], env=env, check=True, timeout=600)
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, 25))  # 256 / 32 x 3 epochs
    assert all(r["total_steps"] == 24 and r["loss"] > 0 for r in records)
