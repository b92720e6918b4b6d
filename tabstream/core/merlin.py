"""NVTabular / Merlin schema files: ``schema.pbtxt`` and ``.merlin/schema.json``.

NVTabular and merlin-core describe an export with a TensorFlow Metadata
``Schema`` in protobuf text format: one ``feature`` per column with its ``type``
(``INT``, ``FLOAT``, ``BYTES``), an ``int_domain``/``float_domain`` (the
cardinality of a categorical column is ``max + 1``), a ``value_count`` (ragged
lists) or ``shape`` (fixed lists), and an ``annotation`` holding the tags and one
``extra_metadata`` entry: a ``google.protobuf.Struct``, serialized and escaped,
with the column's other properties (``embedding_sizes``, ``freq_threshold``, ...)
plus ``dtype_item_size``, ``is_list`` and ``is_ragged``::

    feature {
      name: "C1"
      type: INT
      int_domain { name: "C1" min: 0 max: 41 is_categorical: true }
      annotation {
        tag: "categorical"
        extra_metadata {
          type_url: "type.googleapis.com/google.protobuf.Struct"
          value: "\\n\\r\\n\\007is_list\\022\\002 \\000..."
        }
      }
    }

This module reads and writes that format with no protobuf dependency: a small
text-format parser and the Struct wire format (varints, doubles and
length-delimited fields). Merlin tags that tabstream has no :class:`Tags` member
for (``session_id``, ``sequence``, ...) are free-form tags (:class:`CustomTag`):
``select_by_tag("session_id")`` finds them, and they are written back as tags.
(tabstream before kept them in ``properties["merlin_tags"]``; a column holding that
property gets them as tags.)

>>> from tabstream.core.schema import ColumnSchema, Schema, Tags
>>> s = Schema([ColumnSchema("C1", "int64", [Tags.CATEGORICAL],
...                          {"domain": {"min": 0, "max": 41, "name": "C1"}})])
>>> text = schema_to_pbtxt(s)
>>> schema_from_pbtxt(text) == s
True
>>> s = Schema([ColumnSchema("session", "int64", [Tags.CATEGORICAL, "session_id"])])
>>> schema_from_pbtxt(schema_to_pbtxt(s)).select_by_tag("session_id").column_names
['session']
"""

from __future__ import annotations

import base64
import json
import math
import posixpath
import re
import struct
from typing import Any

from tabstream.core.errors import DataError
from tabstream.core.jsonfile import loads_json
from tabstream.core.schema import ColumnSchema, CustomTag, Schema, Tags

__all__ = ["read_merlin_schema", "schema_from_merlin_json", "schema_from_pbtxt", "schema_to_pbtxt"]

_STRUCT_URL = "type.googleapis.com/google.protobuf.Struct"
_KNOWN_TAGS = {t.value for t in Tags}
# properties Merlin keeps in extra_metadata that tabstream holds elsewhere
_BOOKKEEPING = ("dtype_item_size", "is_list", "is_ragged", "_dims", "_native_dtype")


# -- protobuf wire format: google.protobuf.Struct ---------------------------------
def _varint(value: int) -> bytes:
    out = bytearray()
    value &= (1 << 64) - 1  # negative enum/int values are 10-byte two's complement
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _encode_value(value: Any) -> bytes:
    if value is None:
        return _varint(1 << 3 | 0) + _varint(0)  # null_value: NULL_VALUE
    if isinstance(value, bool):
        return _varint(4 << 3 | 0) + _varint(int(value))
    if isinstance(value, (int, float)):
        return _varint(2 << 3 | 1) + struct.pack("<d", float(value))
    if isinstance(value, str):
        return _field(3, value.encode())
    if isinstance(value, dict):
        return _field(5, _encode_struct(value))
    if isinstance(value, (list, tuple)):
        return _field(6, b"".join(_field(1, _encode_value(v)) for v in value))
    if hasattr(value, "item"):  # numpy scalar
        return _encode_value(value.item())
    raise TypeError(f"cannot write property value {value!r} ({type(value).__name__}) into a "
                    "Merlin schema; expected None, bool, number, str, list or dict")


def _encode_struct(fields: dict[str, Any]) -> bytes:
    return b"".join(_field(1, _field(1, str(k).encode()) + _field(2, _encode_value(v)))
                    for k, v in fields.items())


