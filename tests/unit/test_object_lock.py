"""The per-object reconcile lock (controller/runtime.py::ObjectLocks): one reconcile of an object at a time,
and no entry left once nobody holds or waits for it."""

from __future__ import annotations

import threading

from llm_autopilot.controller.runtime import ObjectLocks


def test_reconciles_of_one_object_never_overlap_and_the_table_empties() -> None:
    locks = ObjectLocks()
    inside, most, guard = 0, 0, threading.Lock()
    entered = threading.Barrier(4)

    def reconcile() -> None:
        nonlocal inside, most
        entered.wait()
        with locks.held("uid-a"):
            with guard:
                inside += 1
                most = max(most, inside)
            threading.Event().wait(0.01)  # hold the lock a moment so the others queue behind it
            with guard:
                inside -= 1

    threads = [threading.Thread(target=reconcile) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert most == 1
    assert "uid-a" not in locks.table


def test_different_objects_do_not_wait_for_each_other() -> None:
    locks = ObjectLocks()
    with locks.held("uid-b"):
        done = threading.Event()

        def other() -> None:
            with locks.held("uid-c"):
                done.set()

        t = threading.Thread(target=other)
        t.start()
        assert done.wait(5), "a reconcile of another object waited for this one"
        t.join(5)
    assert locks.table == {}


def test_an_exception_inside_releases_the_lock_and_its_entry() -> None:
    locks = ObjectLocks()
    try:
        with locks.held("uid-d"):
            raise RuntimeError("a reconcile that failed")
    except RuntimeError:
        pass
    assert "uid-d" not in locks.table
    with locks.held("uid-d"):  # not left held
        pass
