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


_OPENMP_THREADS = r'''
import os, sys, threading
import torch
from recsys_hdet.components.openmp import single_openmp_thread

torch.set_num_threads(3)
x = torch.rand(2000, 2000)
def threads():
    return set(os.listdir("/proc/self/task"))
def parallel_work():
    for _ in range(3):
        (x * 2.0).sum()  # an elementwise op over 4M elements: an OpenMP parallel region
parallel_work()  # the training thread's team exists now
def helper(initializer, out):
    if initializer:
        initializer()
    before = threads()
    parallel_work()
    out.append(len(threads() - before))  # threads started meanwhile (an earlier helper's may be exiting)
for initializer in (None, single_openmp_thread):
    out = []
    t = threading.Thread(target=helper, args=(initializer, out))
    t.start(); t.join()
    print(out[0])
'''


def test_a_helper_thread_that_runs_torch_ops_starts_no_openmp_team_of_its_own():
    # What the day reader's initializer prevents: without it a helper thread's first parallel region
    # starts a team (here 2 more threads beside the helper), and with more OpenMP threads than cores
    # the training thread's parallel regions slow down (BENCHMARKS.md). The check counts the
    # process's threads while the helper runs.
    import subprocess
    import sys

    from conftest import REPO

    proc = subprocess.run([sys.executable, "-c", _OPENMP_THREADS], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    started_without, started_with = (int(line) for line in proc.stdout.split())
    assert started_without == 2, f"the check itself: a plain helper thread should start a team ({proc.stdout})"
    assert started_with == 0, proc.stdout
