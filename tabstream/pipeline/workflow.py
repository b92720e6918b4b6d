"""Workflow: fit an op graph on a Dataset with dask, transform lazily or eagerly,
save and load as JSON plus parquet (never pickle).

>>> import os, tempfile
>>> import pandas as pd
>>> from tabstream import Dataset, Workflow, ops
>>> tmp = tempfile.TemporaryDirectory()
>>> raw = os.path.join(tmp.name, "raw.parquet")
>>> pd.DataFrame({"C1": ["a", "b", "a"], "label": [1, 0, 1]}).to_parquet(raw)
>>> wf = Workflow((["C1"] >> ops.Categorify()) + ["label"])
>>> wf = wf.fit(Dataset(raw))
>>> wf.transform(Dataset(raw)).to_parquet(os.path.join(tmp.name, "out", "train"))
ExportResult('.../out/train', files=1, num_rows=3)
>>> sorted(os.listdir(os.path.join(tmp.name, "out", "train")))
['_manifest.json', '_metadata', '_schema.json', 'part_00000.parquet']
>>> wf.transform(pd.DataFrame({"C1": ["a", None], "label": [1, 0]}))
   C1  label
0   3      1
1   1      0
>>> tmp.cleanup()
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import os
import posixpath
import re
import shutil
import tempfile
import uuid
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import fsspec
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from dask import delayed

import tabstream
from tabstream import backends
from tabstream.core.errors import (
    DataError,
    NotFittedError,
    SchemaError,
    TabstreamError,
    WorkflowWarning,
    listed,
)
from tabstream.core.graph import (
    ColumnSelector,
    Node,
    as_node,
    concat_tables,
    consumer_counts,
    release,
)
from tabstream.core.jsonfile import loads_json
from tabstream.core.pages import small_pages
from tabstream.core.schema import Schema
from tabstream.core.threads import release_freed_memory
from tabstream.pipeline import execution
from tabstream.pipeline.dataset import Dataset, arrow_to_pandas
from tabstream.pipeline.execution import compute, num_workers, tree_reduce
from tabstream.pipeline.transformed import TransformedDataset, client_for, conform
from tabstream.pipeline.vocabulary_delta import (
    DELTA_FOLDER,
    VocabularyChanges,
    VocabularyDelta,
    read_chain,
)

__all__ = ["TransformedDataset", "Workflow", "check_save_target"]

FORMAT_VERSION = 1


class Workflow:
    """A graph of ops with statistics fitted on a dataset.

    Parameters
    ----------
    output_node:
        The graph's output (a node, or column names / a list of nodes).
    client:
        Optional ``dask.distributed.Client``; without one, the threaded scheduler runs
        the tasks in this process.
    """

    def __init__(self, output_node: Any, client: Any = None) -> None:
        self.output_node: Node = as_node(output_node)
        self.client = client
        self.input_schema: Schema | None = None
        self._fitted = False
        #: the vocabulary deltas of every update since the fit, oldest first (see update)
        self.vocabulary_deltas: list[VocabularyDelta] = []

    def __getstate__(self) -> dict[str, Any]:
        """What dask ships to a worker with a task: everything but the client (a
        client holds sockets and event-loop tasks; workers never need it) and the
        vocabulary deltas (they grow with every update; workers never read them)."""
        state = self.__dict__.copy()
        state["client"] = None
        state["vocabulary_deltas"] = []  # the chain of updates: only save() reads it
        return state

    # -- schema -------------------------------------------------------------
    def fit_schema(self, input_schema: Schema) -> Workflow:
        """Compute (and validate) the graph's schemas for ``input_schema``; reads no data."""
        self.output_node.schema_for(input_schema)
        self.input_schema = input_schema
        self.output_node.bind(input_schema)
        return self

    @property
    def output_schema(self) -> Schema:
        if self.input_schema is None:
            raise NotFittedError("the workflow has no input schema yet; call fit(dataset) or fit_schema(schema)")
        return self.output_node.schema_for(self.input_schema)

    @property
    def input_columns(self) -> list[str]:
        """Raw columns the graph reads."""
        assert self.input_schema is not None
        cols: list[str] = []
        for node in self.output_node.walk():
            if node.kind == "select":
                assert node.selector is not None
                cols += [c for c in node.selector.resolve(self.input_schema) if c not in cols]
        return cols

    @property
    def input_dtypes(self) -> dict[str, str]:
        """NVTabular's ``input_dtypes``: ``{raw column the graph reads: dtype}``."""
        self._check_fitted_schema()
        return {c: self.input_schema[c].dtype for c in self.input_columns}  # type: ignore[index]

    @property
    def output_dtypes(self) -> dict[str, str]:
        """NVTabular's ``output_dtypes``: ``{output column: dtype}``."""
        return {c.name: c.dtype for c in self.output_schema}

    def _check_fitted_schema(self) -> None:
        if self.input_schema is None:
            raise NotFittedError("the workflow has no input schema yet; call fit(dataset) or fit_schema(schema)")

    def dictionary_columns(self, dataset: Dataset) -> list[str]:
        """Input string columns that only ops accepting dictionary arrays read (every
        node selecting the column feeds only such ops, e.g. Categorify, and the raw
        column is not an output): the Dataset may hand them over as dictionaries
        (see :meth:`Dataset.read_piece`), which costs no string decoding."""
        assert self.input_schema is not None
        if getattr(dataset, "engine", None) != "parquet":
            return []  # only parquet files store dictionary pages
        nodes = self.output_node.walk()
        users: dict[int, list[Node]] = {}
        for node in nodes:
            for parent in node.parents:
                users.setdefault(parent.id, []).append(node)
        accepted: set[str] = set()
        refused: set[str] = set()
        for node in nodes:
            if node.kind != "select":
                continue
            assert node.selector is not None
            consumers = users.get(node.id, [])
            ok = node is not self.output_node and bool(consumers) and all(
                c.kind == "op" and c.op.accepts_dictionary for c in consumers)
            (accepted if ok else refused).update(node.selector.resolve(self.input_schema))
        schema = dataset.arrow_schema
        return [c for c in self.input_columns if c in accepted and c not in refused and c in schema.names
                and (pa.types.is_string(schema.field(c).type) or pa.types.is_large_string(schema.field(c).type))]

    def _stat_nodes_by_phase(self) -> list[list[Node]]:
        phase: dict[int, int] = {}
        for node in self.output_node.walk():
            upstream = max((phase[p.id] for p in node.parents), default=0)
            is_stat = node.kind == "op" and node.op.is_stat
            phase[node.id] = upstream + (1 if is_stat else 0)
        phases: dict[int, list[Node]] = {}
        for node in self.output_node.walk():
            if node.kind == "op" and node.op.is_stat:
                phases.setdefault(phase[node.id], []).append(node)
        return [phases[k] for k in sorted(phases)]

    # -- fit ----------------------------------------------------------------
    def fit(self, dataset: Dataset | Any, progress: bool | None = None) -> Workflow:
        """Compute every statistics op's state: one pass over the data per dependency
        level of statistics ops, each a tree reduction of per-partition partials."""
        from tabstream.pipeline.regroup import check_graph

        check_graph(self.output_node)
        ds = _as_dataset(dataset)
        self.fit_schema(ds.schema)
        columns = self.input_columns
        phases = self._stat_nodes_by_phase()
        if not phases:  # nothing to fit: no pass over the data counts the rows
            _check_has_rows(ds, ds.num_rows)
        with _runs_on(self, ds), _cluster_spill_dir(self.client, [n.op for nodes in phases for n in nodes]), \
                small_pages():
            try:
                self._fit_phases(ds, columns, phases, progress)
            except BaseException:
                # the fit failed: no later step reads its partials' spills (the ones
                # of ops that finalized were read and removed already)
                for nodes in phases:
                    for node in nodes:
                        node.op.discard_partials()
                raise
        # the partitions and partials of the fit are freed by now, but Arrow's allocator
        # keeps their pages: handed back, the export after the fit (mapping the kept
        # partitions, see Dataset's cache) peaks at its own size, not on top of them
        # (2M Criteo-like rows: export peak RSS about 940 -> 750 MB, same CPU)
        release_freed_memory()
        self._fitted = True
        self.vocabulary_deltas = []  # a new fit starts a new chain
        return self

    def _fit_phases(self, ds: Dataset, columns: list[str], phases: list[list[Node]],
                    progress: bool | None) -> None:
        dictionary = self.dictionary_columns(ds)
        for level, nodes in enumerate(phases):
            stats = self._reduce_level(ds, columns, nodes, dictionary, f"fit level {level + 1}",
                                       progress, first=level == 0)
            for node, partial in zip(nodes, stats, strict=True):
                node.op.finalize(partial)

    def _reduce_level(self, ds: Dataset, columns: list[str], nodes: list[Node], dictionary: list[str],
                      desc: str, progress: bool | None, first: bool) -> list[Any]:
        """The combined partials of ``nodes`` over ``ds``: a tree reduction of
        per-partition partials (every statistics op's pass over the data)."""
        fan_in = fit_fan_in(len(ds.pieces))
        # ops that spill learn whether a partition's partial waits for a combination
        # short of the last (which may spill it as it is: see Categorify); set before
        # the tasks are made, so that a cluster's copies of the ops carry it
        spillers = [n.op for n in nodes if getattr(n.op, "spills", False)]
        for op in spillers:
            op.partials_per_combination = fan_in if len(ds.pieces) > fan_in else None
        try:
            partials = [
                delayed(_fit_piece, pure=False)(ds, piece, columns, nodes, self.input_schema, dictionary)
                for piece in ds.pieces
            ]
            reduced = tree_reduce(partials, _Combine(nodes), fan_in=fan_in,
                                  root=_Combine(nodes, root=True),
                                  shards=_root_shards(self.client, nodes), join=_Combine(nodes).join)
            (stats,) = compute([reduced], self.client, desc=desc, progress=progress)
        finally:
            for op in spillers:
                op.partials_per_combination = None
        rows = stats.pop()  # rows of the input and out of every node evaluated
        if first:
            _check_has_rows(ds, rows[_INPUT_ROWS])
        _check_nodes_have_rows(ds, nodes, rows)
        return stats

    # -- update (a living vocabulary) ------------------------------------------
    def update(self, dataset: Dataset | Any, progress: bool | None = None,
               others: str = "refuse", delta_dir: str | None = None,
               storage_options: dict | None = None) -> VocabularyDelta:
        """Fold a new file list into the fitted statistics without renumbering: every
        Categorify folds the new counts into its vocabularies (kept values keep their
        ids; values reaching ``freq_threshold`` are admitted; under ``max_size`` values
        are evicted by the op's ``eviction`` policy and their ids recycled, see
        :mod:`tabstream.ops.vocabulary_policy`).

        Returns the :class:`~tabstream.pipeline.vocabulary_delta.VocabularyDelta` of
        this update (admitted, evicted and recycled ids per column; ``delta.summary()``),
        also appended to :attr:`vocabulary_deltas`, the chain :meth:`save` writes under
        ``vocabulary/`` and :meth:`load` reads back. Apply it to the embedding tables
        (``ParameterServer.apply_vocabulary_delta``, ``EmbeddingTables.reset_rows``)
        before training on the new data.

        ``delta_dir``: also write the delta there at once, as
        ``delta_dir/update_<n>/`` (see :meth:`VocabularyDelta.write
        <tabstream.pipeline.vocabulary_delta.VocabularyDelta.write>`: complete or
        absent), for a training job that applies it before the workflow is saved;
        ``storage_options`` for an fsspec URL there.

        Statistics ops that cannot update (Normalize, FillMedian, ...) are refused,
        named, unless ``others="keep"``: then their fitted statistics stay as they are.
        The dataset needs the columns the workflow was fitted on, of the same dtypes.
        On an error nothing changes."""
        from tabstream.pipeline.regroup import check_graph

        if others not in ("refuse", "keep"):
            raise ValueError(f"Workflow.update: others must be 'refuse' or 'keep', got {others!r}")
        if not self._fitted or self.input_schema is None:
            raise NotFittedError("Workflow.update folds new data into fitted statistics, but the "
                                 "workflow is not fitted; call fit(dataset) first")
        self._check_fitted()
        check_graph(self.output_node)
        stat_nodes = [n for n in self.output_node.walk() if n.kind == "op" and n.op.is_stat]
        fixed = [f"{type(n.op).__name__} (node {n.id})" for n in stat_nodes if not n.op.updatable]
        if fixed and others == "refuse":
            raise ValueError(
                f"Workflow.update: {', '.join(fixed)} cannot update their statistics (only Categorify "
                "folds new data in); pass others='keep' to keep their fitted statistics as they "
                "are, or fit the workflow again")
        for node in stat_nodes:
            if node.op.updatable:
                try:
                    node.op.check_updatable()
                except ValueError as exc:
                    raise ValueError(f"Workflow.update: node {node.id}: {exc}") from exc
        ds = _as_dataset(dataset)
        self._check_update_schema(ds)
        columns = self.input_columns
        phases = [[n for n in nodes if n.op.updatable] for nodes in self._stat_nodes_by_phase()]
        phases = [nodes for nodes in phases if nodes]
        ops = [n.op for nodes in phases for n in nodes]
        before = [op.get_state() for op in ops]
        changes: dict[str, VocabularyChanges] = {}
        with _runs_on(self, ds), _cluster_spill_dir(self.client, ops), small_pages():
            try:
                dictionary = self.dictionary_columns(ds)
                for level, nodes in enumerate(phases):
                    stats = self._reduce_level(ds, columns, nodes, dictionary, f"update level {level + 1}",
                                               progress, first=level == 0)
                    for node, partial in zip(nodes, stats, strict=True):
                        changes.update(_vocabulary_changes(node.op.update(partial)))
            except BaseException:
                for op, (values, tables) in zip(ops, before, strict=True):
                    op.discard_partials()
                    op.set_state(values, tables)  # nothing changes on an error
                raise
        release_freed_memory()
        previous = self.vocabulary_deltas[-1].name if self.vocabulary_deltas else None
        delta = VocabularyDelta(len(self.vocabulary_deltas) + 1, changes, previous)
        if delta_dir is not None:
            try:
                delta.write(delta_dir, storage_options)
            except BaseException:
                for op, (values, tables) in zip(ops, before, strict=True):
                    op.set_state(values, tables)  # the update did not happen
                raise
        self.vocabulary_deltas.append(delta)
        return delta

    def _check_update_schema(self, ds: Dataset) -> None:
        assert self.input_schema is not None
        schema = ds.schema
        missing = [c for c in self.input_columns if c not in schema.column_names]
        if missing:
            raise SchemaError(f"Workflow.update: {ds!r} lacks the columns {missing} the workflow was "
                              f"fitted on; it has {schema.column_names}")
        for name in self.input_columns:
            have, fitted = schema[name], self.input_schema[name]
            if (have.dtype, have.is_list) != (fitted.dtype, fitted.is_list):
                raise SchemaError(
                    f"Workflow.update: column {name!r} of {ds!r} is {have.dtype}"
                    f"{' (list)' if have.is_list else ''}, but the workflow was fitted on "
                    f"{fitted.dtype}{' (list)' if fitted.is_list else ''}; read it with the "
                    f"fitted dtype (Dataset(..., dtypes={{{name!r}: {fitted.dtype!r}}}))")

    def _check_fitted(self) -> None:
        unfitted = [n.op for n in self.output_node.walk()
                    if n.kind == "op" and n.op.is_stat and not n.op.fitted]
        if self.input_schema is None or unfitted:
            raise NotFittedError(
                f"the workflow is not fitted (unfitted ops: {unfitted}); call fit(dataset) before transform"
            )

    # -- serving (tabstream.serving) ----------------------------------------
    def remove_inputs(self, names: Sequence[str]) -> Workflow:
        """A copy (sharing the fitted ops) without the output columns computed from the
        raw columns ``names`` (a label, other training-only inputs): serving it needs
        none of them."""
        from tabstream.serving.plan import without_inputs

        self._check_fitted()
        assert self.input_schema is not None
        node = without_inputs(self, names)
        if node is None:
            raise ValueError(f"remove_inputs: every output of the workflow is computed from {list(names)}")
        out = Workflow(node, client=self.client)
        out.input_schema = self.input_schema.without(list(names))
        out._fitted = self._fitted
        return out

    def to_keras(self, exclude: Sequence[str] | None = None) -> Any:
        """A Keras layer: raw columns in, the model's inputs out (see docs/serving.md).
        ``exclude``: output columns not served (default: those tagged TARGET)."""
        from tabstream.serving.keras import RawFeatures
        from tabstream.serving.plan import build_plan

        self._check_fitted()
        return RawFeatures(build_plan(self, exclude))

    def to_torch(self, exclude: Sequence[str] | None = None) -> Any:
        """An ``nn.Module``: raw columns in, the model's inputs out (see docs/serving.md).
        ``exclude``: output columns not served (default: those tagged TARGET)."""
        from tabstream.serving.plan import build_plan
        from tabstream.serving.torch import RawFeatures

        self._check_fitted()
        return RawFeatures(build_plan(self, exclude))

    # -- transform ----------------------------------------------------------
    def transform_table(self, table: pa.Table, backend: str = backends.DEFAULT_BACKEND) -> pa.Table:
        """Transform one in-memory Arrow table (one partition) with the kernels of
        ``backend`` (the Dataset's ``backend_name``; arrow for in-memory input)."""
        self._check_fitted()
        assert self.input_schema is not None
        missing = [c for c in self.input_columns if c not in table.column_names]
        if missing:
            raise SchemaError(f"input is missing columns {missing}; it has {table.column_names}")
        table = conform(table.select(self.input_columns), self.input_schema)
        with backends.use(backend):
            return self.output_node.transform(table, self.input_schema)

    def transform(self, data: Any) -> Any:
        """Lazy on a :class:`Dataset` (returns a :class:`TransformedDataset`), eager on a
        pandas DataFrame or Arrow table (returns the same kind).

        A workflow with no statistics op needs no ``fit``: its first ``transform``
        takes the input schema from ``data`` (as NVTabular does)."""
        if self.input_schema is None and not any(
                n.kind == "op" and n.op.is_stat for n in self.output_node.walk()):
            self.fit_schema(_as_dataset(data).schema)
            self._fitted = True
        self._check_fitted()
        if isinstance(data, pd.DataFrame):
            table = pa.Table.from_pandas(data, preserve_index=False)
            return arrow_to_pandas(self.transform_table(table))
        if isinstance(data, pa.Table):
            return self.transform_table(data)
        from tabstream.pipeline.regroup import GroupedTransformedDataset, find_groupby

        groupby = find_groupby(self.output_node)  # its keys must be regrouped across partitions
        if groupby is not None:
            return GroupedTransformedDataset(self, _as_dataset(data), groupby)
        return TransformedDataset(self, _as_dataset(data))

    def fit_transform(self, dataset: Any) -> Any:
        return self.fit(dataset).transform(dataset)

    # -- save / load --------------------------------------------------------
    def save(self, path: str, storage_options: dict | None = None) -> None:
        """Write ``workflow.json`` and one parquet file per fitted statistics table
        (``stats/``, paths relative to the folder), and the chain of vocabulary deltas
        of the updates since the fit (``vocabulary/update_<n>/``, see :meth:`update`).

        On a local disk the save is atomic: everything is written to a hidden
        folder beside ``path`` (``.<name>.tmp-<host>-<pid>-<id>``), which then
        replaces ``path`` in one step (Linux ``renameat2`` exchange; elsewhere two
        renames). A save killed midway leaves the previous save in place, two
        processes saving to one path leave exactly one of their workflows, and the
        hidden folders of killed savers are removed by the next save. An existing
        ``path`` may hold only an earlier save (``workflow.json``, ``stats/``): a save
        replaces the whole folder. On an object store (no rename) the earlier
        ``workflow.json`` is removed first and the new one written last; each names
        its own save's stats files, so of two savers at once the last
        ``workflow.json`` written wins whole. Stats files no save names are removed
        by a later save once an hour old (:data:`STALE_STATS_S`).
        """
        self._check_fitted()
        fs, root = _fs_root(path, storage_options)
        save_id = uuid.uuid4().hex[:12]
        text, files = self._serialize(path, save_id)
        if _is_local(fs):
            _save_local(fs, root, text, files, save_id)
        else:
            _save_in_place(fs, root, text, files)

    def _serialize(self, path: str, save_id: str) -> tuple[str, dict[str, pa.Table | str]]:
        """``workflow.json``'s text and the stats tables by path relative to the
        folder; the stats file names carry ``save_id``, so a load that read another
        save's ``workflow.json`` never takes this save's tables for its own. The
        vocabulary deltas' files (tables, and ``_delta.json`` texts) come with them."""
        assert self.input_schema is not None
        nodes = []
        files: dict[str, pa.Table | str] = {}
        for node in self.output_node.walk():
            entry: dict[str, Any] = {"id": node.id, "kind": node.kind,
                                     "parents": [p.id for p in node.parents]}
            if node.kind == "select":
                assert node.selector is not None
                entry["selector"] = node.selector.to_config()
            elif node.kind in ("drop", "pick"):
                entry["names"] = node.names
            elif node.kind == "op":
                entry["op"] = node.op.to_config()
                if node.op.is_stat:
                    values, tables = node.op.get_state()
                    try:
                        node.op.check_state(values)
                    except (TypeError, ValueError) as exc:  # a bug in the op: say which
                        raise TypeError(f"cannot save node {node.id} ({type(node.op).__name__}): "
                                        f"{exc}") from exc
                    entry["state"] = values
                    entry["tables"] = {}
                    # checked at load: a stats file replaced by another one fails there
                    entry["table_rows"] = {name: int(table.num_rows) for name, table in tables.items()}
                    for name, table in tables.items():
                        base = rel = f"stats/{save_id[:8]}_node{node.id}_{_safe(name)}"
                        k = 1
                        while f"{rel}.parquet" in files:  # names that differ only in odd characters
                            rel, k = f"{base}_{k}", k + 1
                        files[f"{rel}.parquet"] = table
                        entry["tables"][name] = f"{rel}.parquet"
            nodes.append(entry)
        for delta in self.vocabulary_deltas:  # the chain, whole, with every save
            text, tables = delta.files()
            folder = f"{DELTA_FOLDER}/{delta.name}"
            files.update({f"{folder}/{name}": table for name, table in tables.items()})
            files[f"{folder}/_delta.json"] = text
        doc = {
            "format": "tabstream.workflow",
            "version": FORMAT_VERSION,
            "tabstream_version": tabstream.__version__,
            "input_schema": self.input_schema.to_dict(),
            "output_schema": self.output_schema.to_dict(),
            "nodes": nodes,
            "output": self.output_node.id,
        }
        if self.vocabulary_deltas:
            doc["vocabulary_deltas"] = [d.name for d in self.vocabulary_deltas]
        try:
            text = json.dumps(doc, indent=2)  # before touching the folder
        except (TypeError, ValueError) as exc:
            raise TypeError(f"cannot save the workflow to {path!r}: a parameter or state value is not "
                            f"JSON ({exc})") from exc
        return text, files

    @classmethod
    def load(cls, path: str, client: Any = None, storage_options: dict | None = None,
             functions: dict[str, Any] | None = None,
             allowed_modules: Sequence[str] | None = None) -> Workflow:
        """Rebuild a saved workflow. Ops are rebuilt from their JSON parameters by
        registered class name; nothing is unpickled or evaluated.

        ``functions`` passes user functions (LambdaOp, Filter, Rename(f=...)) again,
        keyed by the name they were saved under (``"module:function"``) or by the bare
        function name. Without it, a saved name resolves to a module of your own code
        already imported, or to numpy, pandas or ``pyarrow.compute``; nothing is
        imported from the workflow folder or the current directory, and no other
        installed package is reached. ``allowed_modules`` (``["mypkg"]``) names
        modules you trust, imported from wherever Python finds them (see
        :mod:`tabstream.ops.functions` and docs/concepts.md, "Loading a workflow you
        did not write").
        """
        from tabstream.ops.functions import allowed_modules as allowing
        from tabstream.ops.functions import provided_functions

        fs, root = _fs_root(path, storage_options)
        folder = root if _is_local(fs) else None
        with provided_functions(functions), allowing(allowed_modules, folder=folder):
            try:
                return cls._load(path, client, storage_options)
            except DataError as exc:
                if exc.hint is None:
                    exc.hint = ("the saved workflow was edited or damaged: save it again "
                                "(Workflow.save, or tabstream fit --workflow-dir)")
                raise

    @classmethod
    def _load(cls, path: str, client: Any, storage_options: dict | None) -> Workflow:
        fs, root = _fs_root(path, storage_options)
        doc_path = posixpath.join(root, "workflow.json")
        try:
            with fs.open(doc_path, "r") as f:
                text = f.read()
        except FileNotFoundError:
            raise FileNotFoundError(f"no saved workflow at {path!r} (expected {doc_path})") from None
        except (NotADirectoryError, IsADirectoryError) as exc:
            raise FileNotFoundError(f"no saved workflow at {path!r}: a saved workflow is a folder holding "
                                    f"workflow.json; pass the folder, not a file in it") from exc
        except UnicodeDecodeError as exc:
            raise DataError(f"{doc_path}: not a tabstream workflow file (not UTF-8 text: {exc})") from exc
        try:
            doc = loads_json(text, doc_path, "saved workflow", object_pairs_hook=_unique_keys)
        except _DuplicateKey as exc:
            raise DataError(f"{doc_path}: key {exc.args[0]!r} appears twice in one JSON object; "
                            "a saved workflow names each field once") from None
        except json.JSONDecodeError as exc:
            raise DataError(f"{doc_path}: not valid JSON (line {exc.lineno}, column {exc.colno}: "
                            f"{exc.msg}); save the workflow again with Workflow.save") from exc
        _check_document(doc, doc_path)
        built: dict[int, Node] = {}
        for entry in doc["nodes"]:
            node_id = entry.get("id") if isinstance(entry, dict) else None
            try:
                built[node_id] = _load_node(entry, built, fs, root)  # type: ignore[index]
            except _EntryError as exc:
                raise DataError(f"{doc_path}: node {node_id}: {exc}") from exc.__cause__
            except TabstreamError as exc:  # the op's own error (a user function not found, say)
                raise _with_prefix(exc, f"{doc_path}: node {node_id}: ") from exc
        if doc["output"] not in built:
            raise DataError(f"{doc_path}: field 'output' names node {doc['output']!r}, which is not "
                            f"among the nodes {sorted(built)}")
        wf = cls(built[doc["output"]], client=client)
        try:
            input_schema = Schema.from_dict(doc["input_schema"])
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise DataError(f"{doc_path}: field 'input_schema' is not a schema "
                            f"({type(exc).__name__}: {exc})") from exc
        try:
            wf.fit_schema(input_schema)
        except (KeyError, TypeError, ValueError) as exc:
            raise DataError(f"{doc_path}: the saved graph does not fit its own 'input_schema': {exc}") from exc
        _dry_run(built, input_schema, doc_path)
        _compare_saved_output(wf, doc.get("output_schema"), doc_path)
        wf.vocabulary_deltas = read_chain(fs, root, doc.get("vocabulary_deltas", []), doc_path)
        for node_id, node in built.items():
            if node.kind == "op" and node.op.is_stat and node.op.updatable \
                    and node.op.updates != len(wf.vocabulary_deltas):
                raise DataError(f"{doc_path}: node {node_id}: {type(node.op).__name__} was updated "
                                f"{node.op.updates} times, but the workflow lists "
                                f"{len(wf.vocabulary_deltas)} vocabulary deltas")
        wf._fitted = True
        return wf

    def __repr__(self) -> str:
        return f"Workflow({self.output_node!r})"


