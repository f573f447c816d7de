"""The thread policy (recsys_hdet.distributed.threads_per_worker): the cores the job may use, shared
by its local workers, or the configured count."""

import os

from recsys_hdet.distributed import threads_per_worker, usable_cores


def test_threads_follow_the_cpu_affinity_not_the_machines_core_count(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4, 5}, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    assert usable_cores() == 6
    assert threads_per_worker(None, 2) == 3 and threads_per_worker(None, 4) == 1 and threads_per_worker(None, 1) == 6
    assert threads_per_worker(None, 8) == 1  # never zero
    assert threads_per_worker(2, 4) == 2  # trainer.threads_per_worker wins
