"""Synthetic datasets: criteo-like and e-commerce-like click logs with known click probabilities."""

from tabstream.datasets.synthetic import (
    CRITEO_CATEGORICAL,
    CRITEO_COLUMNS,
    CRITEO_CONTINUOUS,
    CRITEO_DTYPES,
    CRITEO_LABEL,
    DATASET_NAMES,
    ECOMMERCE_COLUMNS,
    ECOMMERCE_DTYPES,
    ECOMMERCE_LABEL,
    ECOMMERCE_TAGS,
    generate_data,
    write_data,
)

__all__ = [
    "CRITEO_CATEGORICAL",
    "CRITEO_COLUMNS",
    "CRITEO_CONTINUOUS",
    "CRITEO_DTYPES",
    "CRITEO_LABEL",
    "DATASET_NAMES",
    "ECOMMERCE_COLUMNS",
    "ECOMMERCE_DTYPES",
    "ECOMMERCE_LABEL",
    "ECOMMERCE_TAGS",
    "generate_data",
    "write_data",
]