def _compare_saved_output(wf: Workflow, saved: Any, doc_path: str) -> None:
    """Warn when the loaded graph's output schema differs from the one the file
    saved in a column's dtype or embedding size: the workflow was saved by a
    tabstream whose rules differed (the embedding-size rule changed before the first
    release), or the file was edited. Tables built from the new schema would not fit
    a model trained on the old one."""
    try:
        saved_schema = Schema.from_dict(saved)
    except (DataError, KeyError, TypeError, ValueError):  # absent or unreadable: the graph's stands
        return
    now = {c.name: c for c in wf.output_schema}
    changed = []
    for col in saved_schema:
        new = now.get(col.name)
        if new is None:
            changed.append(f"{col.name}: saved, not output now")
            continue
        if new.dtype != col.dtype:
            changed.append(f"{col.name}: dtype {col.dtype} saved, {new.dtype} now")
        old_sizes, new_sizes = (c.properties.get("embedding_sizes") for c in (col, new))
        if old_sizes is not None and old_sizes != new_sizes:
            changed.append(f"{col.name}: embedding_sizes {old_sizes} saved, {new_sizes} now")
    changed += [f"{name}: output now, not saved" for name in now if name not in saved_schema.column_names]
    if changed:
        shown = listed(changed, sep="; ")
        warnings.warn(
            f"{doc_path}: the loaded workflow's output schema differs from the one saved in "
            f"the file ({shown}): it was saved by another tabstream version or edited. A model "
            "built from the saved schema's sizes needs them given again; fit and save the "
            "workflow again to record today's", WorkflowWarning, stacklevel=4)


