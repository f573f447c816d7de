"""TensorBoard scalars for a run, written beside ``RunDir.METRICS`` and ``hdet.jsonl``.

Design (as torchtitan's metrics logger and Lightning's ``TensorBoardLogger`` do it):

- One writer, on rank 0 only, into ``<run_dir>/tensorboard/``: ``tensorboard --logdir`` on the
  run directory (or on a parent holding several runs) shows the run; nothing else is started
  (``SummaryWriter``'s event-file thread lives in the rank-0 worker). ``trainer.tensorboard: false``
  and every other rank get :class:`NullTensorBoard`, whose methods do nothing.
- The scalars are the JSON-lines records themselves, turned into tags, so the two never disagree:
  a ``RunDir.METRICS`` record gives ``loss/<task>`` (and ``loss/avg``), ``lr/<group>`` and
  ``throughput/examples_per_s``; an ``hdet.jsonl`` record gives, per explored hyperparameter
  (``lr/embedding``, ..., ``dropout``), ``hdet/<hparam>/base`` (the window's base),
  ``hdet/<hparam>/replica<k>`` (each replica's value) and its other numbers (``next_base``,
  ``velocity``, ``log_offset``), ``hdet/window_loss/replica<k>`` (the loss each replica was scored
  by; ``hdet/window_train_loss/replica<k>`` beside it under the probe signal) and
  ``hdet/excluded_replicas`` (how many were non-finite). The x axis is the optimizer step, as in
  the JSON records.
- Every record is flushed when written (one small write per logging interval or sync, as
  ``RunDir.METRICS`` is), so a crashed or diverged run leaves its event files complete up to its
  last record without depending on ``close()`` being reached.
- Resume: ``start_step`` is the number of steps already done when this attempt starts (0 for a
  fresh run, the checkpoint's step for a resumed one). Records carry the step count after the
  step, so this attempt's first record is at a step above ``start_step``, and the records an
  earlier attempt wrote up to ``start_step`` stay valid (``RunDir.METRICS`` and ``hdet.jsonl``
  keep them too). The writer is opened with ``purge_step=start_step + 1``, which writes a
  ``SessionLog.START`` event at that step into a new event file. TensorBoard's Python reader
  (``EventAccumulator``, what ``tensorboard --load_fast=false`` and the tests use) then drops every
  event at or after that step that an earlier attempt wrote, and the resumed attempt's points
  continue the same curves without duplicated steps. TensorBoard's default Rust data server
  ignores the ``SessionLog`` event but reaches the same result its own way: a point whose step is
  not above a time series' last one discards that series' points at and after its step. A fresh
  run purges from step 1: a run directory reused by a new run shows the new run only, as its
  ``RunDir.METRICS`` (rewritten) does; the old event files stay on disk.

Limits:

- Rank 0's view only: values of other ranks appear where the records carry them (HDET's replicas
  and window losses), nowhere else.
- The purge relies on the resumed attempt writing every tag again after ``start_step`` (the
  Rust server purges per tag, when that tag's next point arrives); the trainer does, since its
  tags come from the config. A tag the earlier attempt wrote and the resumed one never writes
  keeps its stale points there (the Python reader still purges it).
- Non-finite numbers are written as they are (TensorBoard shows NaN and inf); ``null`` entries
  of ``hdet.jsonl`` (a replica excluded at a sync) are left out.
- Only scalars: no histograms, graphs or profiles (``trainer.profile`` writes ``profile.txt``).

After a completed pass (:func:`log_final`): the held-out metrics as ``heldout/<metric>/<task>``
(``ne``, ``auc``, ``logloss``, ``calibration``; ``heldout/ne/mean`` over the tasks) at the last step,
and the run's hyperparameters (:func:`run_hparams`) with its held-out NE in TensorBoard's HParams tab
(``add_hparams``: one row per run when ``--logdir`` holds several; metric tags ``hparam/...``).
"""

from __future__ import annotations

import os
from typing import Any, Dict, Mapping, Optional

from omegaconf import DictConfig

from recsys_hdet.run_dir import RunDir


