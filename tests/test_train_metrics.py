"""torchrec.metrics while training (recsys_hdet.components.train_metrics): a real 2-rank gloo job
against an independent computation (our held-out metrics and scikit-learn) on the same rows."""
import torch
from sklearn.metrics import roc_auc_score

from dist_helpers import spawn

TASKS = ["a", "b"]
BATCH, WINDOW_STEPS, STEPS, FIRST_INTERVAL = 64, 3, 5, 2


def _rows(rank, step):
    g = torch.Generator().manual_seed(1000 * rank + step)
    p = torch.rand(BATCH, len(TASKS), generator=g)
    y = (torch.rand(BATCH, len(TASKS), generator=g) < p * 0.7).float()
    return p, y


def _job(out_path):
    import torch.distributed as dist

    from recsys_hdet.components.train_metrics import TrainMetrics

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    metrics = TrainMetrics(TASKS, BATCH, world, rank, WINDOW_STEPS, torch.device("cpu"), dist.group.WORLD)
    for step in range(STEPS):
        metrics.update(*_rows(rank, step))
        if step + 1 == FIRST_INTERVAL:
            metrics.compute()  # the first interval: its rows leave the figures
            metrics.interval_positives()  # as the trainer: every record restarts the count
    positives = metrics.interval_positives()
    dist.all_reduce(positives)
    result = metrics.compute()
    if rank == 0:
        torch.save({**result, "positives": positives}, out_path)
    dist.barrier()


def test_interval_metrics_are_those_of_every_rank_s_rows_since_the_last_compute(tmp_path):
    from recsys_hdet.components.train_metrics import entropy_ne
    from recsys_hdet.evaluation.task_metrics import task_metrics

    out = tmp_path / "metrics.pt"
    spawn(_job, 2, str(out))
    got = torch.load(out)
    positives = got.pop("positives")
    assert set(got) == {"ne", "calibration", "auc"}
    # The interval: the steps since the first compute, of both ranks.
    rows = [_rows(r, s) for r in range(2) for s in range(FIRST_INTERVAL, STEPS)]
    p, y = torch.cat([r[0] for r in rows]), torch.cat([r[1] for r in rows])
    for i, task in enumerate(TASKS):
        expected = task_metrics(p[:, i], y[:, i])
        assert abs(got["ne"][task] - expected["ne"]) < 1e-4, task
        assert abs(got["calibration"][task] - float(p[:, i].sum() / y[:, i].sum())) < 1e-4, task
        assert abs(got["auc"][task] - roc_auc_score(y[:, i].numpy(), p[:, i].numpy())) < 1e-4, task
        # what the divergence check reads between two computations: the interval's mean log loss over the
        # entropy of its positive rate, from the positives and rows counted on both ranks
        assert float(positives[i]) == float(y[:, i].sum()) and float(positives[-1]) == y.shape[0]
        log_loss = float(torch.nn.functional.binary_cross_entropy(p[:, i].double(), y[:, i].double()))
        assert abs(entropy_ne(log_loss, float(positives[i]), float(positives[-1])) - got["ne"][task]) < 1e-4, task
    # Not the whole pass: the first interval's rows give other values.
    all_rows = [_rows(r, s) for r in range(2) for s in range(STEPS)]
    p_all, y_all = torch.cat([r[0] for r in all_rows]), torch.cat([r[1] for r in all_rows])
    assert abs(got["ne"]["a"] - task_metrics(p_all[:, 0], y_all[:, 0])["ne"]) > 1e-4


def test_entropy_ne_is_nan_without_rows_or_with_one_label_only():
    import math

    from recsys_hdet.components.train_metrics import entropy_ne

    assert entropy_ne(math.log(2), 50, 100) == 1.0  # the base-rate predictor at p = 0.5
    assert all(math.isnan(entropy_ne(0.5, pos, rows)) for pos, rows in ((0, 100), (100, 100), (0, 0)))