def _vocabulary_changes(updated: dict[str, Any]) -> dict[str, VocabularyChanges]:
    """An op's ``update`` result (per vocabulary: columns, first id, change in slots)
    as changes in ids."""
    out = {}
    for name, (columns, first, change) in updated.items():
        admitted, evicted = (pa.table({"id": pc.add(t["slot"], first), "value": t["value"]})
                             for t in (change.admitted, change.evicted))
        out[name] = VocabularyChanges(tuple(columns), admitted, evicted)
    return out


@contextmanager
def _runs_on(workflow: Workflow, dataset: Any) -> Iterator[None]:
    """For one fit: ``workflow.client`` is the client the dataset's tasks run on (see
    :func:`~tabstream.pipeline.transformed.client_for`; unchanged when the user gave one), restored afterwards."""
    given = workflow.client
    workflow.client = client_for(given, dataset)
    try:
        yield
    finally:
        workflow.client = given


@contextmanager
def _cluster_spill_dir(client: Any, stat_ops: Sequence[Any]) -> Iterator[None]:
    """On a cluster, ops that spill (``spill_dir`` None) are given a folder every
    process can read for this fit: a fresh folder of the client's when all workers
    run on its machine (a worker's own temporary folder is never used), removed
    afterwards. On workers of other machines nothing is set, and such an op refuses
    to spill, asking for a shared ``spill_dir`` (e.g. on an object store)."""
    spillers = [op for op in stat_ops if op.spills and op.spill_dir is None]
    if client is None or not spillers or not execution.workers_share_this_host(client):
        yield
        return
    folder = tempfile.mkdtemp(prefix="tabstream-fit-spill-")
    for op in spillers:
        op.spill_dir = folder
    try:
        yield
    finally:
        for op in spillers:
            op.spill_dir = None
        shutil.rmtree(folder, ignore_errors=True)


