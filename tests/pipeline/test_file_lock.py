"""tabstream.pipeline.file_lock.exclusive: holders take turns (threads too: each
opens its own file description), also while each holder removes the lock file on
leaving; nothing is left behind. Reference: a read-modify-write counter that loses
increments unless every one of them is exclusive."""

from __future__ import annotations

import os
import threading
import time

from tabstream.pipeline.file_lock import exclusive


def test_holders_take_turns_and_leave_no_lock_file(tmp_path):
    counter, lock = tmp_path / "counter", str(tmp_path / ".counter.lock")
    counter.write_text("0")
    threads, rounds = 6, 25
    inside, overlaps = [], []

    def work():
        for _ in range(rounds):
            with exclusive(lock):
                inside.append(1)
                if len(inside) > 1:  # somebody else holds it too
                    overlaps.append(len(inside))
                value = int(counter.read_text())
                time.sleep(0.0005)  # a read-modify-write that loses updates unless exclusive
                counter.write_text(str(value + 1))
                inside.pop()

    pool = [threading.Thread(target=work) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join(timeout=120)
    assert not overlaps
    assert int(counter.read_text()) == threads * rounds
    assert sorted(os.listdir(tmp_path)) == ["counter"]