def _number(value: Any) -> Optional[float]:
    """A float for an int or float (bools and None excluded), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


class NullTensorBoard:
    """What ranks other than 0, and runs with ``trainer.tensorboard: false``, get: does nothing."""

    log_dir: Optional[str] = None

    def log_metrics(self, record: Mapping[str, Any]) -> None:
        pass

    def log_hdet(self, record: Mapping[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass


class TensorBoardWriter(NullTensorBoard):
    """Writes ``RunDir.METRICS`` and ``hdet.jsonl`` records as TensorBoard scalars (see the module)."""

    def __init__(self, log_dir: str, start_step: int = 0) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = log_dir
        os.makedirs(log_dir, exist_ok=True)
        # Readers discard what an earlier attempt wrote after start_step (this attempt rewrites it).
        self._writer: Any = SummaryWriter(log_dir=log_dir, purge_step=int(start_step) + 1)

    def _scalar(self, tag: str, value: Any, step: int) -> None:
        v = _number(value)
        if v is not None:
            self._writer.add_scalar(tag, v, global_step=step)

    def log_metrics(self, record: Mapping[str, Any]) -> None:
        """One ``RunDir.METRICS`` record: step, examples, loss {task: v, avg}, lr {group: v}, ne, calibration
        and auc {task: v}, examples_per_sec."""
        step = int(record["step"])
        for task, v in (record.get("loss") or {}).items():
            self._scalar(f"loss/{task}", v, step)
        for group, v in (record.get("lr") or {}).items():
            self._scalar(f"lr/{group}", v, step)
        for metric in ("ne", "calibration", "auc"):  # torchrec.metrics, per task, over the interval
            for task, v in (record.get(metric) or {}).items():
                self._scalar(f"{metric}/{task}", v, step)
        self._scalar("throughput/examples_per_s", record.get("examples_per_sec"), step)
        self._writer.flush()

    def log_hdet(self, record: Mapping[str, Any]) -> None:
        """One ``hdet.jsonl`` record: step, losses [per replica], hparams {name: {base, values, ...}},
        excluded [replicas], and train_losses under the probe signal."""
        step = int(record["step"])
        for name, entry in (record.get("hparams") or {}).items():
            for key, v in entry.items():
                if key == "values":
                    for k, value in enumerate(v):
                        self._scalar(f"hdet/{name}/replica{k}", value, step)
                else:
                    self._scalar(f"hdet/{name}/{key}", v, step)
        for field, tag in (("losses", "window_loss"), ("train_losses", "window_train_loss")):
            for k, v in enumerate(record.get(field) or []):
                self._scalar(f"hdet/{tag}/replica{k}", v, step)
        self._scalar("hdet/excluded_replicas", len(record.get("excluded") or []), step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


HELD_OUT_METRICS = ("ne", "auc", "logloss", "calibration")


def run_hparams(cfg: DictConfig) -> Dict[str, Any]:
    """The run's scalar settings for the HParams tab: every leaf of ``optim``, ``model`` and ``hdet``,
    and the experiment, seed, data set, batch size and layout (lists and nulls as text)."""
    from recsys_hdet.config_values import plain

    out: Dict[str, Any] = {"experiment": str(cfg.experiment_name), "seed": int(cfg.seed), "data": str(cfg.data.name),
                           "data.batch_size": int(cfg.data.batch_size), "trainer.nproc": int(cfg.trainer.nproc),
                           "trainer.sharding_group_size": int(cfg.trainer.sharding_group_size)}

    def leaves(node: Any, prefix: str) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                leaves(v, f"{prefix}.{k}")
        else:
            out[prefix] = node if isinstance(node, (bool, int, float, str)) else str(node)

    for section in ("optim", "model", "hdet"):
        leaves(plain(getattr(cfg, section)), section)
    return out


def trained_hparams(cfg: DictConfig, summary: Mapping[str, Any]) -> Dict[str, Any]:
    """:func:`run_hparams` with each group's max LR as trained (``optim.lr.*``: RunDir.SUMMARY's ``lr.max_lr``, a
    form's committed rate where one committed) and the configured one beside it (``optim.configured_lr.*``), and each
    group's decay as trained (``optim.schedule.groups.<group>.decay_start`` and ``.anneal_strategy``: RunDir.SUMMARY's
    ``lr.schedule``, the shared one-cycle's values where the group has none of its own, so that runs compare)."""
    out = run_hparams(cfg)
    lr = summary.get("lr") or {}
    for group, value in (lr.get("max_lr") or {}).items():
        out[f"optim.configured_lr.{group}"] = out.get(f"optim.lr.{group}")
        out[f"optim.lr.{group}"] = float(value)
    for group, schedule in (lr.get("schedule") or {}).items():
        if schedule.get("decay_start") is not None:
            out[f"optim.schedule.groups.{group}.decay_start"] = float(schedule["decay_start"])
        if schedule.get("shape") is not None:
            out[f"optim.schedule.groups.{group}.anneal_strategy"] = str(schedule["shape"])
    return out