#: partials one combination of a fit merges, where the fit's partitions are more than
#: :data:`FIT_FAN_IN_MAX`. Each merge hashes every value of its partials once, and a
#: merged partial past an op's spill limit is written to disk and read back, so fewer
#: levels cost less; but dask runs partitions ahead of the combinations that wait for
#: them, so about twice the fan-in of partials are held at once (31 at 16 on 160
#: partitions). At 8, the 16M-row Criteo fit peaks at 541-555 MB RSS against 665 at
#: 16, in the same time; 4M rows 489-509 against 576-589 MB (benchmarks/RESULTS.md,
#: session 13).
FIT_FAN_IN = 8
#: up to this many partitions are merged in one combination, in memory: 16 partitions
#: (2M Criteo-like rows) fit about 8% faster merged at once than in two levels of 8
#: with a spill (1.32-1.39 against 1.48-1.54 s).
FIT_FAN_IN_MAX = 16


def fit_fan_in(partitions: int) -> int:
    """Partials per combination for a fit of ``partitions`` (see :data:`FIT_FAN_IN`)."""
    return FIT_FAN_IN_MAX if partitions <= FIT_FAN_IN_MAX else FIT_FAN_IN


def _root_shards(client: Any, nodes: Sequence[Node]) -> int:
    """How many tasks share the last combination of a fit: one per thread of the
    threaded scheduler when an op can split its root combination (Categorify: by
    vocabulary), else one. On a cluster it stays one task (each shard task would
    fetch every partial from the workers that made them)."""
    if client is not None or not any(n.op.shards_root for n in nodes):
        return 1
    return num_workers()


