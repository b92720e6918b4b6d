"""Sources, CSV/TSV: raw text logs, read in byte-range pieces with Arrow's parser.

A file is cut into equal blocks of at most 3/5 ``part_size`` (a compressed file is
one piece); a piece starts at the first line at or after its offset. Columns without
a declared dtype take the type Arrow's CSV reader infers from the first parse block
(``block_size`` bytes) of the first file with rows, as pandas and NVTabular infer
from the data: ``int64``, ``float64`` or ``bool``, else ``string`` (dates and times
too, and a column empty in the sample); as in pandas, integers past int64 give
``uint64`` and hexadecimal literals (``0x1F``) ``string``. That type is then fixed
for every piece, so two partitions never disagree; a later value that does not fit
it is a DataError naming the file, line, column and value, and the ``dtypes=`` that
reads it. Unlike pandas, an integer column with missing values stays ``int64`` (with
nulls) rather than becoming ``float64``. With a header, every file starts with the
same header line (a CSV header's names may be quoted). Every failure of the parser
is turned into a :class:`~tabstream.core.errors.DataError` naming the file, the line
and the column (bad values, hexadecimal integers, wrong field counts, blank lines,
invalid UTF-8, NUL bytes, lines longer than ``block_size``, a quoted value cut by a
piece's end, truncated compressed files).
"""

from __future__ import annotations

import csv
import lzma
import mmap
import os
import re
import zlib
from dataclasses import dataclass
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
from fsspec.utils import read_block

from tabstream.core.dtypes import arrow_type_to_dtype, dtype_to_arrow_type
from tabstream.core.errors import DataError, SchemaError
from tabstream.pipeline import stores
from tabstream.pipeline.sizes import parse_bytes
from tabstream.pipeline.stores import is_local

__all__ = ["CsvFiles", "CsvPiece"]

_BOM = b"\xef\xbb\xbf"
_NOT_BLANK = re.compile(rb"[^\r\n]")


# Arrow's CSV reader parses a block in chunks of this many bytes. Small chunks keep
# its working buffers in the CPU cache and its allocations reused: a 38 MB block of
# Criteo-like TSV parses in about a third of the CPU time with 2 MB chunks than as one
# 64 MB chunk (measured 105 vs 340 ms); columns come out in ~20 chunks per block.
_CSV_PARSE_BLOCK = 1 << 21


# What a truncated or corrupt compressed file raises while it is decompressed.
_DECOMPRESS_ERRORS = (EOFError, OSError, zlib.error, lzma.LZMAError)


@dataclass(frozen=True)
class CsvPiece:
    """The lines of ``path`` from the first one at or after byte ``offset`` through the
    one holding byte ``offset + length``."""

    path: str
    offset: int
    length: int | None  # None: the whole file (compressed files cannot be split)


@dataclass(frozen=True)
class _Block:
    """The text of a CSV piece: ``buf[start:end]``, where ``buf`` is a memory map of
    the file (local, uncompressed: read without a copy) or the bytes read. Offsets
    taken and returned by the methods are relative to ``start``."""

    buf: Any  # mmap.mmap or bytes
    start: int
    end: int

    def __len__(self) -> int:
        return self.end - self.start

    def find(self, sub: bytes, pos: int = 0) -> int:
        i = self.buf.find(sub, self.start + pos, self.end)
        return i - self.start if i >= 0 else -1

    def data(self) -> bytes:
        """The text as bytes (a copy of a mapped block: for error messages only)."""
        return self.buf[self.start:self.end]

    def arrow(self) -> pa.Buffer:
        return pa.py_buffer(self.buf).slice(self.start, len(self))

    def first_line(self, limit: int | None = None) -> bytes:
        """The first line, without its newline; at most ``limit`` bytes of it."""
        nl = self.find(b"\n")
        end = self.start + nl if nl >= 0 else self.end
        return self.buf[self.start:end if limit is None else min(end, self.start + limit)]

    def isascii(self) -> bool:
        """Only ASCII bytes (so valid UTF-8): about 1 ms per 38 MB."""
        if not len(self):
            return True
        return int(np.frombuffer(self.buf, dtype=np.uint8, count=len(self), offset=self.start).max()) < 0x80

    def no_lines(self) -> bool:
        """Nothing but line endings (or nothing at all): no rows. A line of empty
        fields (``"\t\t\n"``) is a row of nulls, not nothing."""
        head = self.buf[self.start:min(self.end, self.start + 4096)]
        return not head.strip(b"\r\n") and (len(self) <= 4096 or not self.data().strip(b"\r\n"))


