"""tabstream's JSON records (parameter-server metadata, a list-training record, an
export's publish journal) are written by one function: whole or not at all, and
durable: the file is forced to disk before the rename that publishes it, and the
rename is forced to disk after it."""

import json
import os

import pytest

from tabstream.core.jsonfile import write_json_file


def _watch(monkeypatch):
    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        return real_fsync(fd)

    def replace(src, dst):
        events.append(("replace", os.fspath(src), os.fspath(dst)))
        return real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    return events


def test_written_file_then_rename_then_folder_reach_the_disk_in_order(tmp_path, monkeypatch):
    events = _watch(monkeypatch)
    path = tmp_path / "record.json"
    write_json_file(path, {"done": ["a", "b"]})
    assert json.loads(path.read_text()) == {"done": ["a", "b"]}
    (kind0, tmp), (kind1, src, dst), (kind2, folder) = events
    assert (kind0, kind1, kind2) == ("fsync", "replace", "fsync")
    assert tmp == src and dst == str(path) and os.path.dirname(tmp) == str(tmp_path)
    assert folder == str(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["record.json"]  # nothing left beside it


def test_a_failed_write_leaves_the_old_file_and_nothing_beside_it(tmp_path):
    path = tmp_path / "record.json"
    write_json_file(path, {"version": 1})
    with pytest.raises(TypeError):
        write_json_file(path, {"version": object()})  # not JSON: fails mid-write
    assert json.loads(path.read_text()) == {"version": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["record.json"]


def test_list_training_record_is_written_durably(tmp_path, monkeypatch):
    from tabstream.train import lists

    events = _watch(monkeypatch)
    lists._record(tmp_path, ["list-0"])
    assert [e[0] for e in events] == ["fsync", "replace", "fsync"]
    assert events[-1] == ("fsync", str(tmp_path))
    assert json.loads((tmp_path / lists.LISTS_FILE).read_text())["done"] == ["list-0"]