def _read_fields(data: bytes, where: str) -> list[tuple[int, int, Any]]:
    """(field number, wire type, value) of every field of one message."""
    out, pos = [], 0

    def varint() -> int:
        nonlocal pos
        shift = result = 0
        while True:
            if pos >= len(data):
                raise DataError(f"{where}: extra_metadata ends inside a number")
            byte = data[pos]
            pos += 1
            result |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                return result

    while pos < len(data):
        key = varint()
        number, wire = key >> 3, key & 7
        if wire == 0:
            out.append((number, wire, varint()))
        elif wire == 1:
            if pos + 8 > len(data):
                raise DataError(f"{where}: extra_metadata is truncated")
            out.append((number, wire, struct.unpack("<d", data[pos:pos + 8])[0]))
            pos += 8
        elif wire == 2:
            length = varint()
            out.append((number, wire, data[pos:pos + length]))
            pos += length
        elif wire == 5:
            if pos + 4 > len(data):
                raise DataError(f"{where}: extra_metadata is truncated")
            out.append((number, wire, struct.unpack("<f", data[pos:pos + 4])[0]))
            pos += 4
        else:
            raise DataError(f"{where}: extra_metadata is not a protobuf Struct "
                            f"(wire type {wire} at byte {pos})")
        if pos > len(data):
            raise DataError(f"{where}: extra_metadata is truncated")
    return out


def _text(raw: bytes, where: str) -> str:
    try:
        return raw.decode()
    except UnicodeDecodeError as exc:
        raise DataError(f"{where}: extra_metadata holds text that is not UTF-8 "
                        f"(byte {exc.start}: {raw[exc.start:exc.end]!r})") from exc


def _number(value: float) -> int | float:
    """Struct numbers are doubles; integral ones were ints (cardinalities, sizes)."""
    return int(value) if math.isfinite(value) and value.is_integer() and abs(value) < 2**53 else value


def _decode_value(data: bytes, where: str) -> Any:
    value: Any = None
    for number, _, raw in _read_fields(data, where):
        if number == 1:
            value = None
        elif number == 2:
            value = _number(raw)
        elif number == 3:
            value = _text(raw, where)
        elif number == 4:
            value = bool(raw)
        elif number == 5:
            value = _decode_struct(raw, where)
        elif number == 6:
            value = [_decode_value(item, where) for n, _, item in _read_fields(raw, where) if n == 1]
    return value


