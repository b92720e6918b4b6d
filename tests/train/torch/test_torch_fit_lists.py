"""fit_lists: continuous training over file lists that knows, after a restart,
which lists are done; deltas exported once each; the same result as a run that
never stopped."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from test_torch_cache import Batches, Crashing, make_batches, schema

from tabstream.core.errors import DataError
from tabstream.train.torch import (
    DLRM,
    CachedEmbeddings,
    ParameterServer,
    fit_lists,
    lists_done,
    table_configs_from_schema,
)

DAYS = [Batches(make_batches(s, n_batches=3), f"day{s}") for s in range(3)]


def build(folder, cache_rows=6):
    configs = table_configs_from_schema(schema().without(["click"]), dim=8)
    ps = ParameterServer.open_or_create(folder, configs, storage="disk", optimizer="adagrad", lr=0.05)
    torch.manual_seed(0)
    model = DLRM(schema(), embedding_dim=8, embeddings=CachedEmbeddings(ps, cache_rows))
    return ps, model, torch.optim.Adam(model.parameters(), lr=0.01)


def replay_deltas(delta_root, tables):
    """What a serving system holds after applying the deltas in order."""
    held = {t: {} for t in tables}
    for folder in sorted(p for p in delta_root.iterdir()):
        for t in tables:
            part = pq.read_table(folder / t / "part_00000.parquet").to_pydict()
            held[t].update(zip(part["key"], part["value"]))
    return held


def reference(tmp_path, passes=1):
    ps, model, opt = build(tmp_path / "ref_ps")
    fit_lists(model, DAYS, opt, checkpoint_dir=tmp_path / "ref_ck", passes=passes,
              delta_dir=tmp_path / "ref_delta", progress=False)
    return ps, model


def test_a_restart_trains_only_what_is_left_and_equals_an_uninterrupted_run(tmp_path):
    ref_ps, ref_model = reference(tmp_path, passes=2)
    expected = {t: ref_ps.lookup(t, np.arange(n)) for t, n in (("C1", 40), ("C2", 25))}
    expected_state = {k: v.clone() for k, v in ref_model.state_dict().items()}
    ref_ps.close()

    # first run: pass 1 complete, then pass 2 crashes inside its second list
    ps, model, opt = build(tmp_path / "ps")
    lists = [DAYS[0], Crashing(DAYS[1], "day1", at=10**9), DAYS[2]]
    fit_lists(model, lists, opt, checkpoint_dir=tmp_path / "ck", delta_dir=tmp_path / "delta",
              progress=False)
    assert lists_done(tmp_path / "ck") == ["day0", "day1", "day2"]
    crashing = [DAYS[0], Crashing(DAYS[1], "day1", at=2), DAYS[2]]
    with pytest.raises(KeyboardInterrupt):
        fit_lists(model, crashing, opt, checkpoint_dir=tmp_path / "ck", passes=2,
                  delta_dir=tmp_path / "delta", checkpoint_every=1, progress=False)
    assert lists_done(tmp_path / "ck") == ["day0", "day1", "day2", "day0"]
    ps.close()  # the process died

    # the restarted job runs the same loop from the top: nothing trained twice
    ps, model, opt = build(tmp_path / "ps")
    trained = []
    fit_lists(model, DAYS, opt, checkpoint_dir=tmp_path / "ck", passes=2,
              delta_dir=tmp_path / "delta", progress=False,
              on_list_end=lambda position, loader, history: trained.append(position))
    assert trained == [4, 5]
    for t, rows in expected.items():
        np.testing.assert_allclose(ps.lookup(t, np.arange(len(rows))), rows, rtol=1e-6, atol=1e-7)
    for k, v in expected_state.items():
        torch.testing.assert_close(model.state_dict()[k], v)
    # one delta per list position; applied in order they give the trained tables
    assert sorted(p.name for p in (tmp_path / "delta").iterdir()) == [f"{i:05d}" for i in range(6)]
    held = replay_deltas(tmp_path / "delta", ["C1", "C2"])
    for t in ("C1", "C2"):
        ids = np.array(sorted(held[t]), np.int64)
        np.testing.assert_array_equal(ids, ps.touched(t))
        np.testing.assert_allclose(np.array([held[t][i] for i in ids.tolist()]), ps.lookup(t, ids))
    ps.close()


def test_a_crash_between_a_list_and_its_delta_writes_the_delta_once(tmp_path, monkeypatch):
    ps, model, opt = build(tmp_path / "ps")
    calls = []
    real = ParameterServer.export_delta

    def dying_export(self, directory):
        calls.append(str(directory))
        if len(calls) == 2:
            raise KeyboardInterrupt("died before the second delta")
        return real(self, directory)

    monkeypatch.setattr(ParameterServer, "export_delta", dying_export)
    with pytest.raises(KeyboardInterrupt):
        fit_lists(model, DAYS, opt, checkpoint_dir=tmp_path / "ck", delta_dir=tmp_path / "delta",
                  progress=False)
    monkeypatch.setattr(ParameterServer, "export_delta", real)
    assert lists_done(tmp_path / "ck") == ["day0"]
    version_after_day1 = ps.version
    ps.close()
    ps, model, opt = build(tmp_path / "ps")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no NothingToTrainWarning escapes a restart
        fit_lists(model, DAYS, opt, checkpoint_dir=tmp_path / "ck", delta_dir=tmp_path / "delta",
                  progress=False)
    # day1 was not trained again: its delta holds exactly the rows it changed
    assert pq.read_table(tmp_path / "delta" / "00001" / "C1" / "part_00000.parquet").num_rows > 0
    meta = json.loads((tmp_path / "delta" / "00001" / "_delta.json").read_text())
    assert meta["to_version"] == version_after_day1
    ref_ps, _ = reference(tmp_path)
    for t, n in (("C1", 40), ("C2", 25)):
        np.testing.assert_allclose(ps.lookup(t, np.arange(n)), ref_ps.lookup(t, np.arange(n)),
                                   rtol=1e-6, atol=1e-7)
    ps.close()
    ref_ps.close()


def test_another_sequence_than_the_checkpoints_is_refused(tmp_path):
    ps, model, opt = build(tmp_path / "ps")
    fit_lists(model, DAYS[:2], opt, checkpoint_dir=tmp_path / "ck", progress=False)
    with pytest.raises(DataError, match=r"records file list day0 as trained at position 0, but "
                                        r"this sequence has day1 there"):
        fit_lists(model, [DAYS[1], DAYS[0]], opt, checkpoint_dir=tmp_path / "ck", progress=False)
    with pytest.raises(ValueError, match=r"one file list is given twice \(day0\)"):
        fit_lists(model, [DAYS[0], DAYS[0]], opt, checkpoint_dir=tmp_path / "ck", progress=False)
    with pytest.raises(TypeError, match=r"list 0 \(list\) has no data identity"):
        fit_lists(model, [list(DAYS[0])], opt, checkpoint_dir=tmp_path / "ck", progress=False)
    with pytest.raises(TypeError, match="resume is set by fit_lists itself"):
        fit_lists(model, DAYS, opt, checkpoint_dir=tmp_path / "ck", resume=False)
    with pytest.raises(ValueError, match="passes must be an int >= 1, got 0"):
        fit_lists(model, DAYS, opt, checkpoint_dir=tmp_path / "ck", passes=0)
    ps.close()
    plain = DLRM(schema(), embedding_dim=8)
    with pytest.raises(ValueError, match="delta_dir needs a model with CachedEmbeddings"):
        fit_lists(plain, DAYS, torch.optim.Adam(plain.parameters()), checkpoint_dir=tmp_path / "c2",
                  delta_dir=tmp_path / "d2")
