"""DLRM in Keras 3 on Criteo-like logs: the tabstream loader vs a hand-written tf.data pipeline.

    python examples/dlrm_keras.py                   # 1M rows of raw logs
    python examples/dlrm_keras.py --rows 20000 --batch-size 1024

Steps:

1. Criteo-like raw TSV logs (label, I1..I13 counts, C1..C26 hashed categories),
   one file per "day"; the last day is held out for validation. The generator also
   writes each row's true click probability, whose AUC is the best any model can do.
2. The Criteo recipe (``tabstream.recipes.criteo_workflow``): Categorify the
   categoricals, FillMissing/Clip/LogOp/Normalize the counts; fit on the training
   days, export train (shuffled) and valid to parquet.
3. A Keras 3 ``DLRM`` compiled with LazyAdam (only the batch's rows of each
   embedding table move), binary cross-entropy, AUC and log-loss, trained with
   ``model.fit(tabstream TF loader, validation_data=valid loader)`` and a
   ``ThroughputCallback``.
4. The same model, from the same seed, fed the same exported parquet by the
   pipeline users write by hand: ``pandas.read_parquet`` of the files,
   ``tf.data.Dataset.from_tensor_slices((dict(df), labels))``, ``shuffle``,
   ``batch``, ``prefetch``.

Prints, for example (the defaults, on a loaded 2-core machine; numbers vary)::

    export: 750,000 train rows, 250,000 valid rows, 26 categorical + 13 continuous (17.6 s)
    tabstream loader     54,682 samples/s   val AUC 0.7846   val log-loss 0.4565   (setup 0.26 s)
    tf.data by hand       7,816 samples/s   val AUC 0.7840   val log-loss 0.4573   (setup 1.03 s)
    oracle val AUC 0.8035 (true click probabilities); a constant guess has AUC 0.5
    tabstream loader / tf.data by hand samples/s: 7.0x

samples/s counts the training rows of all epochs over their time from the start
of each epoch to its last training batch (``ThroughputCallback``; validation
excluded). Each model first takes one warm-up step, which traces its train step
(about 10 s on a CPU, whatever the data size), so the rate is the steady one.
*setup* is the time spent building the input pipeline before ``fit``: for the
hand-written one, reading the parquet into memory and slicing it into tensors.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from dataclasses import dataclass
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

DAYS = 4
# A common hand-written choice: shuffle within a window of this many rows (a
# full-dataset buffer would hold every row twice in memory).
SHUFFLE_BUFFER = 100_000


@dataclass
class Result:
    """One training run: samples/s, validation AUC and log-loss, pipeline setup seconds."""

    pipeline: str
    samples_per_sec: float
    val_auc: float
    val_logloss: float
    setup_s: float


# --------------------------------------------------------------------------- data


def build_export(workdir: str, rows: int, seed: int, freq_threshold: int) -> tuple[str, str, str]:
    """Raw TSV days -> Criteo recipe -> ``workdir/train`` (shuffled), ``workdir/valid``.

    Returns (train dir, valid dir, the valid day's probabilities parquet file).
    Exports already in ``workdir`` (from an earlier run with ``--workdir``) are reused.
    """
    import tabstream as ts
    from tabstream.datasets.synthetic import CRITEO_COLUMNS, CRITEO_DTYPES, write_data
    from tabstream.recipes import criteo_workflow

    raw_dir = os.path.join(workdir, "raw")
    train_dir, valid_dir = os.path.join(workdir, "train"), os.path.join(workdir, "valid")
    prob_file = os.path.join(raw_dir, "probabilities", f"part_{DAYS - 1:05d}.parquet")
    if os.path.exists(train_dir) and os.path.exists(valid_dir):
        return train_dir, valid_dir, prob_file  # exports appear complete or not at all
    files = write_data("criteo", raw_dir, rows, num_files=DAYS, fmt="tsv", seed=seed,
                       return_probability=True)
    read = {"names": CRITEO_COLUMNS, "dtypes": CRITEO_DTYPES, "sep": "\t"}
    train_raw, valid_raw = ts.Dataset(files[:-1], **read), ts.Dataset(files[-1:], **read)
    workflow = criteo_workflow(freq_threshold=freq_threshold)
    workflow.fit(train_raw)
    workflow.transform(train_raw).to_parquet(train_dir, out_files_per_proc=2,
                                             shuffle="per_worker", seed=seed)
    # no shuffle: valid rows stay aligned with the generator's probabilities
    workflow.transform(valid_raw).to_parquet(valid_dir)
    return train_dir, valid_dir, prob_file


def oracle_auc(valid_dir: str, prob_file: str) -> float:
    """AUC of the true click probabilities on the valid rows, measured like the
    model's (Keras ``AUC``), so the two are comparable."""
    import keras
    import pandas as pd

    labels = read_export(valid_dir)["label"].to_numpy()
    prob = pd.read_parquet(prob_file)["probability"].to_numpy()
    auc = keras.metrics.AUC()
    auc.update_state(labels, prob)
    return float(auc.result())


# ------------------------------------------------------------------------- models


def compiled_dlrm(schema: Any, lr: float, seed: int) -> Any:
    """A fresh Keras DLRM (16-wide embeddings), compiled with LazyAdam and
    binary cross-entropy on logits; metrics ``auc`` and ``logloss``."""
    import keras

    from tabstream.train.tensorflow import DLRM, LazyAdam, binary_classification_metrics

    keras.utils.set_random_seed(seed)
    model = DLRM(schema, embedding_dim=16, bottom_mlp=(64,), top_mlp=(64, 32), seed=seed)
    model.compile(optimizer=LazyAdam(lr),
                  loss=keras.losses.BinaryCrossentropy(from_logits=True),
                  metrics=binary_classification_metrics())
    return model


def fit_and_measure(name: str, model: Any, train: Any, valid: Any, train_rows: int,
                    epochs: int, setup_s: float) -> Result:
    """``model.fit`` with a ThroughputCallback, after one warm-up step; the last
    epoch's validation metrics."""
    from tabstream.train.tensorflow import ThroughputCallback

    # One warm-up step traces the train step (~10 s on CPU, once per model), so
    # that samples/s is the steady rate. It starts (and drops) an epoch of ``train``.
    model.fit(train, epochs=1, steps_per_epoch=1, shuffle=False, verbose=0)
    speed = ThroughputCallback(num_samples=train_rows, verbose=0)
    history = model.fit(train, validation_data=valid, epochs=epochs, shuffle=False, verbose=0,
                        callbacks=[speed]).history
    # all epochs' rows over all epochs' training time
    seconds = sum(train_rows / rate for rate in speed.samples_per_sec)
    return Result(name, epochs * train_rows / seconds, history["val_auc"][-1],
                  history["val_logloss"][-1], setup_s)


# ---------------------------------------------------------------------- pipelines


def tabstream_pipeline(train_dir: str, valid_dir: str, batch_size: int, seed: int) -> tuple[Any, Any]:
    """The tabstream TF loaders: ``tf.data.Dataset``s of ``(features, label)``
    batches, ``features["C1"]`` int64 ``(B,)``, ``features["I1"]`` float32 ``(B,)``."""
    from tabstream.loaders.tensorflow import Loader

    train = Loader(train_dir, batch_size=batch_size, shuffle=True, seed=seed)
    valid = Loader(valid_dir, batch_size=batch_size, shuffle=False)
    return train, valid


def read_export(export_dir: str) -> Any:
    """All data files of an export as one DataFrame (the sidecar files start with
    ``_``, so pandas reads the folder as it is)."""
    import pandas as pd

    return pd.read_parquet(export_dir)


def handwritten_pipeline(train_dir: str, valid_dir: str, batch_size: int,
                         seed: int) -> tuple[Any, Any]:
    """What a user writes: whole frames in memory, sliced into per-row elements,
    shuffled in a window, batched. Same element structure as the tabstream loader."""
    import tensorflow as tf

    def dataset(export_dir: str) -> tf.data.Dataset:
        df = read_export(export_dir)
        labels = df.pop("label")
        return tf.data.Dataset.from_tensor_slices((dict(df), labels))

    train = (dataset(train_dir)
             .shuffle(SHUFFLE_BUFFER, seed=seed, reshuffle_each_iteration=True)
             .batch(batch_size)
             .prefetch(tf.data.AUTOTUNE))
    valid = dataset(valid_dir).batch(batch_size).prefetch(tf.data.AUTOTUNE)
    return train, valid


PIPELINES = {"tabstream loader": tabstream_pipeline, "tf.data by hand": handwritten_pipeline}


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="raw log rows (all days)")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=8192)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--freq-threshold", type=int, default=15,
                        help="Categorify: rarer categories share the out-of-vocabulary id")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", help="where raw logs and exports go (default: a temporary folder)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> list[Result]:
    args = parse_args(argv)
    import tensorflow as tf  # noqa: F401  (imported here so that no setup time includes it)

    import tabstream as ts

    with tempfile.TemporaryDirectory(prefix="tabstream-dlrm-") as tmp:
        workdir = args.workdir or tmp
        started = time.perf_counter()
        train_dir, valid_dir, prob_file = build_export(workdir, args.rows, args.seed,
                                                       args.freq_threshold)
        train_ds = ts.Dataset(train_dir)
        schema, train_rows = train_ds.schema, train_ds.num_rows
        print(f"export: {train_rows:,} train rows, {ts.Dataset(valid_dir).num_rows:,} valid rows, "
              f"{len(schema.select_by_tag('categorical'))} categorical + "
              f"{len(schema.select_by_tag('continuous'))} continuous "
              f"({time.perf_counter() - started:.1f} s)", flush=True)

        results = []
        for name, pipeline in PIPELINES.items():
            t = time.perf_counter()
            train, valid = pipeline(train_dir, valid_dir, args.batch_size, args.seed)
            setup_s = time.perf_counter() - t
            model = compiled_dlrm(schema, args.lr, args.seed)
            result = fit_and_measure(name, model, train, valid, train_rows, args.epochs, setup_s)
            print(f"{name:<17} {result.samples_per_sec:>9,.0f} samples/s   val AUC "
                  f"{result.val_auc:.4f}   val log-loss {result.val_logloss:.4f}   "
                  f"(setup {setup_s:.2f} s)", flush=True)
            results.append(result)
        oracle = oracle_auc(valid_dir, prob_file)

    print(f"oracle val AUC {oracle:.4f} (true click probabilities); a constant guess has AUC 0.5")
    loader, by_hand = results
    print(f"tabstream loader / tf.data by hand samples/s: "
          f"{loader.samples_per_sec / by_hand.samples_per_sec:.1f}x")
    return results


if __name__ == "__main__":
    main()