class _Combine:
    """Combine per-node partial lists from several partitions."""

    def __init__(self, nodes: Sequence[Node], root: bool = False) -> None:
        self.nodes = list(nodes)
        self.root = root

    @small_pages()  # also in a dask worker process
    def __call__(self, partial_lists: list[list[Any]], shard: int = 0, shards: int = 1) -> list[Any]:
        """The combined partial of every node; with ``shards > 1`` (the last
        combination only) this task's share: an op that ``shards_root`` combines its
        part ``shard`` of ``shards``, the others are combined by shard 0 alone."""
        out = []
        for i, node in enumerate(self.nodes):
            parts = [pl[i] for pl in partial_lists]
            # the last combination of the reduction may use the op's cheaper
            # ``combine_root`` (its result goes straight to ``finalize``)
            if shards > 1 and node.op.shards_root:
                out.append(node.op.combine_root(parts, shard, shards))
            elif shard:
                out.append(None)  # shard 0 combines it
            else:
                out.append(node.op.combine_root(parts) if self.root else node.op.combine(parts))
        # the row counts follow (see _fit_piece)
        out.append(_add_counts([pl[-1] for pl in partial_lists]) if not shard else None)
        return out

    def join(self, shard_lists: list[list[Any]]) -> list[Any]:
        """The shards' results of the last combination (see ``__call__``) as one."""
        out = []
        for i, node in enumerate(self.nodes):
            if node.op.shards_root:
                out.append(node.op.join_root([sl[i] for sl in shard_lists]))
            else:
                out.append(shard_lists[0][i])
        out.extend(shard_lists[0][len(self.nodes):])  # the row counts
        return out


