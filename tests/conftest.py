import os

import numpy as np
import pandas as pd
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


@pytest.fixture
def small_raw() -> pd.DataFrame:
    """A small Criteo-like frame with nulls, negatives and repeated categories."""
    rng = np.random.default_rng(7)
    n = 2_000
    cats = np.array(["a", "b", "c", "d", "e", "f", "g", "h"])
    c1 = cats[np.minimum(rng.geometric(0.35, n) - 1, len(cats) - 1)].astype(object)
    c1[rng.random(n) < 0.1] = None
    c2 = np.array([f"{v:08x}" for v in rng.integers(0, 300, n)], dtype=object)
    i1 = rng.geometric(0.1, n).astype("float64") - 3
    i1[rng.random(n) < 0.2] = np.nan
    return pd.DataFrame({
        "label": rng.integers(0, 2, n),
        "I1": pd.array(np.where(np.isnan(i1), None, i1), dtype="Int64"),
        "I2": rng.lognormal(1.0, 1.0, n),
        "C1": pd.array(c1, dtype="str"),
        "C2": pd.array(c2, dtype="str"),
        "row_id": np.arange(n),
    })
