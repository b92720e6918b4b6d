"""Schema unification: the parquet files of one Dataset read as one table.

A column a file lacks is null in its rows; integers (floats, strings) of different
widths widen to the wider type; any other disagreement is a
:class:`~tabstream.core.errors.SchemaError` naming both files and the column.
Files whose columns differ are read with a :class:`~tabstream.core.errors.DatasetWarning`
naming them, or refused (``strict_schema=True``).
"""

from __future__ import annotations

import warnings

import pyarrow as pa

from tabstream.core.dtypes import is_list_type
from tabstream.core.errors import DatasetWarning, SchemaError

__all__ = ["check_schema_gaps", "is_text", "plain_type", "unify_schemas"]


def unify_schemas(unified: pa.Schema | None, other: pa.Schema, owners: dict[str, str],
                   path: str) -> pa.Schema:
    """Add ``other``'s columns to ``unified``: a column missing from some files is
    null there; ints of different widths (floats, strings) widen to the wider type;
    any other disagreement names both files and the column. ``owners`` maps each
    column to the first file that has it."""
    if unified is None:
        owners.update({name: path for name in other.names})
        return other
    fields = list(unified)
    index = {f.name: i for i, f in enumerate(fields)}
    for field in other:
        if field.name not in index:
            owners[field.name] = path
            index[field.name] = len(fields)
            fields.append(field.with_nullable(True))
            continue
        ours = fields[index[field.name]].type
        theirs = field.type
        if theirs == ours:
            continue
        wider = None
        if _safely_castable(theirs, plain_type(ours)) or _safely_castable(ours, plain_type(theirs)):
            try:
                wider = pa.unify_schemas([pa.schema([pa.field("x", plain_type(ours))]),
                                          pa.schema([pa.field("x", plain_type(theirs))])],
                                         promote_options="permissive").field(0).type
            except (pa.ArrowInvalid, pa.ArrowTypeError):
                wider = None
        if wider is None:
            raise SchemaError(
                f"{path}: column {field.name!r} is {theirs}, but {owners[field.name]} has {ours}; "
                "the files cannot be read as one dataset: convert one of them"
            )
        fields[index[field.name]] = fields[index[field.name]].with_type(wider)
    # A column this file lacks (null here) or may hold nulls in cannot stay non-nullable.
    for i, f in enumerate(fields):
        if not f.nullable and (f.name not in other.names or other.field(f.name).nullable):
            fields[i] = f.with_nullable(True)
    return pa.schema(fields, metadata=unified.metadata)


def check_schema_gaps(file_schemas: dict[str, pa.Schema], owners: dict[str, str], strict: bool) -> None:
    """Parquet files of one Dataset whose columns differ: with ``strict`` a
    :class:`~tabstream.core.errors.SchemaError` naming a file, the columns it lacks
    and a file that has them; else one :class:`DatasetWarning` naming every such
    column, the files that lack it (null in their rows) and a file that has it."""
    lacking: dict[str, list[str]] = {}  # column -> the files without it
    for path, schema in file_schemas.items():
        names = set(schema.names)
        for column in owners:
            if column not in names:
                lacking.setdefault(column, []).append(path)
    if not lacking:
        return
    if strict:
        first = min((files[0] for files in lacking.values()), key=list(file_schemas).index)
        missing = [c for c, files in lacking.items() if first in files]
        raise SchemaError(
            f"{first}: lacks the columns {missing} that {owners[missing[0]]} has; strict_schema=True "
            f"refuses parquet files whose columns differ ({len(lacking)} column"
            f"{'s' if len(lacking) > 1 else ''} missing from some of the {len(file_schemas)} files): "
            "make the files agree, read them as separate Datasets, or pass strict_schema=False "
            "to read the columns a file lacks as nulls")

    def files(paths: list[str]) -> str:
        shown = ", ".join(paths[:3])
        return shown + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")

    groups: dict[tuple[tuple[str, ...], str], list[str]] = {}  # (files without, a file with) -> columns
    for column, paths in lacking.items():
        groups.setdefault((tuple(paths), owners[column]), []).append(column)
    described = "; ".join(f"{columns} null in the rows of {files(list(paths))} (held by {owner})"
                          for (paths, owner), columns in list(groups.items())[:5])
    more = f"; and {len(groups) - 5} more groups of columns" if len(groups) > 5 else ""
    warnings.warn(
        f"the parquet files' columns differ; the columns a file lacks are read as nulls in its rows: "
        f"{described}{more}. Pass strict_schema=True to refuse files whose columns differ",
        DatasetWarning, stacklevel=5)


def is_text(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t)


def plain_type(t: pa.DataType) -> pa.DataType:
    return t.value_type if pa.types.is_dictionary(t) else t


def _safely_castable(src: pa.DataType, dst: pa.DataType) -> bool:
    if pa.types.is_dictionary(src):
        src = src.value_type
    if src == dst or pa.types.is_null(src):
        # a null column (pandas writes an all-None column so) is nulls of any type
        return True
    if is_list_type(src) and is_list_type(dst):  # list<int32> and list<int64> widen as scalars do
        return _safely_castable(src.value_type, dst.value_type)
    both_int = pa.types.is_integer(src) and pa.types.is_integer(dst)
    both_float = pa.types.is_floating(src) and pa.types.is_floating(dst)
    strings = {pa.string(), pa.large_string()}
    return both_int or both_float or (src in strings and dst in strings)