@small_pages()  # also in a dask worker process
def _fit_piece(ds: Dataset, piece: Any, columns: list[str], nodes: list[Node],
               input_schema: Schema, dictionary: Sequence[str] = ()) -> list[Any]:
    """The partial of every node in ``nodes`` for one partition, then the rows of
    the partition and out of every node evaluated for them (``{_INPUT_ROWS: n,
    node id: rows}``), so a fit can say which op left a statistics op no rows."""
    # keep: the export after the fit reads the same columns again (see Dataset's cache)
    table = ds.read_piece(piece, columns, dictionary, keep=True)
    cache: dict[int, pa.Table] = {}
    schema_cache: dict[int, Schema] = {}
    # each node's output leaves the cache once its last reader has it
    uses = consumer_counts([p for node in nodes for p in node.parents])
    rows: dict[int, int] = {}
    out = []
    with backends.use(ds.backend_name):
        for node in nodes:
            parents = [p.transform(table, input_schema, cache, schema_cache, uses, rows) for p in node.parents]
            out.append(node.op.fit_partition(concat_tables(parents)))
            del parents
            for p in node.parents:
                release(p, cache, uses)
    out.append({_INPUT_ROWS: table.num_rows, **rows})
    return out


_INPUT_ROWS = "input"


def _add_counts(counts: Sequence[dict[Any, int]]) -> dict[Any, int]:
    total: dict[Any, int] = {}
    for c in counts:
        for key, rows in c.items():
            total[key] = total.get(key, 0) + rows
    return total


def _check_has_rows(ds: Dataset, rows: int) -> None:
    """Statistics of no rows would be saved as if fitted (and every export of them refused)."""
    if rows == 0:
        where = " after its filters or split" if ds.filtered else ""
        raise DataError(f"cannot fit the workflow on {ds!r}: it has no rows{where}; a workflow "
                        "fitted on no rows has no statistics to save",
                        hint="check the input path (an empty file?) and the dataset's filters")


def _check_nodes_have_rows(ds: Dataset, nodes: Sequence[Node], rows: dict[Any, int]) -> None:
    """A statistics op whose input has no rows, over all partitions, while the
    dataset has some: refused, naming the op upstream that removed them (a Filter
    or Dropna of the workflow), as an export of no rows is refused."""
    for node in nodes:
        if sum(rows.get(p.id, 0) for p in node.parents) > 0:
            continue
        culprit = next((n for n in node.walk() if n is not node and n.kind == "op" and rows.get(n.id) == 0
                        and sum(rows.get(p.id, 0) for p in n.parents) > 0), None)
        by = (f"after {culprit.op!r} (node {culprit.id}), which removed all "
              f"{sum(rows.get(p.id, 0) for p in culprit.parents):,} rows of its input"
              if culprit is not None else "after the ops before it")
        raise DataError(
            f"cannot fit the workflow on {ds!r}: {type(node.op).__name__} (node {node.id}) has no rows "
            f"to fit on {by}; a workflow fitted on no rows has no statistics to save",
            hint="check the Filter's function (or Dropna's columns) against the data, or fit on a "
                 "dataset where some rows pass it")


# -- loading, checked -------------------------------------------------------------
class _EntryError(Exception):
    """A problem with one node entry of workflow.json (the loader adds file and node)."""


class _DuplicateKey(Exception):
    pass


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


_NODE_FIELDS = {
    "select": {"id", "kind", "parents", "selector"},
    "drop": {"id", "kind", "parents", "names"},
    "concat": {"id", "kind", "parents"},
    "union": {"id", "kind", "parents"},
    "pick": {"id", "kind", "parents", "names"},
    "op": {"id", "kind", "parents", "op", "state", "tables", "table_rows"},
}


def _check_document(doc: Any, doc_path: str) -> None:
    """The top level of workflow.json: shape, format marker and version."""
    if not isinstance(doc, dict):
        raise DataError(f"{doc_path}: a workflow file is a JSON object, found {type(doc).__name__}")
    if doc.get("format") != "tabstream.workflow":
        raise DataError(f"{doc_path}: not a tabstream workflow file (field 'format' is "
                        f"{doc.get('format')!r}, expected 'tabstream.workflow')")
    version = doc.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= FORMAT_VERSION:
        newer = isinstance(version, int) and not isinstance(version, bool) and version > FORMAT_VERSION
        raise DataError(
            f"{doc_path}: unknown workflow format version {version!r}; this tabstream "
            f"({tabstream.__version__}) reads versions 1 to {FORMAT_VERSION}"
            + ("; it was written by a newer tabstream, upgrade to load it" if newer else ""))
    for field, kind in (("nodes", list), ("input_schema", dict), ("output", int)):
        if field not in doc:
            raise DataError(f"{doc_path}: field {field!r} is missing")
        if not isinstance(doc[field], kind) or isinstance(doc[field], bool):
            raise DataError(f"{doc_path}: field {field!r} must be a JSON "
                            f"{ {list: 'array', dict: 'object', int: 'integer'}[kind]}, "
                            f"found {_short(doc[field])}")


def _short(value: Any) -> str:
    text = repr(value)
    return f"{text[:57] + '...' if len(text) > 60 else text} ({type(value).__name__})"


def _load_node(entry: Any, built: dict[int, Node], fs: Any, root: str) -> Node:
    if not isinstance(entry, dict):
        raise _EntryError(f"a node entry is a JSON object, found {_short(entry)}")
    node_id, kind = entry.get("id"), entry.get("kind")
    if isinstance(node_id, bool) or not isinstance(node_id, int):
        raise _EntryError(f"field 'id' must be an integer, found {_short(node_id)}")
    if node_id in built:
        raise _EntryError("field 'id' repeats an earlier node's id")
    if not isinstance(kind, str) or kind not in _NODE_FIELDS:
        raise _EntryError(f"unknown kind {kind!r}; known kinds: {sorted(_NODE_FIELDS)}")
    unknown = sorted(set(entry) - _NODE_FIELDS[kind])
    if unknown:
        raise _EntryError(f"unknown fields {unknown} for a {kind!r} node; it has {sorted(_NODE_FIELDS[kind])}")
    parent_ids = entry.get("parents")
    if not isinstance(parent_ids, list) or any(
            isinstance(p, bool) or not isinstance(p, int) or p not in built for p in parent_ids):
        raise _EntryError(f"field 'parents' must list ids of earlier nodes {sorted(built)}, "
                          f"found {_short(parent_ids)}")
    parents = [built[p] for p in parent_ids]
    if kind == "select":
        sel = entry.get("selector")
        if not isinstance(sel, dict) or not isinstance(sel.get("names"), list) \
                or not isinstance(sel.get("tags") or [], list):
            raise _EntryError(f"field 'selector' must be an object with lists 'names' and 'tags', "
                              f"found {_short(sel)}")
        try:
            selector = ColumnSelector(sel["names"], tags=sel.get("tags") or None)
        except (TypeError, ValueError, KeyError) as exc:
            raise _EntryError(f"field 'selector': {exc}") from exc
        return Node("select", selector=selector)
    if kind == "drop":
        names = entry.get("names")
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise _EntryError(f"field 'names' must be a list of column names, found {_short(names)}")
        return Node("drop", parents, names=names)
    if kind == "pick":
        names = entry.get("names")
        if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
            raise _EntryError(f"field 'names' must be a list of column names, found {_short(names)}")
        return Node("pick", parents, names=names)
    if kind in ("concat", "union"):
        return Node(kind, parents)
    op = _load_op(entry)
    if op.is_stat:
        _load_state(op, entry, fs, root)
    elif "state" in entry or "tables" in entry or "table_rows" in entry:
        raise _EntryError(f"{type(op).__name__} has no fitted state, but the entry has "
                          f"{sorted({'state', 'tables', 'table_rows'} & set(entry))}")
    return Node("op", parents, op=op)


