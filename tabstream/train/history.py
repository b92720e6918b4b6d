"""The per-epoch history that ``fit`` returns, the same for torch and Keras.

``history`` is a dict of lists, one value per epoch::

    epoch, loss, samples, samples_per_sec, time_s            always
    val_loss, val_log_loss, val_auc                          with a validation loader

>>> history = {k: [] for k in history_keys(validation=True)}
>>> record_epoch(history, epoch=0, epochs=2, loss_sum=6.0, samples=8, run_samples=8,
...              elapsed=2.0, metrics={"loss": 0.5, "log_loss": 0.5, "auc": 0.75})
'epoch 1/2: loss 0.7500  val_loss 0.5000  val_auc 0.7500  4 samples/s'
>>> history["loss"], history["samples_per_sec"]
([0.75], [4.0])
"""

from __future__ import annotations

from collections.abc import Mapping

__all__: list[str] = []   # used by the fit loops only

TRAIN_KEYS = ("epoch", "loss", "samples", "samples_per_sec", "time_s")
VALID_KEYS = ("val_loss", "val_log_loss", "val_auc")


def history_keys(validation: bool) -> list[str]:
    """The history's keys, the ``val_*`` ones only with a validation loader."""
    return [*TRAIN_KEYS, *(VALID_KEYS if validation else ())]


def record_epoch(
    history: dict[str, list[float]],
    *,
    epoch: int,
    epochs: int,
    loss_sum: float,
    samples: float,
    run_samples: float,
    elapsed: float,
    metrics: Mapping[str, float] | None = None,
) -> str:
    """Append epoch ``epoch`` (0-based) to ``history``; return its summary line.

    ``loss_sum`` is summed over ``samples`` rows (the epoch's mean loss is their
    ratio, NaN for no rows); ``run_samples`` rows were trained in ``elapsed``
    seconds (fewer than ``samples`` when the epoch resumed from a checkpoint).
    ``metrics`` is the validation result (``loss``, ``log_loss``, ``auc``).
    """
    history["epoch"].append(epoch + 1)
    history["loss"].append(loss_sum / samples if samples else float("nan"))
    history["samples"].append(int(samples))
    history["samples_per_sec"].append(run_samples / elapsed if elapsed > 0 else float("nan"))
    history["time_s"].append(elapsed)
    line = f"epoch {epoch + 1}/{epochs}: loss {history['loss'][-1]:.4f}"
    if metrics is not None:
        history["val_loss"].append(metrics["loss"])
        history["val_log_loss"].append(metrics["log_loss"])
        history["val_auc"].append(metrics["auc"])
        line += f"  val_loss {metrics['loss']:.4f}  val_auc {metrics['auc']:.4f}"
    return f"{line}  {history['samples_per_sec'][-1]:,.0f} samples/s"
