"""TensorFlow's "Multi-worker training with Estimator" tutorial, on digits (TF <= 2.15 only).

The tutorial's program, kept as it is: an Estimator whose `model_fn` wraps a small Keras CNN,
`RunConfig(train_distribute=MultiWorkerMirroredStrategy())` and
`tf.estimator.train_and_evaluate(...)`, run unchanged by every task, workers and evaluator alike
(two workers train, the evaluator evaluates the chief's checkpoints). What differs, and why:

- the data: scikit-learn's bundled 8x8 digits (common.load_digits) instead of
  `tfds.load("mnist")`, which downloads; the CNN's input is (8, 8, 1) instead of (28, 28, 1);
- `tf.compat.v1.disable_eager_execution()` first, as TF 2.15 itself asks: in eager mode the
  workers train, but the evaluator dies copying the Estimator ("ValueError:
  MultiWorkerMirroredStrategy cannot be deep copied in eager mode. If you're using Estimator and
  see this error message, call tf.compat.v1.disable_eager_execution() at the beginning of your
  program", measured);
- the specs' numbers are flags: `TrainSpec(max_steps=...)` over a repeated dataset, so the job
  ends and the evaluator knows when (without max_steps it evaluates forever), and
  `EvalSpec(start_delay_secs=..., throttle_secs=...)` (the defaults, 120 s and 600 s, are longer
  than the whole job here); `--learning-rate` (the tutorial's 1e-4 learns little in a few hundred
  steps of plain SGD);
- an accuracy metric, and INFO logging for the tf.estimator lines that say what happened
  ("Saving dict for global step 300: accuracy = ...").

`--model-dir` must be storage that the chief (worker 0) and the evaluator both see: the chief
writes its checkpoints there and the evaluator reads them (S3, GCS, NFS/EFS, or one path on one
host). Estimator was removed in TensorFlow 2.16: run this with tensorflow-cpu 2.15.1.
"""

from __future__ import annotations

import argparse
import logging
import sys

import common

BUFFER_SIZE = 10000
BATCH_SIZE = 64


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", default="/tmp/multiworker", help="shared by chief+evaluator")
    parser.add_argument("--max-steps", type=int, default=300)
    parser.add_argument("--learning-rate", type=float, default=0.05)
    parser.add_argument("--start-delay-secs", type=int, default=1)
    parser.add_argument("--throttle-secs", type=int, default=1)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    common.quiet_tensorflow()
    common.print_env_banner()
    x_train, y_train, x_test, y_test = common.load_digits()

    import tensorflow as tf  # after the banner, so a slow import still shows the env first

    tf.compat.v1.disable_eager_execution()
    # Only tf.estimator's own lines ("Saving dict for global step ..."), not every INFO line.
    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.INFO)
    logging.getLogger("tensorflow").addFilter(
        lambda record: record.levelno > logging.INFO or "global step" in record.getMessage()
    )

    def input_fn(mode: str, input_context: tf.distribute.InputContext | None = None) -> object:
        train = mode == tf.estimator.ModeKeys.TRAIN
        x, y = (x_train, y_train) if train else (x_test, y_test)
        dataset = tf.data.Dataset.from_tensor_slices((x.reshape(-1, 8, 8, 1), y))
        if input_context:
            dataset = dataset.shard(
                input_context.num_input_pipelines, input_context.input_pipeline_id
            )
        dataset = dataset.cache().shuffle(BUFFER_SIZE)
        return (dataset.repeat() if train else dataset).batch(BATCH_SIZE)

    def model_fn(features: object, labels: object, mode: str) -> tf.estimator.EstimatorSpec:
        model = tf.keras.Sequential(
            [
                tf.keras.layers.Conv2D(32, 3, activation="relu", input_shape=(8, 8, 1)),
                tf.keras.layers.MaxPooling2D(),
                tf.keras.layers.Flatten(),
                tf.keras.layers.Dense(64, activation="relu"),
                tf.keras.layers.Dense(10),
            ]
        )
        logits = model(features, training=False)

        if mode == tf.estimator.ModeKeys.PREDICT:
            predictions = {"logits": logits}
            return tf.estimator.EstimatorSpec(labels=labels, predictions=predictions)

        optimizer = tf.compat.v1.train.GradientDescentOptimizer(learning_rate=args.learning_rate)
        loss = tf.keras.losses.SparseCategoricalCrossentropy(
            from_logits=True, reduction=tf.keras.losses.Reduction.NONE
        )(labels, logits)
        loss = tf.reduce_sum(loss) * (1.0 / BATCH_SIZE)
        if mode == tf.estimator.ModeKeys.EVAL:
            accuracy = tf.compat.v1.metrics.accuracy(labels, tf.argmax(logits, axis=1))
            return tf.estimator.EstimatorSpec(
                mode, loss=loss, eval_metric_ops={"accuracy": accuracy}
            )

        return tf.estimator.EstimatorSpec(
            mode=mode,
            loss=loss,
            train_op=optimizer.minimize(loss, tf.compat.v1.train.get_or_create_global_step()),
        )

    strategy = tf.distribute.experimental.MultiWorkerMirroredStrategy()
    config = tf.estimator.RunConfig(train_distribute=strategy)
    classifier = tf.estimator.Estimator(model_fn=model_fn, model_dir=args.model_dir, config=config)
    tf.estimator.train_and_evaluate(
        classifier,
        train_spec=tf.estimator.TrainSpec(input_fn=input_fn, max_steps=args.max_steps),
        eval_spec=tf.estimator.EvalSpec(
            input_fn=input_fn,
            start_delay_secs=args.start_delay_secs,
            throttle_secs=args.throttle_secs,
        ),
    )
    common.log(f"{common.task_name()}: train_and_evaluate returned")
    return 0


if __name__ == "__main__":
    sys.exit(main())
