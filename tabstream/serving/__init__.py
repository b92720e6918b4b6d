"""Serving: a fitted Workflow inside the exported model (raw columns in, model inputs out).

:func:`~tabstream.serving.plan.build_plan` turns the Workflow into a framework-free
plan of in-graph steps; :mod:`tabstream.serving.keras` and
:mod:`tabstream.serving.torch` (imported on use: each needs its framework) run it
as a Keras layer or an ``nn.Module`` (``Workflow.to_keras()``, ``Workflow.to_torch()``).
See ``docs/serving.md``.
"""

from tabstream.serving.inputs import raw_arrays
from tabstream.serving.plan import REFUSED, InputSpec, OutputSpec, ServingPlan, build_plan

__all__ = ["InputSpec", "OutputSpec", "REFUSED", "ServingPlan", "build_plan", "raw_arrays"]
