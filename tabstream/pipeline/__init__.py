"""Datasets, schemas, graphs, workflows and exports."""

from tabstream.pipeline.dataset import Dataset
from tabstream.pipeline.graph import ColumnSelector, Node
from tabstream.pipeline.schema import ColumnSchema, Schema, Tags
from tabstream.pipeline.workflow import TransformedDataset, Workflow

__all__ = ["ColumnSchema", "ColumnSelector", "Dataset", "Node", "Schema", "Tags",
           "TransformedDataset", "Workflow"]
