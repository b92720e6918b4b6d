"""The torch and TensorFlow loader adapters used as merlin-dataloader's users use
them: map functions that cannot apply, batch sizes, a peeked batch a tf.function
would skip, positions of other data. Frameworks are imported inside each case (the
corpus loads without them)."""

from __future__ import annotations

import numpy as np
import pandas as pd

import tabstream as ts


def _frame(n: int = 10) -> pd.DataFrame:
    return pd.DataFrame({"a": np.arange(n, dtype=np.int64), "label": np.arange(n) % 2})


def _tf(**kwargs):
    from tabstream.loaders.tensorflow import Loader

    return Loader(ts.Dataset(_frame()), 4, labels=["label"], **kwargs)


def _torch(**kwargs):
    from tabstream.loaders.torch import Loader

    return Loader(ts.Dataset(_frame()), 4, labels=["label"], **kwargs)


def _tf_map_not_a_function(tmp):
    _tf().map("weights")


def _torch_map_not_a_function(tmp):
    _torch().map(None)


def _tf_map_of_a_missing_column(tmp):
    # traced at once: refused at map(), and the loader stays unmapped
    loader = _tf()
    try:
        loader.map(lambda x, y: (x["weight"], y))
    finally:
        got = [f["a"].numpy().tolist() for f, _ in loader]
        assert got == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]], got


def _tf_batch_size_zero(tmp):
    _tf().batch_size = 0


def _torch_batch_size_float(tmp):
    _torch().batch_size = 2.5


def _tf_peeked_batch_into_a_tf_function(tmp):
    import tensorflow as tf

    loader = _tf()
    loader.peek()
    tf.function(lambda it: next(it)[1])(iter(loader))


def _tf_position_of_other_data(tmp):
    state = _tf().position(0, 1)
    from tabstream.loaders.tensorflow import Loader

    Loader(ts.Dataset(_frame(11)), 4, labels=["label"]).set_position(state)


def _torch_position_past_the_epoch(tmp):
    _torch().position(0, 4)


def _tf_map_then_rows_by_id(tmp):
    # a good input: the mapped batches are the rows, in order, plus one
    loader = _tf().map(lambda x, y: (x["a"] + 1, y))
    got = np.concatenate([a.numpy() for a, _ in loader])
    np.testing.assert_array_equal(got, _frame()["a"].to_numpy() + 1)


CASES = [
    ("tf_map_not_a_function", _tf_map_not_a_function, TypeError,
     r"map takes a function of \(features, labels\), got str 'weights'"),
    ("torch_map_not_a_function", _torch_map_not_a_function, TypeError,
     r"map takes a function of \(features, labels\), got NoneType None"),
    ("tf_map_of_a_missing_column", _tf_map_of_a_missing_column, KeyError, "weight"),
    ("tf_batch_size_zero", _tf_batch_size_zero, ValueError, r"^batch_size must be >= 1, got 0$"),
    ("torch_batch_size_float", _torch_batch_size_float, TypeError, "batch_size must be an int"),
    ("tf_peeked_batch_into_a_tf_function", _tf_peeked_batch_into_a_tf_function, ValueError,
     r"holds the batch loader.peek\(\) returned, which a tf.function .* would skip: take it "
     r"with next\(loader\) first, or call loader.stop\(\)"),
    ("tf_position_of_other_data", _tf_position_of_other_data, ValueError,
     r"taken with rows 10, this loader has 11: load the data the position was taken on"),
    ("torch_position_past_the_epoch", _torch_position_past_the_epoch, ValueError,
     r"batches=4 is more than the 3 batches of epoch 0 each rank yields"),
    ("tf_map_then_rows_by_id", _tf_map_then_rows_by_id, None, None),
]