def _load_op(entry: dict[str, Any]) -> Any:
    import tabstream.ops  # noqa: F401  (registers the whole op catalog)
    from tabstream.core.operators import Operator

    config = entry.get("op")
    name = config.get("class") if isinstance(config, dict) else None
    try:
        return Operator.from_config(config)  # type: ignore[arg-type]
    except TabstreamError:
        raise  # already names the op and what to do (e.g. a user function not found)
    except (TypeError, ValueError, KeyError, AttributeError, OverflowError) as exc:
        # AttributeError, OverflowError: a parameter of the wrong JSON type that the op's
        # constructor took as the right one (a string for a mapping, Infinity for a count)
        field = "op.class" if "unknown op" in str(exc) or name is None else "op.params"
        raise _EntryError(f"field {field!r} ({name}): {exc}") from exc


def _load_state(op: Any, entry: dict[str, Any], fs: Any, root: str) -> None:
    """Type-check the saved state of a statistics op against its declaration, read its
    stats tables (paths confined to the workflow folder) and restore it."""
    name = type(op).__name__
    for field in ("state", "tables"):
        if field not in entry:
            raise _EntryError(f"{name} is a statistics op but field {field!r} is missing")
    values, refs = entry["state"], entry["tables"]
    try:
        wanted = op.check_state(values)
    except (TypeError, ValueError) as exc:
        raise _EntryError(f"{name}: {exc}") from exc
    if not isinstance(refs, dict) or not all(isinstance(v, str) for v in refs.values()):
        raise _EntryError(f"{name}: field 'tables' must map table names to file paths, found {_short(refs)}")
    missing = [t for t in wanted if t not in refs]
    extra = sorted(set(refs) - set(wanted)) if op.state_types is not None else []
    if missing or extra:
        raise _EntryError(f"{name}: field 'tables' must name the stats tables {wanted}; "
                          + (f"missing {missing}" if missing else f"unexpected {extra}"))
    rows = entry.get("table_rows")  # absent in workflows saved before it was recorded
    if rows is not None and (not isinstance(rows, dict) or set(rows) != set(refs) or not all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in rows.values())):
        raise _EntryError(f"{name}: field 'table_rows' must map each of the tables {sorted(refs)} "
                          f"to its row count, found {_short(rows)}")
    tables = {}
    for table_name, rel in refs.items():
        full = _confined(fs, root, rel, f"tables.{table_name}")
        try:
            with fs.open(full, "rb") as f:
                table = pq.read_table(f)
        except FileNotFoundError as exc:
            raise _EntryError(f"{name}: field 'tables.{table_name}': stats file {full} is missing") from exc
        except (pa.ArrowException, OSError) as exc:
            raise _EntryError(f"{name}: field 'tables.{table_name}': stats file {full} is not a "
                              f"readable parquet file ({exc})") from exc
        try:
            op.check_state_table(table_name, table.schema)
            op.check_state_table_values(table_name, table)
        except (TypeError, ValueError) as exc:
            raise _EntryError(f"{name}: stats file {full}: {exc}") from exc
        if rows is not None and table.num_rows != rows[table_name]:
            raise _EntryError(f"{name}: stats file {full} holds {table.num_rows} rows, workflow.json "
                              f"recorded {rows[table_name]} when it was saved; the file was replaced "
                              "after the save: fit and save the workflow again")
        tables[table_name] = table
    try:
        op.set_state(values, tables)
    except (KeyError, TypeError, ValueError, IndexError, pa.ArrowException) as exc:
        raise _EntryError(f"{name}: the saved state does not restore ({type(exc).__name__}: {exc})") from exc


def _with_prefix(exc: Exception, prefix: str) -> Exception:
    """The same kind of error with ``prefix`` (file and node) before its message."""
    try:
        return type(exc)(prefix + str(exc))
    except TypeError:  # a constructor that takes other arguments
        return DataError(prefix + f"{type(exc).__name__}: {exc}")


def _empty_table(schema: Schema) -> pa.Table | None:
    """A table of no rows with the columns of ``schema``; None when a dtype has no
    Arrow type (then nothing can be checked without data)."""
    from tabstream.core.dtypes import dtype_to_arrow_type

    fields = []
    for col in schema:
        try:
            t = dtype_to_arrow_type(col.dtype)
        except TypeError:
            return None
        fields.append(pa.field(col.name, pa.list_(t) if col.is_list else t))
    return pa.schema(fields).empty_table()


def _dry_run(built: dict[int, Node], input_schema: Schema, doc_path: str) -> None:
    """Run every loaded statistics op on an empty table of the columns it receives and
    hold it to its declared output: state that type-checks but does not fit the graph
    (a mean for another column, a stats table without a column the op reads) fails
    here, at load, naming the node, instead of at the first transform."""
    from tabstream.core.graph import check_produced, concat_schemas

    cache: dict[int, Schema] = {}
    for saved_id, node in built.items():
        if node.kind != "op" or not node.op.is_stat:
            continue
        name = type(node.op).__name__
        inp = concat_schemas([p.schema_for(input_schema, cache) for p in node.parents])
        empty = _empty_table(inp)
        if empty is None:
            continue
        try:
            check_produced(node.op, node.schema_for(input_schema, cache), node.op.transform(empty))
        except (KeyError, IndexError, TypeError, ValueError, pa.ArrowException) as exc:
            raise DataError(f"{doc_path}: node {saved_id}: {name}: the saved state does not fit the columns "
                            f"{inp.column_names} it is applied to ({type(exc).__name__}: {exc})") from exc


def _confined(fs: Any, root: str, rel: str, field: str) -> str:
    """``root/rel`` when ``rel`` is a relative path that stays inside ``root``, also
    after following symbolic links on a local filesystem; else an error naming the field."""
    norm = posixpath.normpath(rel.replace("\\", "/")) if rel else ""
    reason = None
    if not rel or "://" in rel or "\x00" in rel or rel.startswith(("/", "\\", "~")) \
            or (len(rel) > 1 and rel[1] == ":"):
        reason = "is not a path relative to the workflow folder"
    elif norm == ".." or norm.startswith("../"):
        reason = "leaves the workflow folder"
    elif norm == ".":
        reason = "names the workflow folder itself, not a file in it"
    full = posixpath.join(root, norm)
    if reason is None and _is_local(fs):
        real_root = os.path.realpath(root)
        real = os.path.realpath(full)
        if os.path.commonpath([real_root, real]) != real_root:
            reason = f"leaves the workflow folder (it resolves to {real})"
    if reason:
        raise _EntryError(f"field {field!r}: path {rel!r} {reason}; a saved workflow only refers "
                          f"to files inside its folder {root}")
    return full


