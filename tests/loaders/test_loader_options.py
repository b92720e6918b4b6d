"""LoaderOptions: the loader's arguments, written out once and checked in one place.

The core loader and both adapters take exactly its fields (names, order, kinds,
defaults), build one and forward it; every argument error comes from it, whichever
loader is built."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tabstream.loaders import Loader, LoaderOptions

# the adapters' own arguments, beside the options; their first argument is "dataset"
ADAPTERS = {"tabstream.loaders.torch": ("torch", {"device", "keyed_jagged"}),
            "tabstream.loaders.tensorflow": ("tensorflow", {"device"})}


def _option_parameters() -> list[tuple[str, Any, Any]]:
    """(name, kind, default) of each field, as a constructor parameter."""
    out = []
    keyword_only = False
    for field in dataclasses.fields(LoaderOptions):
        keyword_only = keyword_only or field.kw_only
        kind = inspect.Parameter.KEYWORD_ONLY if keyword_only else inspect.Parameter.POSITIONAL_OR_KEYWORD
        default = inspect.Parameter.empty if field.default is dataclasses.MISSING else field.default
        out.append((field.name, kind, default))
    return out


def _parameters(cls: type, skip: set[str] = frozenset()) -> list[tuple[str, Any, Any]]:
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    return [("data" if p.name == "dataset" else p.name, p.kind, p.default)
            for p in params if p.name not in skip]


def test_the_core_loader_takes_exactly_the_options() -> None:
    expected = [("data", inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.empty),
                ("batch_size", inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.empty)]
    assert _option_parameters()[:2] == expected
    assert _parameters(Loader) == _option_parameters()


@pytest.mark.parametrize("module", sorted(ADAPTERS))
def test_the_adapters_take_the_options_and_their_own(module: str) -> None:
    framework, own = ADAPTERS[module]
    pytest.importorskip(framework)
    adapter = importlib.import_module(module).Loader
    assert _parameters(adapter, own) == _option_parameters()
    names = list(inspect.signature(adapter.__init__).parameters)
    assert names[1] == "dataset"


@pytest.mark.parametrize(("kwargs", "error", "message"), [
    ({"batch_size": 0}, ValueError, "batch_size must be >= 1, got 0"),
    ({"batch_size": 2.0}, TypeError, "batch_size must be an int, got float 2.0"),
    ({"batch_size": True}, TypeError, "batch_size must be an int, got bool True"),
    ({"seed": -1}, ValueError, "seed must be >= 0, got -1"),
    ({"parts_per_chunk": 0}, ValueError, "parts_per_chunk must be >= 1, got 0"),
    ({"prefetch": "2"}, TypeError, "prefetch must be an int, got str '2'"),
    ({"global_size": 0}, ValueError, "global_size must be >= 1, got 0"),
    ({"global_size": 2, "global_rank": 2}, ValueError, r"global_rank must be < global_size=2, got 2"),
    ({"global_rank": 1}, ValueError, r"global_rank must be < global_size=1, got 1"),
])
def test_bad_numbers_are_refused_by_the_options_whichever_loader(shared_export: Path, kwargs: dict,
                                                                  error: type, message: str) -> None:
    args = {"batch_size": 8, **kwargs}
    with pytest.raises(error, match=f"^{message}$"):
        LoaderOptions(shared_export, **args)
    with pytest.raises(error, match=f"^{message}$"):
        Loader(shared_export, **args)
    if "global_size" not in kwargs:  # the adapters ask for a rank first (their own check)
        torch_loaders = pytest.importorskip("tabstream.loaders.torch")
        with pytest.raises(error, match=f"^{message}$"):
            torch_loaders.Loader(shared_export, **args)


def test_options_are_normalized_and_checked_again_on_replace() -> None:
    opts = LoaderOptions("data", np.int64(16), shuffle=0, drop_last=1, prefetch=np.int32(3))
    assert (opts.batch_size, opts.shuffle, opts.drop_last, opts.prefetch) == (16, False, True, 3)
    assert (type(opts.batch_size), type(opts.prefetch)) == (int, int)
    assert (opts.global_size, opts.global_rank) == (1, 0)
    assert dataclasses.replace(opts, seed=4).seed == 4
    with pytest.raises(ValueError, match="^seed must be >= 0, got -4$"):
        dataclasses.replace(opts, seed=-4)
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.seed = 1  # type: ignore[misc]
    with pytest.raises(TypeError, match="positional arguments but 10 were given"):
        LoaderOptions("data", 16, 1, 0, 2, None, None, False, ["C1"])  # features: keyword only


def test_from_options_is_the_loader_of_its_arguments(shared_export: Path, testdata: Any) -> None:
    kw = {"seed": 3, "global_size": 2, "global_rank": 1, "features": ["row_id", "tags"],
          "pad": {"tags": 2}, "shuffle": True}
    opts = LoaderOptions(shared_export, 64, **kw)
    built = Loader.from_options(opts)
    plain = Loader(shared_export, 64, **kw)
    assert built.options == plain.options == opts
    got = [(f["row_id"], f["tags"][0]) for f, _ in built]
    assert len(got) == len(plain) and len(got) > 1
    for (ids, tags), (features, _) in zip(got, plain, strict=True):
        np.testing.assert_array_equal(ids, features["row_id"])
        np.testing.assert_array_equal(tags, features["tags"][0])
    # the tags as pyarrow reads them, cut to 2 and padded with 0
    table = testdata.read_all(shared_export)
    by_id = dict(zip(table["row_id"].to_pylist(), table["tags"].to_pylist(), strict=True))
    for ids, tags in got:
        want = [(by_id[int(r)] + [0, 0])[:2] for r in ids]
        assert tags.tolist() == want
    with pytest.raises(TypeError, match="^options must be a LoaderOptions, got dict$"):
        Loader.from_options(dict(kw))


def test_the_adapters_forward_one_options_object(shared_export: Path) -> None:
    torch_loaders = pytest.importorskip("tabstream.loaders.torch")
    kw = {"seed": 5, "parts_per_chunk": 3, "drop_last": True, "features": ["C1"], "prefetch": 4}
    loader = torch_loaders.Loader(shared_export, 32, **kw)
    assert loader.core.options == LoaderOptions(shared_export, 32, global_size=1, global_rank=0, **kw)
    assert (loader.batch_size, loader.seed, loader.drop_last) == (32, 5, True)