def log_final(cfg: DictConfig, run_dir: str, rank: int, summary: Mapping[str, Any]) -> None:
    """The held-out metrics and the HParams row of a completed run (see the module); nothing on other
    ranks, with ``trainer.tensorboard: false``, or without held-out metrics."""
    evaluation = summary.get("eval") or {}
    if rank != 0 or not cfg.trainer.tensorboard or not evaluation:
        return
    from torch.utils.tensorboard import SummaryWriter

    step = int(summary["steps"])
    ne = {t: m.get("ne") for t, m in evaluation.items()}
    mean = sum(ne.values()) / len(ne) if all(_number(v) is not None for v in ne.values()) else None
    with SummaryWriter(log_dir=RunDir(run_dir).path(RunDir.TENSORBOARD)) as writer:
        for task, m in evaluation.items():
            for metric in HELD_OUT_METRICS:
                if _number(m.get(metric)) is not None:
                    writer.add_scalar(f"heldout/{metric}/{task}", float(m[metric]), global_step=step)
        if mean is not None:
            writer.add_scalar("heldout/ne/mean", mean, global_step=step)
            metrics = {"hparam/heldout_ne_mean": mean, **{f"hparam/heldout_ne/{t}": float(v) for t, v in ne.items()}}
            writer.add_hparams(trained_hparams(cfg, summary), metrics, run_name=".", global_step=step)


def log_curves(cfg: DictConfig, run_dir: str, rank: int, name: str, curves: Mapping[str, Any]) -> None:
    """Curves written once, beside the run's scalars, in ``tensorboard/<name>/`` (its own event files: a resumed
    attempt's purge of the training steps never touches them): ``curves`` maps a tag to its values, one per
    step of the curve (None: left out). Rank 0 with ``trainer.tensorboard`` only. The range test on the replicas
    writes its sweeps so (``range_test/<axis>/loss``, ``.../smoothed``, ``.../log10_multiplier``, per replica)."""
    if rank != 0 or not cfg.trainer.tensorboard:
        return
    from torch.utils.tensorboard import SummaryWriter

    with SummaryWriter(log_dir=os.path.join(RunDir(run_dir).path(RunDir.TENSORBOARD), name)) as writer:
        for tag, values in curves.items():
            for step, value in enumerate(values):
                if value is not None:
                    writer.add_scalar(tag, float(value), global_step=step)


def build_tensorboard(cfg: DictConfig, run_dir: str, rank: int, start_step: int = 0) -> NullTensorBoard:
    """The run's TensorBoard writer: a :class:`TensorBoardWriter` into ``<run_dir>/tensorboard/`` on
    rank 0 when ``trainer.tensorboard`` is true (the default), else a :class:`NullTensorBoard`.
    ``start_step``: the steps already done, i.e. the step of the checkpoint a resumed run continues
    from (0: a fresh run); what an earlier attempt wrote after it is purged."""
    if rank != 0 or not cfg.trainer.tensorboard:
        return NullTensorBoard()
    return TensorBoardWriter(RunDir(run_dir).path(RunDir.TENSORBOARD), int(start_step))


__all__ = ["NullTensorBoard", "TensorBoardWriter", "build_tensorboard", "log_curves", "log_final", "run_hparams",
           "trained_hparams"]