# -- saving ---------------------------------------------------------------------
_AT_FDCWD = -100
_RENAME_NOREPLACE = 1
_RENAME_EXCHANGE = 2
_ALLOWED_IN_SAVE = {"workflow.json", "stats", DELTA_FOLDER}
#: a stats file of a save (``<save id>_node<id>_<table>.parquet``; earlier versions: no id)
_STATS_FILE = re.compile(r"(?:[0-9a-f]{8}_)?node\d+_.*\.parquet")


#: On an object store, stats files of other saves are removed by a save only once
#: they are this much older than its ``workflow.json``: a concurrent saver may have
#: written its stats and not yet its ``workflow.json`` (a save of large vocabularies
#: to an object store can take minutes). Unreferenced files younger than that stay
#: until a later save.
STALE_STATS_S = 3600.0


def _write_file(f: Any, content: pa.Table | str) -> None:
    """Write a stats table as parquet, or a text (a vocabulary delta's JSON), to the
    open binary file ``f``, and close it."""
    with f:
        if isinstance(content, str):
            f.write(content.encode("utf-8"))
        else:
            pq.write_table(content, f)


def _save_in_place(fs: Any, root: str, text: str, files: dict[str, pa.Table | str]) -> None:
    """An object store's save: no rename, so ``workflow.json`` is removed first and
    written last (the folder does not load in between; each ``workflow.json`` names
    its own save's stats files). Two savers at once: the last ``workflow.json``
    written wins, whole, since neither removes the other's fresh stats files; stats
    files of earlier saves are removed once :data:`STALE_STATS_S` older than this
    save's ``workflow.json`` (the store's clock on both sides)."""
    doc_path = posixpath.join(root, "workflow.json")
    if fs.exists(doc_path):
        fs.rm(doc_path)
    fs.makedirs(posixpath.join(root, "stats"), exist_ok=True)
    for rel, table in files.items():
        fs.makedirs(posixpath.dirname(posixpath.join(root, rel)), exist_ok=True)
        _write_file(fs.open(posixpath.join(root, rel), "wb"), table)
    with fs.open(doc_path, "w") as f:
        f.write(text)
    written = {posixpath.basename(rel) for rel in files if rel.startswith("stats/")}
    try:
        now = fs.modified(doc_path)
        present = fs.ls(posixpath.join(root, "stats"), detail=False)
    except (FileNotFoundError, NotImplementedError):  # no empty folders; no times: keep all
        return
    for old in present:
        name = posixpath.basename(old.rstrip("/"))
        if not _STATS_FILE.fullmatch(name) or name in written:
            continue
        with contextlib.suppress(FileNotFoundError):  # another saver removed it
            if (now - fs.modified(old)).total_seconds() >= STALE_STATS_S:
                fs.rm(old)


def _save_local(fs: Any, root: str, text: str, files: dict[str, pa.Table | str], save_id: str) -> None:
    """Write the save to a hidden folder beside ``root``, then put it in place (see
    :meth:`Workflow.save`)."""
    from tabstream.core.scratch import owner_tag
    from tabstream.pipeline.export_folder import remove_export_leftovers

    root = os.path.abspath(root).rstrip(os.sep)
    parent, name = os.path.split(root)
    check_save_target(root)
    os.makedirs(parent, exist_ok=True)
    remove_export_leftovers(fs, parent, name)  # of savers (and exports) that were killed
    tmp = os.path.join(parent, f".{name}.tmp-{owner_tag()}-{save_id}")
    try:
        os.makedirs(os.path.join(tmp, "stats"))
        for rel, table in files.items():
            os.makedirs(os.path.dirname(os.path.join(tmp, rel)), exist_ok=True)
            _write_file(open(os.path.join(tmp, rel), "wb"), table)
        with open(os.path.join(tmp, "workflow.json"), "w", encoding="utf-8") as f:
            f.write(text)
        previous = _swap_into_place(tmp, root, f".{name}.old-{owner_tag()}-{save_id}")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if previous is not None:
        shutil.rmtree(previous, ignore_errors=True)  # else the next save removes it


def check_save_target(root: str) -> None:
    """A save replaces the whole folder: refuse one that holds anything else."""
    if not os.path.lexists(root):
        return
    if not os.path.isdir(root) or os.path.islink(root):
        raise FileExistsError(f"cannot save the workflow to {root!r}: it exists and is not a folder; "
                              "pass a new path or a folder of an earlier save")
    foreign = sorted(set(os.listdir(root)) - _ALLOWED_IN_SAVE)
    if foreign:
        shown = listed(foreign)
        raise FileExistsError(
            f"cannot save the workflow to {root!r}: the folder holds {shown}, which are not part of a "
            "saved workflow, and a save replaces the whole folder; save into a new or empty folder, "
            "or move them out")


def _swap_into_place(tmp: str, root: str, old_name: str) -> str | None:
    """Move the finished folder ``tmp`` to ``root``; returns the path now holding the
    previous save (to be removed), or None. Concurrent savers each replace the
    folder whole: the last one wins, none mixes with another."""
    for _ in range(1000):
        try:
            if not _rename2(tmp, root, _RENAME_NOREPLACE):
                if os.path.isdir(root) and os.listdir(root):
                    raise FileExistsError(root)
                os.rename(tmp, root)  # onto nothing or an empty folder
            return None
        except FileExistsError:
            pass  # a save is in place: exchanged with it below
        except OSError as exc:
            if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
        if _rename2(tmp, root, _RENAME_EXCHANGE):  # one step: no moment without a save
            return tmp
        old = os.path.join(os.path.dirname(root), old_name)
        try:
            os.rename(root, old)
        except FileNotFoundError:
            continue  # another saver moved it away: try again
        try:
            os.rename(tmp, root)
        except OSError:
            shutil.rmtree(old, ignore_errors=True)  # another saver's folder came in between
            continue
        return old
    raise OSError(f"cannot move the saved workflow {tmp!r} into place at {root!r}: other "
                  "processes keep replacing it")


@functools.lru_cache(maxsize=1)
def _renameat2() -> Any:
    import ctypes

    try:
        func = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):  # not Linux, or a C library without it
        return None
    func.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    func.restype = ctypes.c_int
    return func


def _rename2(src: str, dst: str, flags: int) -> bool:
    """Linux ``renameat2(src, dst, flags)``: True when done, False where it or the
    flag is not supported (then the caller renames plainly); other errors raise."""
    import ctypes

    func = _renameat2()
    if func is None:
        return False
    if func(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), flags) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), src, None, dst)


def _is_local(fs: Any) -> bool:
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    return protocol in ("file", "local")


def _as_dataset(data: Any) -> Dataset:
    return data if isinstance(data, Dataset) else Dataset(data)


def _fs_root(path: str, storage_options: dict | None) -> tuple[Any, str]:
    fs, _, paths = fsspec.core.get_fs_token_paths(path, storage_options=storage_options or {})
    return fs, paths[0]


def _safe(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name)