def _decode_struct(data: bytes, where: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for number, _, entry in _read_fields(data, where):
        if number != 1:
            continue
        key, value = "", None
        for n, _, raw in _read_fields(entry, where):
            if n == 1:
                key = _text(raw, where)
            elif n == 2:
                value = _decode_value(raw, where)
        out[key] = value
    return out


# -- protobuf text format -------------------------------------------------------------
_TOKEN = re.compile(r'\s+|#[^\n]*|(?P<str>"(?:[^"\\\n]|\\.)*"|\'(?:[^\'\\\n]|\\.)*\')'
                    r"|(?P<punct>[{}:<>\[\],;])|(?P<word>[^\s{}:<>\[\],;\"']+)")
_ESCAPES = {"n": 10, "r": 13, "t": 9, '"': 34, "'": 39, "\\": 92, "a": 7, "b": 8, "f": 12, "v": 11,
            "?": 63}


def _unescape(body: str, where: str) -> bytes:
    out = bytearray()
    raw = body.encode("utf-8")
    i = 0
    while i < len(raw):
        ch = raw[i]
        if ch != 92:  # backslash
            out.append(ch)
            i += 1
            continue
        nxt = chr(raw[i + 1])
        if nxt in "01234567":
            digits = re.match(rb"[0-7]{1,3}", raw[i + 1:i + 4]).group()  # type: ignore[union-attr]
            out.append(int(digits, 8) & 0xFF)
            i += 1 + len(digits)
        elif nxt in "xX":
            digits = re.match(rb"[0-9a-fA-F]{1,2}", raw[i + 2:i + 4])
            if digits is None:
                raise DataError(f"{where}: bad escape \\x in a string")
            out.append(int(digits.group(), 16))
            i += 2 + len(digits.group())
        elif nxt in _ESCAPES:
            out.append(_ESCAPES[nxt])
            i += 2
        else:
            raise DataError(f"{where}: unknown escape \\{nxt} in a string")
    return bytes(out)


def _escape(data: bytes) -> str:
    out = []
    for byte in data:
        if byte == 10:
            out.append("\\n")
        elif byte == 13:
            out.append("\\r")
        elif byte == 9:
            out.append("\\t")
        elif byte in (34, 39, 92):
            out.append("\\" + chr(byte))
        elif 32 <= byte < 127:
            out.append(chr(byte))
        else:
            out.append(f"\\{byte:03o}")
    return "".join(out)


def _parse_text(text: str, where: str) -> dict[str, list[Any]]:
    """A text-format message as ``{field: [values]}``; nested messages are dicts,
    strings are bytes, other scalars are their source text."""
    tokens: list[tuple[str, str, int]] = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            line = text.count("\n", 0, pos) + 1
            raise DataError(f"{where}, line {line}: cannot read {text[pos:pos + 20]!r} "
                            "(expected protobuf text format)")
        kind = m.lastgroup
        if kind is not None:
            tokens.append((kind, m.group(kind), text.count("\n", 0, pos) + 1))
        pos = m.end()
    i = 0

    def message(closing: str | None) -> dict[str, list[Any]]:
        nonlocal i
        out: dict[str, list[Any]] = {}
        while i < len(tokens):
            kind, value, line = tokens[i]
            if kind == "punct" and value == closing:
                i += 1
                return out
            if kind != "word":
                raise DataError(f"{where}, line {line}: expected a field name, got {value!r}")
            name = value
            i += 1
            if i < len(tokens) and tokens[i][1] == ":":
                i += 1
            if i >= len(tokens):
                raise DataError(f"{where}, line {line}: field {name!r} has no value")
            kind, value, line = tokens[i]
            if kind == "punct" and value in "{<":
                i += 1
                out.setdefault(name, []).append(message("}" if value == "{" else ">"))
            elif kind == "str":
                i += 1
                data = _unescape(value[1:-1], f"{where}, line {line}")
                while i < len(tokens) and tokens[i][0] == "str":  # adjacent strings concatenate
                    data += _unescape(tokens[i][1][1:-1], f"{where}, line {tokens[i][2]}")
                    i += 1
                out.setdefault(name, []).append(data)
            elif kind == "word":
                i += 1
                out.setdefault(name, []).append(value)
            else:
                raise DataError(f"{where}, line {line}: field {name!r}: unexpected {value!r}")
            if i < len(tokens) and tokens[i][1] in ",;":
                i += 1
        if closing is not None:
            raise DataError(f"{where}: a message is not closed (missing {closing!r})")
        return out

    return message(None)


# -- schema <-> Merlin features --------------------------------------------------------
def _one(msg: dict[str, list[Any]], name: str, default: Any = None) -> Any:
    values = msg.get(name)
    return values[-1] if values else default


def _int(value: Any, where: str) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise DataError(f"{where}: expected an integer, got {value!r}") from None


def _dtype(kind: str, item_size: Any, native: Any, where: str) -> str:
    if isinstance(native, str) and native:
        return native
    bits = int(item_size) if isinstance(item_size, (int, float)) and item_size else None
    if kind == "INT":
        return f"int{bits or 64}"
    if kind == "FLOAT":
        return f"float{bits or 32}"
    if kind == "BYTES":
        return "string"
    if kind in ("", "TYPE_UNKNOWN"):
        return "unknown"
    raise DataError(f"{where}: unknown feature type {kind!r}; expected INT, FLOAT or BYTES")


def _column(name: str, kind: str, domain: dict | None, is_float_domain: bool,
            value_count: dict | None, fixed: int | None, tags: list[str],
            metadata: dict[str, Any], where: str) -> ColumnSchema:
    properties = {k: v for k, v in metadata.items() if k not in _BOOKKEEPING}
    dtype = _dtype(kind, metadata.get("dtype_item_size"), metadata.get("_native_dtype"), where)
    is_list = bool(metadata.get("is_list", False)) or value_count is not None or fixed is not None
    is_ragged = bool(metadata.get("is_ragged", is_list and fixed is None))
    categorical = False
    if domain:
        categorical = bool(domain.pop("is_categorical", False))
        if not is_float_domain:
            domain = {"min": int(domain.get("min", 0)), **{k: v for k, v in domain.items() if k != "min"}}
        properties["domain"] = domain
    if value_count is not None and (value_count.get("min") or value_count.get("max")):
        properties["value_count"] = value_count
    elif fixed is not None:
        properties["value_count"] = {"min": fixed, "max": fixed}
        is_ragged = False
    # a tag with no Tags member is a free-form tag, taken as written (never judged a
    # misspelling: the file says what it says)
    read: list[Any] = [t if t.lower() in _KNOWN_TAGS else CustomTag(t) for t in tags if t]
    if categorical and "categorical" not in read:
        read.append("categorical")
    try:  # properties["merlin_tags"] (older tabstream) become tags too: see ColumnSchema
        return ColumnSchema(name, dtype, read, properties, is_list=is_list, is_ragged=is_ragged and is_list)
    except (TypeError, ValueError) as exc:
        raise DataError(f"{where}: {exc}") from exc


def schema_from_pbtxt(text: str, where: str = "schema.pbtxt") -> Schema:
    """A :class:`Schema` from NVTabular's ``schema.pbtxt`` text."""
    top = _parse_text(text, where)
    columns = []
    for feature in top.get("feature", []):
        raw_name = _one(feature, "name")
        if not isinstance(raw_name, bytes):
            raise DataError(f"{where}: a feature has no name")
        name = raw_name.decode()
        at = f"{where}, feature {name!r}"
        kind = str(_one(feature, "type", ""))
        domain_msg = _one(feature, "int_domain") or _one(feature, "float_domain")
        domain = None
        if domain_msg:
            domain = {}
            for key in ("min", "max"):
                if key in domain_msg:
                    raw = _one(domain_msg, key)
                    domain[key] = (_int(raw, f"{at}, int_domain.{key}") if "int_domain" in feature
                                   else _number(float(raw)))
            domain["is_categorical"] = str(_one(domain_msg, "is_categorical", "false")) == "true"
            if isinstance(_one(domain_msg, "name"), bytes):
                domain["name"] = _one(domain_msg, "name").decode()
        vc_msg = _one(feature, "value_count")
        value_count = None
        if vc_msg is not None:
            value_count = {k: _int(_one(vc_msg, k), f"{at}, value_count.{k}")
                           for k in ("min", "max") if k in vc_msg}
        shape = _one(feature, "shape")
        fixed = None
        if shape is not None:
            dims = [_int(_one(d, "size", 0), f"{at}, shape") for d in shape.get("dim", [])]
            fixed = dims[0] if dims else None
        annotation = _one(feature, "annotation", {})
        tags = [t.decode() for t in annotation.get("tag", [])]
        metadata: dict[str, Any] = {}
        for extra in annotation.get("extra_metadata", []):
            url = _one(extra, "type_url", b"").decode()
            if url and not url.endswith("google.protobuf.Struct"):
                raise DataError(f"{at}: extra_metadata of type {url!r}; expected {_STRUCT_URL}")
            metadata.update(_decode_struct(_one(extra, "value", b""), at))
        columns.append(_column(name, kind, domain, "float_domain" in feature, value_count, fixed,
                               tags, metadata, at))
    return Schema(columns)


def _feature_kind(col: ColumnSchema) -> tuple[str | None, int | None]:
    dtype = col.dtype
    m = re.fullmatch(r"u?int(\d+)", dtype)
    if m:
        return "INT", int(m.group(1))
    m = re.fullmatch(r"float(\d+)", dtype)
    if m:
        return "FLOAT", int(m.group(1))
    if dtype == "bool":
        return "INT", 8
    if dtype in ("string", "str", "binary", "large_string"):
        return "BYTES", None
    return None, None


def schema_to_pbtxt(schema: Schema) -> str:
    """NVTabular's ``schema.pbtxt`` text for ``schema`` (read back by
    :func:`schema_from_pbtxt`, and by merlin-core)."""
    lines: list[str] = []
    for col in schema:
        kind, bits = _feature_kind(col)
        props = dict(col.properties)
        domain = props.pop("domain", None)
        value_count = props.pop("value_count", None)
        lines += ["feature {", f'  name: "{_escape(col.name.encode())}"']
        if col.is_list:
            vc = value_count or {}
            if not col.is_ragged and vc.get("min") is not None and vc.get("min") == vc.get("max"):
                lines += ["  shape {", f"    dim {{ size: {int(vc['min'])} }}", "  }"]
            else:
                lines += ["  value_count {", f"    min: {int(vc.get('min', 0) or 0)}",
                          f"    max: {int(vc.get('max', 0) or 0)}", "  }"]
        if kind is not None:
            lines.append(f"  type: {kind}")
        if domain is not None and kind in ("INT", "FLOAT"):
            block = "int_domain" if kind == "INT" else "float_domain"
            domain_name = str(domain.get("name", col.name))
            lines += [f"  {block} {{", f'    name: "{_escape(domain_name.encode())}"']
            for key in ("min", "max"):
                if domain.get(key) is not None:
                    value = domain[key]
                    lines.append(f"    {key}: {int(value) if kind == 'INT' else repr(float(value))}")
            if kind == "INT" and Tags.CATEGORICAL in col.tags:
                lines.append("    is_categorical: true")
            lines.append("  }")
        metadata = {**props, "is_list": col.is_list, "is_ragged": col.is_ragged}
        if bits is not None:
            metadata["dtype_item_size"] = bits
        metadata["_native_dtype"] = col.dtype
        lines.append("  annotation {")
        for tag in sorted(t.value for t in col.tags):  # free-form tags (CustomTag) too
            lines.append(f'    tag: "{_escape(tag.encode())}"')
        lines += ["    extra_metadata {", f'      type_url: "{_STRUCT_URL}"',
                  f'      value: "{_escape(_encode_struct(metadata))}"', "    }", "  }", "}"]
    return "\n".join(lines) + "\n"


def _json_metadata(extra: Any, where: str) -> dict[str, Any]:
    """One ``extraMetadata`` entry of Merlin's JSON schema: a Struct as JSON
    (``{"@type": ..., "value": {...}}`` or the fields inline) or base64 bytes."""
    if not isinstance(extra, dict):
        raise DataError(f"{where}: extraMetadata entry must be an object, got {extra!r}")
    value = extra.get("value", {k: v for k, v in extra.items() if k not in ("@type", "typeUrl", "type_url")})
    if isinstance(value, str):
        try:
            return _decode_struct(base64.b64decode(value), where)
        except ValueError as exc:
            raise DataError(f"{where}: extraMetadata value is neither JSON nor base64: {exc}") from exc
    if not isinstance(value, dict):
        raise DataError(f"{where}: extraMetadata value must be an object, got {value!r}")
    return {k: _number(v) if isinstance(v, float) else v for k, v in value.items()}


def schema_from_merlin_json(text: str, where: str = ".merlin/schema.json") -> Schema:
    """A :class:`Schema` from the JSON form of the same schema (the protobuf JSON
    mapping: camelCase keys, 64-bit integers as strings)."""
    try:
        doc = loads_json(text, where, "Merlin schema")
    except json.JSONDecodeError as exc:
        raise DataError(f"{where}: not JSON: {exc}") from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("feature", []), list):
        raise DataError(f"{where}: expected an object with a 'feature' list")
    columns = []
    for feature in doc.get("feature", []):
        name = feature.get("name")
        if not isinstance(name, str):
            raise DataError(f"{where}: a feature has no name")
        at = f"{where}, feature {name!r}"

        def get(key: str, snake: str, msg: dict = feature) -> Any:
            return msg.get(key, msg.get(snake))

        int_domain, float_domain = get("intDomain", "int_domain"), get("floatDomain", "float_domain")
        domain = None
        if int_domain or float_domain:
            src = int_domain or float_domain
            domain = {k: (_int(src[k], f"{at}, domain.{k}") if int_domain else _number(float(src[k])))
                      for k in ("min", "max") if k in src}
            domain["is_categorical"] = bool(get("isCategorical", "is_categorical", src))
            if isinstance(src.get("name"), str):
                domain["name"] = src["name"]
        vc = get("valueCount", "value_count")
        value_count = None if vc is None else {k: _int(vc[k], f"{at}, valueCount.{k}")
                                               for k in ("min", "max") if k in vc}
        shape = feature.get("shape")
        dims = (shape or {}).get("dim", [])
        fixed = _int(dims[0].get("size", 0), f"{at}, shape") if dims else None
        annotation = feature.get("annotation", {})
        metadata: dict[str, Any] = {}
        for extra in get("extraMetadata", "extra_metadata", annotation) or []:
            metadata.update(_json_metadata(extra, at))
        columns.append(_column(name, str(feature.get("type", "")), domain, float_domain is not None
                               and not int_domain, value_count, fixed,
                               list(annotation.get("tag", [])), metadata, at))
    return Schema(columns)


def read_merlin_schema(fs: Any, files: list[str]) -> Schema | None:
    """The NVTabular/Merlin schema beside ``files``: ``schema.pbtxt``, else
    ``.merlin/schema.json``; None when there is neither."""
    folder = posixpath.dirname(fs._strip_protocol(files[0]))
    for rel, parse in (("schema.pbtxt", schema_from_pbtxt),
                       (".merlin/schema.json", schema_from_merlin_json)):
        path = posixpath.join(folder, rel)
        if fs.exists(path):
            with fs.open(path, "rb") as f:
                raw = f.read()
            try:
                text = raw.decode()
            except UnicodeDecodeError as exc:
                raise DataError(f"{path}: not UTF-8 text (byte {exc.start})") from exc
            try:
                return parse(text, path)
            except DataError as exc:
                exc.hint = exc.hint or (f"fix or remove {rel}: tabstream reads it only for the "
                                        "columns' tags and properties")
                raise
    return None
