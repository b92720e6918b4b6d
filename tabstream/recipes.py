"""Ready-made workflows. The Criteo recipe is the one NVTabular users know:

    C1..C26  >> Categorify(freq_threshold=15)
    I1..I13  >> FillMissing(0) >> Clip(min_value=0) >> LogOp() >> Normalize()
    label    kept, tagged TARGET + BINARY_CLASSIFICATION
"""

from __future__ import annotations

from typing import Any

from tabstream import ops
from tabstream.core.graph import Node
from tabstream.core.schema import Tags
from tabstream.datasets.synthetic import CRITEO_CATEGORICAL, CRITEO_CONTINUOUS, CRITEO_LABEL
from tabstream.pipeline.workflow import Workflow

__all__ = ["RECIPES", "criteo_graph", "criteo_workflow"]


def criteo_graph(freq_threshold: int = 15, categorical: list[str] | None = None,
                 continuous: list[str] | None = None, label: str = CRITEO_LABEL) -> Node:
    cats = (categorical or CRITEO_CATEGORICAL) >> ops.Categorify(freq_threshold=freq_threshold)
    conts = ((continuous or CRITEO_CONTINUOUS) >> ops.FillMissing(0) >> ops.Clip(min_value=0)
             >> ops.LogOp() >> ops.Normalize())
    target = [label] >> ops.AddTags([Tags.TARGET, Tags.BINARY_CLASSIFICATION])
    return cats + conts + target


def criteo_workflow(freq_threshold: int = 15, client: Any = None, **kwargs: Any) -> Workflow:
    return Workflow(criteo_graph(freq_threshold, **kwargs), client=client)


RECIPES = {"criteo": criteo_workflow}
