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


_METRICS_ON_ONE_RANK = r'''
import os
import torch
import torch.distributed as dist
from recsys_hdet.components.train_metrics import TrainMetrics

torch.set_num_threads(2)
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ["PORT"])
dist.init_process_group("gloo", rank=0, world_size=1)
(torch.rand(4_000_000) * 2.0).sum()  # the training thread's team exists now
metrics = TrainMetrics(["like"], 512, 1, 0, 100, torch.device("cpu"), dist.group.WORLD)
g = torch.Generator().manual_seed(0)
labels = (torch.rand(100 * 512, 1, generator=g) < 0.3).float()
scores = (labels + torch.rand(100 * 512, 1, generator=g)) / 2.0
for i in range(100):
    metrics.update(scores[i * 512:(i + 1) * 512], labels[i * 512:(i + 1) * 512])
before = set(os.listdir("/proc/self/task"))
out = metrics.compute()
print(len(set(os.listdir("/proc/self/task")) - before))
from sklearn.metrics import roc_auc_score
print(out["auc"]["like"], roc_auc_score(labels[:, 0].numpy(), scores[:, 0].numpy()))
'''


def test_one_rank_training_metrics_start_no_openmp_team_on_gloos_thread():
    # With one rank there is nothing to reduce; torchmetrics' all-gather of the AUC's window (51,200
    # rows here) would copy it on gloo's thread and start an OpenMP team there (measured: one worker
    # with 2 threads at trainer.log_every=100 trained at 14.4k ex/s instead of 27.8k).
    import socket
    import subprocess
    import sys

    from conftest import REPO

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.run([sys.executable, "-c", _METRICS_ON_ONE_RANK], cwd=REPO, capture_output=True, text=True,
                          timeout=180, env={**os.environ, "PORT": str(port)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    started, aucs = proc.stdout.split("\n")[:2]
    assert int(started) == 0, proc.stdout
    ours, sklearn = (float(x) for x in aucs.split())
    assert abs(ours - sklearn) < 1e-4, aucs