class CsvFiles:
    """The CSV/TSV files of a Dataset: planned (:meth:`plan`: names, types, pieces) and
    read piece by piece (:meth:`read`), with errors naming the file, line and column.

    After :meth:`plan`: ``names``, ``types`` (every column's Arrow type: declared, or
    inferred), ``inferred`` (the columns whose type was inferred, and from which file),
    ``sep``, ``header``, ``block_size``, ``pieces`` and ``arrow_schema``."""

    def __init__(self, fs: Any, files: list[str], file_tags: dict[str, str | None],
                 read_kwargs: dict[str, Any], part_size: int) -> None:
        self.fs = fs
        self.files = files
        self.file_tags = file_tags
        self.read_kwargs = read_kwargs
        self.part_size = part_size

    def plan(self, max_columns: int) -> pa.Schema:
        """Read the options and the header line (``max_columns``: the most columns it may
        name); cut the files into pieces. The Dataset's Arrow schema."""
        names = self.read_kwargs.get("names")
        dtypes = self.read_kwargs.get("dtypes") or self.read_kwargs.get("dtype") or {}
        header = self.read_kwargs.get("header", names is None)
        if names is None and not header:
            raise ValueError("CSV without a header needs names=[...] (the column names in order)")
        sep = self.read_kwargs.get("sep")
        if sep is None:
            sep = "\t" if self.files[0].endswith((".tsv", ".tsv.gz")) else ","
        self.sep = sep
        self.header = bool(header)
        self.block_size = _block_size(self.read_kwargs.get("block_size"))
        if names is not None:
            _check_names(names, self.files)
        # With a header, every file starts with the same header line: the first
        # file's (an empty file's is skipped), checked as each file is read.
        self.header_raw: bytes | None = None
        if self.header:
            for path in self.files:
                raw = self._header_line(path, sep, max_columns)
                if raw:
                    break
            self.header_path, self.header_raw = (path, raw) if raw else (self.files[0], raw)
            self.header_fields = self._split_header(self.header_path, raw, strict=names is None)
        if names is None:
            names = self.header_fields
            _check_header_names(self.header_path, names)
        unknown = sorted(set(dtypes) - set(names))
        if unknown:
            raise SchemaError(f"dtypes given for columns {unknown} that are not in names={list(names)}")
        self.names = list(names)
        self.types = {n: dtype_to_arrow_type(dtypes[n]) for n in names if n in dtypes}
        # Columns without a declared dtype: inferred once, from a sample, then fixed;
        # inferring per block would let two partitions disagree on a column's type.
        self.inferred: dict[str, str] = {}
        undeclared = [n for n in self.names if n not in self.types]
        if undeclared:
            inferred, source = self._infer_types(undeclared)
            self.types.update(inferred)
            self.inferred = {n: source for n in undeclared}
        self.int_columns = [n for n in self.names if pa.types.is_integer(self.types[n])]
        fields = [pa.field(n, self.types[n]) for n in names]
        pieces: list[CsvPiece] = []
        for path in self.files:
            if fsspec.utils.infer_compression(path):
                pieces.append(CsvPiece(path, 0, None))
                continue
            size = self.fs.size(path)
            # Parsed, a block of raw log text takes ~1.6x its size in memory (measured
            # on Criteo-like TSV), so blocks of at most 3/5 part_size give partitions
            # of at most part_size. A file is cut into equal blocks: cut at every 3/5
            # part_size, a 61 MB file of the 2M-row benchmark gave a 40 MB and a 21 MB
            # partition, and the fit's last large one ran while the other core idled.
            count = -(-max(size, 1) // max(1, self.part_size * 3 // 5))
            block = -(-max(size, 1) // count)
            for offset in range(0, max(size, 1), block):
                pieces.append(CsvPiece(path, offset, block))
        self.pieces = pieces
        self.arrow_schema = pa.schema(fields)
        return self.arrow_schema

    def _infer_types(self, names: list[str]) -> tuple[dict[str, pa.DataType], str]:
        """The types of the undeclared columns ``names``, as Arrow's CSV reader infers
        them from the first ``block_size`` bytes of the first file holding rows (the
        block Arrow itself infers from), and that file. Only ``int64``, ``float64`` and
        ``bool`` are kept; anything else is ``string``. A sample that does not parse
        (bad lines, bad text) leaves its columns strings: reading the piece reports
        the fault, by file and line."""
        keep = (pa.int64(), pa.uint64(), pa.float64(), pa.bool_())
        for path in self.files:
            try:
                with self.fs.open(path, "rb", compression="infer") as f:
                    sample = f.read(self.block_size)
            except _DECOMPRESS_ERRORS:
                return {n: pa.string() for n in names}, path  # the read names the fault
            if len(sample) >= self.block_size:  # whole lines only
                sample = sample[:sample.rfind(b"\n") + 1]
            sample = sample.removeprefix(_BOM)
            lines = sample.strip(b"\r\n").count(b"\n") + 1 if sample.strip(b"\r\n") else 0
            if lines <= (1 if self.header else 0):
                continue  # no rows here: the next file's
            table = self._read_sample(sample, dict(self.types))
            if table is None:
                return {n: pa.string() for n in names}, path
            types = {}
            for n in names:
                t = table.schema.field(n).type
                types[n] = t if t in keep else pa.string()
            if not self.header:  # on Arrow's own inference (hex still int64 there)
                self._check_first_line(path, sample, types)
            self._fix_integer_types(path, sample, types)
            return types, path
        return {n: pa.string() for n in names}, self.files[0]

    def _check_first_line(self, path: str, sample: bytes, types: dict[str, pa.DataType]) -> None:
        """``header=False``: a column inferred as text only because of line 1 (the
        rest of the sample reads as numbers or bools) means line 1 is not data of that
        column, most likely a header line under other names than ``names=``; refused,
        rather than reading the names as a row and every such column as strings."""
        text = [n for n, t in types.items() if t == pa.string()]
        cut = sample.find(b"\n") + 1
        if not text or cut <= 0 or not sample[cut:].strip(b"\r\n"):
            return
        fields = _header_fields(sample[:cut].rstrip(b"\r\n").decode(errors="surrogateescape"), self.sep)
        if fields is not None and sorted(fields) == sorted(self.names):
            return  # the names themselves: refused when the piece is read, saying so
        rest = self._read_sample(sample[cut:], {n: t for n, t in self.types.items() if n in text}, text)
        if rest is None:
            return
        odd = [n for n in text if rest.schema.field(n).type in (pa.int64(), pa.float64(), pa.bool_())]
        if not odd:
            return
        first = self._read_sample(sample[:cut], {n: pa.string() for n in text}, text)
        values = {n: first.column(n)[0].as_py() for n in odd} if first is not None and first.num_rows else {}
        kinds = {pa.int64(): "int64", pa.float64(): "float64", pa.bool_(): "bool"}
        shown = ", ".join(f"{n!r}: {values.get(n)!r} (the rest {kinds[rest.schema.field(n).type]})"
                          for n in odd[:5])
        raise _data_error(
            f"{path}, line 1: its values are not of the type the rest of the first block has "
            f"in column(s) {shown}, and would make each such column text; is line 1 a header "
            "line? header=False reads it as a row of data",
            "pass header=True (keeping names=[...]) to skip a header line, or declare the "
            "column's dtype (dtypes={column: 'string'}) to read it as text")

    def _read_sample(self, sample: bytes, column_types: dict[str, pa.DataType],
                     include_columns: list[str] | None = None) -> pa.Table | None:
        """The inference sample parsed (lines that do not parse left out); None if
        even that fails."""
        for handler in (None, lambda _row: "skip"):
            try:
                return self._read_csv(sample, self.header, column_types, invalid_row_handler=handler,
                                      include_columns=include_columns)
            except pa.ArrowInvalid:
                # the sample only infers types: a bad line is reported, by file and
                # line, when its piece is read; try again without it, then give up
                continue
        return None

    def _fix_integer_types(self, path: str, sample: bytes, types: dict[str, pa.DataType]) -> None:
        """Correct two of Arrow's inferences from ``sample`` (the first block of
        ``path``), in ``types``: integers past int64 make a column float64, losing
        digits (pandas reads them as uint64, as here when all are in 0 .. 2**64-1;
        others are refused, as are those past 2**53 with a '+' sign); hexadecimal literals ("0x1F") make it int64 (pandas
        keeps them as text, as here)."""
        floats = [n for n, t in types.items() if t == pa.float64()]
        ints = [n for n, t in types.items() if t == pa.int64()]
        if not (b"0x" in sample or b"0X" in sample):
            ints = []
        if not floats and not ints:
            return
        text = self._read_sample(sample, {n: pa.string() for n in floats + ints}, floats + ints)
        if text is None:
            return
        for n in ints:
            if pc.any(pc.match_substring_regex(text.column(n), r"^[ \t]*0[xX]")).as_py():
                types[n] = pa.string()
        for n in floats:
            column = text.column(n).drop_null()
            if not pc.all(pc.match_substring_regex(column, r"^[ \t]*[+-]?[0-9]+[ \t]*$")).as_py():
                continue  # decimals or exponents: a float column, as pandas reads it
            strings = column.to_pylist()
            values = [int(v) for v in strings]
            if not values:
                continue
            low, high = min(values), max(values)
            if any("+" in v for v in strings):  # Arrow reads "+5" as a float only
                if max(-low, high) <= 2**53:
                    continue  # exact in float64
                why = f"{max(-low, high)} (past 2**53), and a '+' sign, which int64 does not read"
            elif low >= 0 and high < 2**64:
                types[n] = pa.uint64()
                continue
            elif high >= 2**64:
                why = f"{high}, more than uint64 holds (2**64 - 1)"
            elif low < -2**63:
                why = f"{low}, less than int64 holds (-2**63)"
            else:
                why = f"{high} (past int64) and {low} (negative, so not uint64)"
            fix = f"pass dtypes={{{n!r}: 'string'}} to keep the digits (or 'float64' to round them)"
            raise _data_error(
                f"{path}: column {n!r} (inferred from the file's first block) holds integers "
                f"that would lose digits as float64, and that no integer type reads: {why}; {fix}",
                f"{fix} to Dataset")

    def _header_line(self, path: str, sep: str, max_columns: int) -> bytes:
        """The first line of ``path``, read no further than the parse block: a header
        longer than that, or naming more than :data:`MAX_CSV_COLUMNS` columns, is
        refused quickly, with its field count, instead of read whole (a line of
        millions of fields took minutes and gigabytes)."""
        limit = self.block_size
        with self.fs.open(path, "rb", compression="infer") as f:
            raw = f.readline(limit + 1)
        if not raw.endswith(b"\n") and len(raw) > limit:
            fields = raw.count(sep.encode()) + 1
            raise _data_error(
                f"{path}, line 1: read as the header line, it is longer than {limit:,} bytes, the CSV "
                f"parse block (block_size), and holds at least {fields:,} fields in those bytes",
                "for a headerless file pass names=[...] (the column names in order); if the header "
                "really is this long, pass block_size= larger than the line (e.g. block_size=\"64MB\")")
        raw = raw.removeprefix(_BOM).rstrip(b"\r\n")
        fields = raw.count(sep.encode()) + 1
        if fields > max_columns:
            raise _data_error(
                f"{path}, line 1: read as the header line, it holds {fields:,} fields, more than "
                f"MAX_CSV_COLUMNS={max_columns:,} columns",
                "for a headerless file pass names=[...]; if the file really has this many columns, "
                "raise tabstream.pipeline.dataset.MAX_CSV_COLUMNS")
        return raw

    def _split_header(self, path: str, raw: bytes, strict: bool) -> list[str]:
        """The names of the header line ``raw`` of ``path``, split by the rules of the
        rows: in a CSV a name may be quoted (``"city, state"``), in a TSV a quote is
        data. ``strict``: the names become the columns, so must be UTF-8 text (else
        bytes that are not are kept, for comparing header lines only)."""
        try:
            text = raw.decode()
        except UnicodeDecodeError as exc:
            if strict:
                raise _data_error(
                    f"{path}, line 1: the header line is not valid UTF-8 text "
                    f"(byte {exc.start}: {raw[exc.start:exc.end]!r})",
                    "raw logs must be UTF-8 text; pass names=[...] and header=True to skip a bad header",
                ) from exc
            text = raw.decode(errors="surrogateescape")
        fields = _header_fields(text, self.sep)
        if fields is None:
            raise _data_error(
                f"{path}, line 1: a quoted name of the header line does not end on the line "
                f"({text[:200]!r}); a header line spanning several lines is not supported",
                "close the quote on line 1, or remove the line breaks inside the header's names")
        return fields

    def _check_same_header(self, piece: CsvPiece, line: bytes) -> None:
        """``header=True``: the first line of every file is its header, and is dropped;
        it must name the columns of the first file's header, in the same order (a
        headerless file would lose its first row, a reordered header would swap
        columns). Quoting may differ (``a`` and ``"a"`` are one name)."""
        line = line.rstrip(b"\r")
        if line == self.header_raw:
            return
        text = line.decode(errors="surrogateescape")
        if _header_fields(text, self.sep) == self.header_fields:
            return
        ours = self.header_raw.decode(errors="replace") if self.header_raw else ""
        raise _data_error(
            f"{piece.path}, line 1: read as the header line (header=True), it is "
            f"{line.decode(errors='replace')[:200]!r}, expected the header of "
            f"{self.header_path}: {ours[:200]!r}; the file's columns would be read in the "
            "first file's order, or its first row dropped",
            "every file of a Dataset must start with the same header line: read a headerless "
            "file, or one with other columns, as its own Dataset (names=[...], header=False)")

    def read(self, piece: CsvPiece) -> pa.Table:
        """One piece parsed: every column, as the schema of :meth:`plan`."""
        block = self._csv_block(piece)
        if piece.offset == 0 and block.buf[block.start:block.start + 3] == _BOM:
            block = _Block(block.buf, block.start + 3, block.end)  # a file of a BOM only: empty
        skip_header = self.header and piece.offset == 0
        several = len(self.names) > 1
        if several:
            block = self._trim_blank_lines(piece, block)
        # With one column a blank line is a row (an empty field), so only a block of no
        # bytes is empty; with several it is a line without its fields.
        empty = block.no_lines() if several else not len(block)
        if piece.offset == 0 and not empty:
            if skip_header:
                self._check_same_header(piece, block.first_line(self.block_size))
            else:
                self._check_header_line(piece, block.first_line(self.block_size))
        # A NUL byte is valid UTF-8, so Arrow would keep it inside a string value:
        # text logs never hold one, a binary (or UTF-16) line does. memchr-fast.
        nul = block.find(b"\0")
        if nul >= 0:
            data = block.data()
            line = self._line_at(piece, data, nul)
            raise _data_error(
                f"{piece.path}, line {line}: a NUL byte at column {self._column_at(data, nul)!r}: "
                f"the line is binary, expected text: {_excerpt(data, nul)!r}",
                "the file is not UTF-8 text (binary, or UTF-16?): convert it or remove the line",
            )
        try:
            # Arrow skips a UTF-8 BOM at the start of the block and reads CRLF endings.
            # Arrow's UTF-8 check of every string costs ~10% of the parse: it is
            # skipped for a block of ASCII text, which is valid UTF-8 throughout.
            table = self._parse_csv(b"" if empty else block.arrow(), skip_header,
                                    check_utf8=not block.isascii())
        except pa.ArrowInvalid as exc:
            data = block.data()
            pos = self._blank_line_at(block) if several else -1
            raise (self._blank_line_error(piece, data, pos) if pos >= 0
                   else self._csv_error(piece, data, skip_header, exc)) from exc
        # Arrow reads a blank line inside the block as a row of nulls. The block is
        # searched for one only when every column has a null: a search of every block
        # would cost about a tenth of its parse, a column's null count nothing.
        if several and all(column.null_count for column in table.columns):
            pos = self._blank_line_at(block)
            if pos >= 0:
                raise self._blank_line_error(piece, block.data(), pos)
        # Arrow reads "0x10" as the integer 16 (and wraps "0xFFFFFFFFFFFFFFFF" to -1).
        # Two memchr scans (~3 ms per 38 MB) rule it out for a block without an "x"
        # or "X", as a Criteo log is; only a block with "0x" or "0X" is read again.
        if self.int_columns and not empty and (
                block.find(b"x") >= 0 and block.find(b"0x") >= 0
                or block.find(b"X") >= 0 and block.find(b"0X") >= 0):
            self._check_no_hex(piece, block, skip_header)
        if self.sep != "\t" and table.num_rows and pa.types.is_string(table.schema[-1].type):
            self._check_quote_closed(piece, block, table.column(-1)[-1].as_py())
        return table

    def _check_quote_closed(self, piece: CsvPiece, block: _Block, last: str | None) -> None:
        """A quoted value still open at the end of the block, which Arrow reads as
        the rest of the block: the block ends inside a value holding a line break
        (the next block would read its second half as rows), or the file ends inside
        quotes. ``last``: the last value of the block; only one ending in a line
        break (as the block does) is looked at, so this costs nothing otherwise."""
        if not last or last[-1] != "\n":
            return
        quoted = last.encode().replace(b'"', b'""')
        start = block.end - len(quoted) - 1  # where the value's opening quote would be
        if start < block.start or block.buf[start:block.end] != b'"' + quoted:
            return  # the quote closes: a value that ends in a line break
        line = self._line_at(piece, block.data(), start - block.start)
        raise self._open_quote_error(piece, block, f"line {line}, column {self.names[-1]!r}")

    def _open_quote_error(self, piece: CsvPiece, block: _Block | None, where: str) -> DataError:
        """A quoted value that starts at ``where`` (line and column) and is still open at
        the end of the block of ``piece``."""
        where = f"{piece.path}, {where}: a quoted value starts here"
        if not self._rows_after(piece, block):
            return _data_error(f"{where} and its closing quote is missing: the file ends inside it",
                               "close the quote (was the file cut short?)")
        return self._cut_value_error(piece, f"{where} and holds")

    def _cut_value_error(self, piece: CsvPiece, where: str) -> DataError:
        """A quoted value holding a line break on which the file is cut into parts;
        ``where`` begins the message (``"<file>, line N: ... holds"``)."""
        size = self.fs.size(piece.path)
        return _data_error(
            f"{where} a line break on which the file is cut into parts (part_size="
            f"{self.part_size:,} reads blocks of {piece.length:,} bytes): the value cannot be "
            "split; pass a larger part_size (the cuts fall elsewhere) or "
            f"part_size={-(-size * 5 // 3):,} or more to read the file as one part",
            "quoted values that hold line breaks are read whole only within one part: "
            "pass a larger part_size, or remove the line breaks from the values")

    def _check_header_line(self, piece: CsvPiece, line: bytes) -> None:
        """``header=False`` but the file starts with the column names: refuse rather
        than read the names as a row of data."""
        first = line.removeprefix(_BOM).rstrip(b"\r")
        # Not the names, by its length or field count (quoted names may hold the
        # separator): a line of millions of fields is not split here.
        longest = sum(2 * len(n.encode()) + 3 for n in self.names)
        if len(first) > longest or first.count(self.sep.encode()) + 1 < len(self.names):
            return
        fields = _header_fields(first.decode(errors="surrogateescape"), self.sep)
        if fields is not None and sorted(fields) == sorted(self.names):
            raise _data_error(
                f"{piece.path}, line 1: the line holds the column names "
                f"({first.decode(errors='replace')[:200]!r}), but header=False: "
                f"pass header=True to skip it",
                "the file has a header line: pass header=True (keeping names=[...])",
            )

    def _line_at(self, piece: CsvPiece, data: bytes, pos: int) -> int:
        """The 1-based line in the file of byte ``pos`` of the block of ``piece``."""
        return 1 + self._lines_before(piece) + data.count(b"\n", 0, pos)

    def _column_at(self, data: bytes, pos: int) -> str:
        start = data.rfind(b"\n", 0, pos) + 1
        index = data.count(self.sep.encode(), start, pos)
        return self.names[index] if index < len(self.names) else f"field {index + 1}"

    def _trim_blank_lines(self, piece: CsvPiece, block: _Block) -> _Block:
        """Blank lines at the end of the file carry nothing and are dropped. A blank
        line inside the data is a line without its fields: an error (see
        :meth:`_blank_line_at`), also at the end of a block with rows after it; one at
        the very start is refused here, since with ``header=True`` Arrow would take
        it for the header and read on."""
        end = block.end
        while end > block.start and block.buf[end - 1] in (10, 13):  # b"\n", b"\r"
            end -= 1
        tail = block.buf[end:block.end]
        if tail.count(b"\n") > (1 if end > block.start else 0):
            # where the first blank line starts: a block of blank lines starts with one
            at = end - block.start + tail.index(b"\n") if end > block.start else 0
            if self._rows_after(piece, block):
                raise self._blank_line_error(piece, block.data(), at)
            block = _Block(block.buf, block.start, end + tail.index(b"\n") + 1)  # the last line's ending
        if end > block.start and block.buf[block.start] in (10, 13):
            raise self._blank_line_error(piece, block.data(), 0)
        return block

    def _rows_after(self, piece: CsvPiece, block: _Block | None) -> bool:
        """Whether the file has a line that is not blank after the block of ``piece``
        (the next piece starts where this one ends). Runs only for a block ending in
        blank lines or an open quote; stops at the first byte that is not a line ending."""
        if piece.length is None:
            return False  # a compressed file is one piece
        if block is not None and isinstance(block.buf, mmap.mmap):  # the whole file
            return _NOT_BLANK.search(block.buf, block.end) is not None
        with self.fs.open(piece.path, "rb") as f:
            f.seek(piece.offset + piece.length)  # the block ends after the next newline
            started = False
            while chunk := f.read(1 << 16):
                if not started:
                    nl = chunk.find(b"\n")
                    if nl < 0:
                        continue
                    chunk, started = chunk[nl + 1:], True
                if chunk.strip(b"\r\n"):
                    return True
        return False

    @staticmethod
    def _blank_line_at(block: _Block) -> int:
        """Where the first blank line of the block (trailing ones cut) starts, or -1."""
        found = [p for p in (block.find(b"\n\n"), block.find(b"\n\r\n")) if p >= 0]
        return min(found) if found else -1

    def _blank_line_error(self, piece: CsvPiece, data: bytes, pos: int) -> DataError:
        """The blank line after the line ending at ``pos`` of the block (0: the block
        may start with one), by its line in the file (``data`` holds any header)."""
        first_line = 1 + self._lines_before(piece)
        line = first_line + data.count(b"\n", 0, pos + 1) if pos or data[:1] != b"\n" else first_line
        return DataError(
            f"{piece.path}, line {line}: expected {len(self.names)} fields separated by "
            f"{self.sep!r}, got a blank line"
        )

    def _csv_block(self, piece: CsvPiece) -> _Block:
        """The piece's text: from the first line starting at or after ``offset`` (the
        file's start for offset 0) through the line holding byte ``offset + length``,
        as ``fsspec.utils.read_block`` cuts it. A local uncompressed file is memory-
        mapped (no copy of the text; about 0.5 ms less CPU per MB than reading it)."""
        if piece.length is not None:
            if is_local(self.fs):
                with open(piece.path, "rb") as f:
                    if os.fstat(f.fileno()).st_size == 0:
                        return _Block(b"", 0, 0)
                    mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
                start = 0 if piece.offset == 0 else _after_newline(mm, piece.offset)
                return _Block(mm, start, max(start, _after_newline(mm, piece.offset + piece.length)))
            stores.check_unchanged(self.fs, piece.path, self.file_tags.get(piece.path))
            with self.fs.open(piece.path, "rb") as f:
                data = read_block(f, piece.offset, piece.length, delimiter=b"\n")
            return _Block(data, 0, len(data))
        if not is_local(self.fs):
            stores.check_unchanged(self.fs, piece.path, self.file_tags.get(piece.path))
        try:
            with self.fs.open(piece.path, "rb", compression="infer") as f:
                data = f.read()
            return _Block(data, 0, len(data))
        except _DECOMPRESS_ERRORS as exc:
            if isinstance(exc, OSError) and exc.errno is not None:
                raise  # an I/O error of the system (missing file, permissions, network)
            raise self._truncated_error(piece, exc) from exc

    def _truncated_error(self, piece: CsvPiece, exc: BaseException) -> DataError:
        """A compressed file that ends early or is corrupt: say how far it reads.
        Runs only after a failure; decompresses again, chunk by chunk, to count."""
        lines = 0
        try:
            with self.fs.open(piece.path, "rb", compression="infer") as f:
                read = getattr(f, "read1", f.read)  # small reads: keep what precedes the fault
                while chunk := read(1 << 16):
                    lines += chunk.count(b"\n")
        except _DECOMPRESS_ERRORS:
            pass  # expected: the count stops at the fault, which is what the message reports
        where = (f"it reads up to line {lines}, then fails" if lines
                 else "not even line 1 could be read")
        return _data_error(
            f"{piece.path}: the compressed file is truncated or corrupt ({exc}); {where}",
            "the file was cut short (an interrupted copy or download?): fetch or compress it again",
        )

    def _parse_csv(self, data: bytes | pa.Buffer, skip_header: bool,
                   invalid_row_handler: Any = None, as_strings: bool = False,
                   check_utf8: bool = True) -> pa.Table:
        """``data`` parsed with the columns' types (``as_strings``: all strings)."""
        types = {n: pa.string() for n in self.names} if as_strings else self.types
        names = self.names
        if len(data) == 0 or (isinstance(data, bytes) and not data.strip(b"\r\n")):
            return pa.table({n: pa.array([], type=self.arrow_schema.field(n).type) for n in names})
        return self._read_csv(data, skip_header, {n: types.get(n, pa.string()) for n in names},
                              invalid_row_handler, check_utf8)

    def _read_csv(self, data: bytes | pa.Buffer, skip_header: bool,
                  column_types: dict[str, pa.DataType], invalid_row_handler: Any = None,
                  check_utf8: bool = True, include_columns: list[str] | None = None) -> pa.Table:
        """Arrow's CSV reader over ``data`` with this source's options; columns not in
        ``column_types`` are inferred by Arrow (``include_columns``: only those)."""
        names = self.names
        return pacsv.read_csv(
            pa.BufferReader(data),
            read_options=pacsv.ReadOptions(column_names=names, skip_rows=1 if skip_header else 0,
                                           use_threads=False, block_size=self.block_size),
            # Raw logs are not quoted: with tabs, a quote is plain data (quoting would
            # let a stray quote swallow the following lines). A blank line is a line
            # with the wrong number of fields, never silently dropped.
            parse_options=pacsv.ParseOptions(delimiter=self.sep,
                                             quote_char=False if self.sep == "\t" else '"',
                                             ignore_empty_lines=False,
                                             invalid_row_handler=invalid_row_handler),
            convert_options=pacsv.ConvertOptions(
                column_types=column_types,
                null_values=[""], strings_can_be_null=True, quoted_strings_can_be_null=True,
                check_utf8=check_utf8, include_columns=include_columns or [],
            ),
        )

    def _csv_error(self, piece: CsvPiece, data: bytes, skip_header: bool,
                   exc: Exception) -> DataError:
        """Turn an Arrow CSV error into one that names the file, line and column.
        Runs only after Arrow has failed, so the block is examined again here."""
        first_line = 1 + self._lines_before(piece) + (1 if skip_header else 0)
        msg = str(exc)
        if "straddl" in msg:  # a line the parser's block cannot hold
            return self._long_line_error(piece, data)
        bad: list[Any] = []

        def handler(row: Any) -> str:
            bad.append(row)
            return "skip"

        if "utf8" in msg.lower():
            return self._utf8_error(piece, data) or DataError(f"{piece.path} (from line {first_line}): {msg}")
        if "parse error" in msg.lower():
            # Arrow's row handler cannot show a line of invalid UTF-8: look for
            # field-count errors only in the lines before the first such byte.
            utf8 = self._utf8_error(piece, data)
            clean = data if utf8 is None else data[:data.rfind(b"\n", 0, utf8.offset) + 1]  # type: ignore[attr-defined]
            try:
                self._parse_csv(clean, skip_header, invalid_row_handler=handler, as_strings=True)
            except pa.ArrowInvalid:
                pass  # the handler has recorded the bad rows; a parse error past them says no more
            if bad:
                row = bad[0]
                rest = data.rstrip(b"\r\n")
                if (self.sep != "\t" and row.text.count('"') % 2
                        and rest.endswith(row.text.encode(errors="surrogateescape"))):
                    # the block's last row, cut short inside a quoted value
                    start = len(rest) - len(row.text.encode(errors="surrogateescape"))
                    return self._open_quote_error(piece, None, f"line {self._line_at(piece, data, start)}")
                # Arrow numbers the rows it skipped (the header) too
                line = (first_line if row.number is None
                        else 1 + self._lines_before(piece) + row.number - 1)
                if self.sep != "\t" and row.number == 1 and self._starts_in_quotes(piece):
                    # the block begins inside a quoted value that began in the part
                    # before (read apart, maybe first, by another thread)
                    return self._cut_value_error(
                        piece, f"{piece.path}, line {line}: this part of the file (from byte "
                        f"{piece.offset:,}) begins inside a quoted value that holds")
                return DataError(
                    f"{piece.path}, line {line}: expected {row.expected_columns} fields "
                    f"separated by {self.sep!r}, got {row.actual_columns}: {row.text[:200]!r}"
                )
            if utf8 is not None:
                return utf8
            return DataError(f"{piece.path} (from line {first_line}): {msg}")
        m = re.search(r"column #(\d+)", msg)
        if m:
            name = self.names[int(m.group(1))]
            try:
                raw = self._parse_csv(data, skip_header, as_strings=True).column(name)
            except pa.ArrowInvalid:  # the text itself is broken (bad UTF-8 elsewhere)
                return self._utf8_error(piece, data) or DataError(f"{piece.path}, column {name!r}: {msg}")
            target = self.types[name]
            for i, value in enumerate(raw.to_pylist()):
                if value is None:
                    continue
                try:
                    pa.array([value]).cast(target)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                    return self._value_error(piece, first_line + i, name, value)
            return DataError(f"{piece.path}, column {name!r}: {msg}")
        return DataError(f"{piece.path} (from line {first_line}): {msg}")

    def _value_error(self, piece: CsvPiece, line: int, name: str, value: str,
                     why: str = "") -> DataError:
        """``value`` of column ``name`` on ``line`` does not fit the column's type
        (``why``: what else to say of it); for an inferred type, the ``dtypes=``
        that reads it."""
        what = arrow_type_to_dtype(self.types[name])[0]
        message = (f"{piece.path}, line {line}, column {name!r}: value {value!r} is not a "
                   f"valid {what}{why}")
        source = self.inferred.get(name)
        if source is None:
            return DataError(message)
        fix = f"pass dtypes={{{name!r}: 'string'}} (or the type the column holds)"
        return _data_error(
            f"{message}: the column's type was inferred as {what} from the first "
            f"block of {source} and is fixed for every block; {fix}",
            f"{fix} to Dataset")

    def _check_no_hex(self, piece: CsvPiece, block: _Block, skip_header: bool) -> None:
        """Refuse a hexadecimal literal ("0x1F") in an integer column, which Arrow
        would read as a number (pandas refuses it for an integer dtype). Runs only
        for a block holding "0x" or "0X": its integer columns are read as text."""
        data = block.data()
        try:
            text = self._read_csv(data, skip_header, {n: pa.string() for n in self.int_columns},
                                  include_columns=self.int_columns, check_utf8=False)
        except pa.ArrowInvalid:
            return  # the block parsed with its types: not expected; nothing more to find
        first_line = 1 + self._lines_before(piece) + (1 if skip_header else 0)
        for name in self.int_columns:
            hex_ = pc.match_substring_regex(text.column(name), r"^[ \t]*0[xX]")
            if pc.any(hex_).as_py():
                i = pc.index(hex_, True).as_py()
                value = text.column(name)[i].as_py()
                raise self._value_error(piece, first_line + i, name, value,
                                        " (a hexadecimal literal; integers are read in decimal only)")

    def _long_line_error(self, piece: CsvPiece, data: bytes) -> DataError:
        """The longest line of the block, by its line in the file and its length: Arrow
        parses CSV in blocks of ``block_size`` bytes and fails on a line it cannot hold
        in them ("straddling object ...")."""
        ends = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == 10)
        starts = np.concatenate([[0], ends + 1])
        stops = np.concatenate([ends, [len(data)]])
        longest = int(np.argmax(stops - starts))
        length = int(stops[longest] - starts[longest])
        line = 1 + self._lines_before(piece) + longest
        suggest = max(self.block_size * 2, 1 << (length - 1).bit_length())
        return _data_error(
            f"{piece.path}, line {line}: the line is {length:,} bytes long, more than the CSV parser's "
            f"block of block_size={self.block_size:,} bytes can hold: pass block_size= at least "
            f"its length to Dataset (e.g. block_size=\"{suggest // 2**20}MB\")",
            f"Dataset(..., block_size=\"{suggest // 2**20}MB\") parses lines up to that long; is the "
            "line meant to be one row (a missing newline)?")

    def _utf8_error(self, piece: CsvPiece, data: bytes) -> DataError | None:
        """The first invalid UTF-8 byte of the block, by file line and column
        (its offset in the block is the error's ``offset``)."""
        try:
            data.decode()
        except UnicodeDecodeError as bad:
            pos = bad.start
            err = _data_error(
                f"{piece.path}, line {self._line_at(piece, data, pos)}, column "
                f"{self._column_at(data, pos)!r}: invalid UTF-8 bytes "
                f"{data[pos:bad.end]!r} in {_excerpt(data, pos)!r}",
                "raw logs must be UTF-8 text: re-encode the file (e.g. iconv -f latin1 -t utf-8)",
            )
            err.offset = pos  # type: ignore[attr-defined]
            return err
        return None

    def _starts_in_quotes(self, piece: CsvPiece) -> bool:
        """Whether the block of ``piece`` begins inside a quoted value: an odd number of
        quotes before it (a quote inside a quoted value is doubled). Only when every
        quote before it opens or closes a value (at a field's edge) or is one of a
        doubled pair: a quote inside an unquoted field (``5" floppy``) is plain data
        to the parser and would put the count out of step, so then the answer is no
        (the error stays the parser's). Reads the file up to the block; runs only once
        a block has failed to parse."""
        if not piece.offset:
            return False
        with self.fs.open(piece.path, "rb") as f:
            data = f.read(piece.offset)
            while chunk := f.read(1 << 16):  # on to the line break the block starts after
                end = chunk.find(b"\n")
                data += chunk[:None if end < 0 else end]
                if end >= 0:
                    break
        buf = np.frombuffer(data, np.uint8)
        at = np.flatnonzero(buf == ord('"'))
        if not len(at):
            return False
        edges = np.frombuffer(b"\n\r" + self.sep.encode(), np.uint8)
        before = np.where(at > 0, buf[np.maximum(at - 1, 0)], ord("\n"))
        after = np.where(at + 1 < len(buf), buf[np.minimum(at + 1, len(buf) - 1)], ord("\n"))
        framed = (np.isin(before, edges) | np.isin(after, edges)
                  | (before == ord('"')) | (after == ord('"')))
        return bool(framed.all()) and len(at) % 2 == 1

    def _lines_before(self, piece: CsvPiece) -> int:
        """Lines in the file before the block of ``piece`` (``read_block`` starts a
        block just after the first newline at or past ``offset``)."""
        if piece.offset == 0:
            return 0
        with self.fs.open(piece.path, "rb") as f:
            return f.read(piece.offset).count(b"\n") + 1


def _check_header_names(path: str, names: list[str]) -> None:
    """The header line read as column names: an empty or repeated name means the
    first line is data (a headerless raw log), not a header."""
    seen: set[str] = set()
    for i, name in enumerate(names):
        if not name.strip() or name in seen:
            what = "an empty column name" if not name.strip() else f"the column name {name!r} twice"
            raise _data_error(
                f"{path}, line 1: read as the header line, it has {what} (field {i + 1} of "
                f"{len(names)}: {names[:8]}{' ...' if len(names) > 8 else ''}); expected distinct "
                "column names: is the file headerless?",
                "for a headerless file pass names=[...] (the column names in order), or --criteo-tsv "
                "on the command line for Criteo TSV logs",
            )
        seen.add(name)


def _header_fields(text: str, sep: str) -> list[str] | None:
    """A header line split into names; quoted (``"a"``, ``"x, y"``, ``"a""b"``) unless
    ``sep`` is a tab, as Arrow reads the rows. None: a quote does not end on the line."""
    if sep == "\t":
        return text.split(sep)
    try:
        return next(csv.reader([text], delimiter=sep, strict=True), [""])
    except csv.Error as exc:
        if "unexpected end of data" in str(exc):
            return None
    # a quote inside a name (a"b), or text after a closing quote: kept, as Arrow does
    return next(csv.reader([text], delimiter=sep), [""])


def _block_size(value: Any) -> int:
    """The ``block_size=`` read kwarg: bytes the CSV parser takes at a time (its
    longest line); 2 MB by default."""
    if value is None:
        return _CSV_PARSE_BLOCK
    if isinstance(value, bool):
        raise TypeError(f"block_size must be a byte count or a size such as '8MB', got {value!r}")
    try:
        return parse_bytes(value)
    except ValueError as exc:
        raise ValueError(f"block_size={value!r}: expected a byte count or a size such as '8MB' "
                         "(the CSV parser's block; a line must fit in it)") from exc


def _check_names(names: Any, files: list[str]) -> None:
    """``names=``: distinct strings (a repeated name would make two columns of one name)."""
    if isinstance(names, str) or not all(isinstance(n, str) for n in names):
        raise TypeError(f"names must be a list of column names (strings), got {names!r}")
    seen: dict[str, int] = {}
    for i, name in enumerate(names):
        if name in seen:
            more = f" (+{len(files) - 1} files)" if len(files) > 1 else ""
            raise ValueError(
                f"names= lists the column {name!r} twice (positions {seen[name] + 1} and {i + 1} of "
                f"{len(names)}), reading {files[0]}{more}: give each column its own name")
        seen[name] = i


def _after_newline(buf: Any, pos: int) -> int:
    """The offset just past the first newline at or after ``pos`` (the end if none)."""
    i = buf.find(b"\n", pos) if pos < len(buf) else -1
    return len(buf) if i < 0 else i + 1


def _data_error(message: str, hint: str) -> DataError:
    """A DataError that also carries a ``hint`` (the CLI prints it under the message)."""
    return DataError(message, hint=hint)


def _excerpt(data: bytes, pos: int, width: int = 120) -> bytes:
    """The line of ``data`` around byte ``pos``, cut to about ``width`` bytes."""
    start = data.rfind(b"\n", 0, pos) + 1
    end = data.find(b"\n", pos)
    end = len(data) if end < 0 else end
    start = max(start, pos - width // 2)
    return data[start:min(end, start + width)].rstrip(b"\r")
