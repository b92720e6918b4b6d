"""fit(resume=True) on another number of ranks (issue 32): a DDP model's
checkpoint written by W ranks mid-epoch resumes on W' ranks with the rows of that
epoch not trained yet (each once), says so in one line, and the next epoch is the
whole one; a checkpoint of another global batch is refused naming both."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from dist_helpers import launch, write_parquet

from tabstream.core.errors import DataError
from tabstream.train.loop import continue_on_workers

HERE = Path(__file__).parent

WORKER = textwrap.dedent('''
    import json, sys
    from pathlib import Path

    import torch
    import torch.distributed as dist

    sys.path.insert(0, HERE)
    import dist_helpers as h

    import tabstream as ts
    from tabstream.core.errors import DataError
    from tabstream.loaders.torch import Loader
    from tabstream.train.torch import fit


    class Recorder:
        """The loader, recording each epoch's row ids (taken out of the features)
        and stopped (on every rank) after ``stop = (epoch, batches)``."""

        def __init__(self, loader, stop):
            self.loader, self.core, self.stop = loader, loader.core, stop
            self.epoch, self.seen = 0, {}

        def set_epoch(self, epoch):
            self.epoch = epoch
            self.loader.set_epoch(epoch)

        def __len__(self):
            return len(self.loader)

        def __iter__(self):
            for i, (features, labels) in enumerate(self.loader):
                if self.stop is not None and (self.epoch, i) == self.stop:
                    raise KeyboardInterrupt("stopped on purpose")
                features = dict(features)
                ids = features.pop("row_id").tolist()
                self.seen.setdefault(str(self.epoch), []).extend(ids)
                yield features, labels


    def run(data, out, name, batch_size, stop):
        from torch.nn.parallel import DistributedDataParallel

        model, _ = h.build("data_parallel", "sgd", "sum")
        if dist.get_world_size() > 1:
            model = DistributedDataParallel(model)
        loader = Recorder(Loader(ts.Dataset(str(Path(data) / "*.parquet")), batch_size=batch_size,
                                 shuffle=True, seed=3, labels=["click"]), stop)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        try:
            fit(model, loader, optimizer, epochs=2, checkpoint_dir=Path(out) / "ck", resume=True,
                progress=False, checkpoint_every=1)
        except KeyboardInterrupt:
            pass
        rank = dist.get_rank()
        (Path(out) / f"{name}-rank{rank}.json").write_text(json.dumps(loader.seen))


    if __name__ == "__main__":
        phase, out, data = sys.argv[1], sys.argv[2], sys.argv[3]
        dist.init_process_group("gloo")
        world = dist.get_world_size()
        if phase == "A":       # 2 ranks x 3 rows, stopped after 4 batches of epoch 0
            run(data, out, "A", 3, (0, 4))
        elif phase == "B":     # 3 ranks: first with another global batch, then 3 x 2 rows
            try:
                run(data, out, "refused", 3, None)
            except DataError as exc:
                print("REFUSED", exc, file=sys.stderr)
            run(data, out, "B", 2, (0, 3))
        else:                  # 3 ranks again: the resumed epoch replayed, then epoch 1
            run(data, out, "C", 2, None)
        dist.destroy_process_group()
''').replace("HERE", repr(str(HERE)))


def _add_row_ids(folder: Path) -> int:
    start = 0
    for path in sorted(folder.glob("*.parquet")):
        table = pq.read_table(path)
        ids = np.arange(start, start + table.num_rows)
        pq.write_table(table.append_column("row_id", [ids]), path)
        start += table.num_rows
    return start


def _seen(out: Path, name: str, world: int) -> list[dict]:
    return [json.loads((out / f"{name}-rank{r}.json").read_text()) for r in range(world)]


@pytest.mark.slow
def test_fit_resumes_a_ddp_checkpoint_on_another_world_size(tmp_path) -> None:
    data = tmp_path / "data"
    write_parquet(data, [40, 17])
    n = _add_row_ids(data)                                   # 57 rows, global batch 6
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    launch(2, "A", tmp_path, str(data), worker=worker)
    a = _seen(tmp_path, "A", 2)
    assert [len(s["0"]) for s in a] == [12, 12]             # 4 batches of 3 on each rank
    ranks = launch(3, "B", tmp_path, str(data), worker=worker)
    # the wrong global batch: refused on every rank, naming both and the fix
    for _, err in ranks:
        assert ("REFUSED fit: checkpoint" in err and "global batch of 6 rows (2 workers x "
                "batch_size=3); this run makes 9 (3 x batch_size=3)" in err
                and "build the loader with batch_size=2 on each of the 3 workers" in err)
    b = _seen(tmp_path, "B", 3)
    assert [len(s["0"]) for s in b] == [6, 6, 6]            # 3 batches of 2, then stopped
    lines = [line for out, _ in ranks for line in out.splitlines() if "workers" in line]
    assert lines == [f"fit: checkpoint {tmp_path / 'ck' / 'checkpoint.pt'} was written by 2 "
                     "workers, this run has 3: epoch 1 continues with the 33 rows not trained "
                     "yet, 6 batches on each worker"]
    assert ranks[0][0].count("\n") == 1, "one line, on rank 0 only"
    ranks = launch(3, "C", tmp_path, str(data), worker=worker)
    assert not any("workers" in out for out, _ in ranks)    # same world size: no line
    c = _seen(tmp_path, "C", 3)
    # C replays B's resumed epoch from where it started (the loop skips the batches
    # B trained, which the recorder sees again): the same batches, then the rest
    assert [s["0"][:6] for s in c] == [s["0"] for s in b]
    assert [len(s["0"]) for s in c] == [11, 11, 11]         # 33 rows: 5 x 2 + 1 each
    epoch0 = [i for part in (a, c) for s in part for i in s["0"]]
    assert sorted(epoch0) == list(range(n)), "epoch 0: every row exactly once"
    epoch1 = [i for s in c for i in s["1"]]
    assert sorted(epoch1) == list(range(n)), "epoch 1: the whole epoch on 3 ranks"


class _Core:
    """What continue_on_workers asks of a loader: its batch size and set_position."""

    def __init__(self, batch_size: int) -> None:
        self.batch_size, self.given = batch_size, None

    def set_position(self, position) -> None:
        self.given = position

    def __len__(self) -> int:
        return 4


def test_refusals_and_old_checkpoints() -> None:
    state = {"epoch": 1, "step": 5, "world": 4, "batch_size": 6,
             "position": {"num_rows": 100, "rows_delivered": 60}}
    with pytest.raises(DataError, match=r"global batch of 24 rows \(4 workers x batch_size=6\); "
                                        r"this run makes 15 \(3 x batch_size=5\).*build the loader "
                                        r"with batch_size=8 on each of the 3 workers"):
        continue_on_workers("ck", state, 3, _Core(5), 1, 5)
    with pytest.raises(DataError, match=r"24 rows do not split evenly over 5 workers: resume on a "
                                        r"number of workers that divides 24 \(1, 2, 3, 4, 6, 8"):
        continue_on_workers("ck", state, 5, _Core(5), 1, 5)
    with pytest.raises(DataError, match="which rows are left is known only to a tabstream loader"):
        continue_on_workers("ck", state, 3, [], 1, 5)
    core = _Core(8)
    assert continue_on_workers("ck", state, 3, core, 1, 5) == (0, (
        "fit: checkpoint ck was written by 4 workers, this run has 3: epoch 2 continues with "
        "the 40 rows not trained yet, 4 batches on each worker"))
    assert core.given is state["position"]
    # an older checkpoint (no world recorded): batches are skipped, as before
    assert continue_on_workers("ck", {"epoch": 1, "step": 5}, 3, _Core(8), 1, 5) == (5, None)
    # the same world size and batch: skipped, with no line
    assert continue_on_workers("ck", state, 4, _Core(6), 1, 5) == (5, None)
    # at an epoch's end another world size needs no position
    assert continue_on_workers("ck", {**state, "step": 0}, 2, _Core(12), 2, 0)[1] == (
        "fit: checkpoint ck was written by 4 workers, this run has 2: training continues at "
        "epoch 3")


if __name__ == "__main__":
    sys.exit("run with pytest")
