"""One parser for the batch layouts of a categorical feature, shared by the plain
(``EmbeddingTables``), cached (``CachedEmbeddings``) and sharded
(``HybridParallel``) tables: same layouts, same results, same errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tabstream.core.errors import SchemaError
from tabstream.train import TableConfig
from tabstream.train.torch.cache import _parse as cache_parse
from tabstream.train.torch.distributed import _to_ragged as sharded_to_ragged
from tabstream.train.torch.embeddings import parse_feature, to_ragged

LISTS = [[3, 0], [], [7, 7, 1]]   # id 0 is a real id
TAGS = TableConfig("tags", 10, 4, ("tags",), is_list=True)
ITEM = TableConfig("item", 10, 4, ("item",))


def _expected(lists):
    values = np.array([v for row in lists for v in row], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum([len(row) for row in lists])]).astype(np.int64)
    return values, offsets


def _padded(lists):
    width = max(len(row) for row in lists)
    ids = torch.tensor([row + [0] * (width - len(row)) for row in lists])
    mask = torch.tensor([[i < len(row) for i in range(width)] for row in lists])
    return ids, mask


def _list_layouts():
    values, offsets = (torch.from_numpy(a) for a in _expected(LISTS))
    ids, mask = _padded(LISTS)
    return {
        "ragged tuple": {"tags": (values.to(torch.int32), offsets.to(torch.int32))},
        "ragged keys": {"tags__values": values, "tags__offsets": offsets},
        "padded tuple": {"tags": (ids, mask)},
        "padded with key": {"tags": ids, "tags__mask": mask},
    }


# the three ways the project turns a list feature into (values, offsets)
RAGGED = {
    "to_ragged": lambda f, c, b: to_ragged(f, c, b),
    "cache": cache_parse,
    "sharded": sharded_to_ragged,
}


@pytest.mark.parametrize("layout", list(_list_layouts()))
@pytest.mark.parametrize("reader", list(RAGGED))
def test_every_list_layout_gives_the_same_ragged_lists(reader, layout):
    values, offsets = RAGGED[reader]("tags", TAGS, _list_layouts()[layout])
    want_values, want_offsets = _expected(LISTS)
    np.testing.assert_array_equal(values.numpy(), want_values)
    np.testing.assert_array_equal(offsets.numpy(), want_offsets)


@pytest.mark.parametrize("ids", [torch.tensor([4, 0, 9]), torch.tensor([[4], [0], [9]])])
def test_single_hot(ids):
    np.testing.assert_array_equal(parse_feature("item", ITEM, {"item": ids}).numpy(), [4, 0, 9])
    (cached,) = cache_parse("item", ITEM, {"item": ids})
    np.testing.assert_array_equal(cached.numpy(), [4, 0, 9])
    values, offsets = to_ragged("item", ITEM, {"item": ids})     # lists of one id
    np.testing.assert_array_equal(values.numpy(), [4, 0, 9])
    np.testing.assert_array_equal(offsets.numpy(), np.arange(4))


def test_padded_layout_keeps_its_shape():
    ids, mask = _padded(LISTS)
    got_ids, got_mask = parse_feature("tags", TAGS, {"tags": ids, "tags__mask": mask})
    assert got_ids is ids and got_mask is mask    # per-id lookups need the (B, L) shape


ids2, mask2 = _padded(LISTS)
BAD = [
    ("missing", "item", ITEM, {"other": torch.tensor([1])}, SchemaError,
     r"categorical feature 'item' \(embedding table 'item'\) is missing from the batch; "
     r"the batch has \['other'\]"),
    ("three items", "tags", TAGS, {"tags": (ids2, ids2, ids2)}, ValueError,
     r"feature 'tags': a tuple input must be \(values, offsets\) or \(padded, mask\), got 3 items"),
    ("not a tensor", "item", ITEM, {"item": [1, 2]}, TypeError,
     r"categorical feature 'item': expected an int64 tensor or a \(values, offsets\) tuple, "
     r"got list"),
    ("2-D offsets", "tags", TAGS, {"tags": (torch.tensor([1]), torch.tensor([[0, 1]]))},
     ValueError, r"list feature 'tags': offsets must be 1-D with B \+ 1 entries \(arrow style, "
     r"first 0, last len\(values\)\), got shape \(1, 2\)"),
    ("not a list column", "item", ITEM, {"item": torch.zeros(3, 2, dtype=torch.long)},
     ValueError, r"categorical feature 'item' is not a list column in the schema but arrived "
     r"with shape \(3, 2\); expected \(B,\) or \(B, 1\)"),
    ("no mask", "tags", TAGS, {"tags": ids2}, ValueError,
     r"list feature 'tags' arrived as padded ids of shape \(3, 3\) without a mask; id 0 is a "
     r"real id.*Pass \(padded, mask\) \(the loader's pad= layout\), the key 'tags__mask'"),
    ("mask shape", "tags", TAGS, {"tags": ids2, "tags__mask": mask2[:, :2]}, ValueError,
     r"list feature 'tags': padded ids \(3, 3\) and mask \(3, 2\) differ in shape"),
    ("3-D ids", "item", ITEM, {"item": torch.zeros(3, 1, 1, dtype=torch.long)}, ValueError,
     r"categorical feature 'item': expected shape \(B,\), \(B, 1\) or \(B, L\), got \(3, 1, 1\)"),
]


@pytest.mark.parametrize("reader", ["parse_feature", *RAGGED])
@pytest.mark.parametrize(("case", "feature", "cfg", "batch", "error", "match"), BAD,
                         ids=[row[0] for row in BAD])
def test_every_reader_refuses_the_same_way(reader, case, feature, cfg, batch, error, match):
    read = parse_feature if reader == "parse_feature" else RAGGED[reader]
    with pytest.raises(error, match=match):
        read(feature, cfg, batch)


@pytest.mark.parametrize("reader", list(RAGGED))
def test_padded_lists_of_lists_have_no_ragged_form(reader):
    ids = torch.zeros(2, 3, 4, dtype=torch.long)
    with pytest.raises(ValueError, match=r"list feature 'tags': padded ids of shape \(2, 3, 4\) "
                       r"are a list of lists, which this module does not take"):
        RAGGED[reader]("tags", TAGS, {"tags": (ids, torch.ones(2, 3, 4, dtype=torch.bool))})
