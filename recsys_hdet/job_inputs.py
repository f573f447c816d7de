"""What a training job needs before its workers start: the processed data set (generated on first use
when the config has a generator, then validated, the day split and pass length checked) and a warm-start
checkpoint that fits the data set's model inputs. Errors are ConfigError or DataError, naming the key
or file: the command exits 2 with nothing written.
"""

from __future__ import annotations

import os

from omegaconf import DictConfig

from data_tools.fileio import abs_path
from recsys_hdet.config import ConfigError
from recsys_hdet.config_values import DayRead, plain
from recsys_hdet.hdet.form import hdet_form


def prepare_data(cfg: DictConfig) -> str:
    """Makes sure the processed data set exists (generating the synthetic one if configured) and is valid."""
    from data_tools.prepare import ensure_dataset
    from data_tools.validate import validate_processed

    root = abs_path(cfg.data.root)
    if cfg.data.generator is not None:
        ensure_dataset(root, plain(cfg.data.generator), plain(cfg.data.min_count))
    validate_processed(root)
    check_days_and_steps(cfg, root)
    return root


def check_days_and_steps(cfg: DictConfig, root: str) -> None:
    """The day split and the pass length, checked before workers start (same arithmetic as theirs)."""
    from recsys_hdet.components.dataset import DatasetMeta, RowHoldout, day_rows, split_for

    meta = DatasetMeta.load(root)
    exposure = str(cfg.data.train_exposure)
    try:
        if cfg.data.read == DayRead.own_row_groups:
            meta.require_row_groups()
        train_days, _ = split_for(meta, cfg.data)
        # "standard": the rows without random exposure; data.holdout: the rows not held out
        per_day = day_rows(meta, train_days, exposure, RowHoldout.from_config(cfg.data))
    except ValueError as e:
        raise ConfigError(str(e)) from None
    from recsys_hdet.config import probe_rows

    global_batch = int(cfg.data.batch_size) * int(cfg.trainer.nproc)
    rows = sum(per_day.values())
    kind = " standard-exposure" if exposure == "standard" else ""
    if rows < global_batch:
        raise ConfigError(f"config data.batch_size={cfg.data.batch_size} x trainer.nproc={cfg.trainer.nproc}: "
                          f"the training days of {root} hold {rows}{kind} rows, less than one global batch")
    reserved = probe_rows(cfg)
    _check_sweep_fits_the_pass(cfg, per_day, global_batch, reserved)
    smallest = min(per_day.values())
    if reserved and smallest - reserved < global_batch:
        raise ConfigError(f"config hdet.probe_rows={reserved}: the smallest training day of {root} has {smallest}"
                          f"{kind} rows; with the probe rows reserved it cannot fill one global batch of {global_batch}")


def stale_warm_start(path: str, data_root: str) -> str:
    """Why the checkpoint at ``path`` does not fit the data set's model inputs ('' if it does, or if
    it does not record them).

    Tables that only grow (every feature kept, each table at least as large as recorded, the same
    dense features: the data set's vocabularies gained ids since) fit: the warm start loads the
    checkpoint's rows into the first rows of each table and the new rows start fresh
    (recsys_hdet.components.checkpoint.load_model); one line names the grown tables. A feature
    added or removed, a table that shrinks, or other dense features do not."""
    from recsys_hdet.components.dataset import DatasetMeta, model_inputs
    from recsys_hdet.components.model_checkpoint import read_meta

    try:
        recorded = read_meta(path).get("model_inputs")
    except (OSError, ValueError):
        return ""
    if recorded is None:
        return "it records no model inputs: trained before they were recorded"
    now = model_inputs(DatasetMeta.load(data_root))
    diff = sorted(k for k in set(now["sparse"]) | set(recorded["sparse"])
                  if now["sparse"].get(k) != recorded["sparse"].get(k))
    tables = []  # what a warm start cannot load: a table added, removed or smaller than recorded
    for k in diff:
        if k not in recorded["sparse"]:
            tables.append(f"{k} added")
        elif k not in now["sparse"]:
            tables.append(f"{k} removed")
        elif now["sparse"][k] < recorded["sparse"][k]:
            tables.append(f"{k} shrinks {recorded['sparse'][k]} -> {now['sparse'][k]} rows")
    why = ([f"embedding tables differ ({', '.join(tables)}; a warm start can only grow a table)"] if tables else []) + \
          (["dense features differ"] if now["dense"] != recorded["dense"] else [])
    if why:
        return "; ".join(why)
    if diff and os.environ.get("RANK", "0") == "0":
        grown = ", ".join(f"{k} {recorded['sparse'][k]} -> {now['sparse'][k]} "
                          f"(+{now['sparse'][k] - recorded['sparse'][k]} rows)" for k in diff)
        print(f"warm start {path}: the data set's vocabularies grew since it was trained; embedding tables grow: "
              f"{grown}", flush=True)
    return ""


def _check_sweep_fits_the_pass(cfg: DictConfig, per_day: dict, global_batch: int, reserved: int) -> None:
    """The range test on the replicas sweeps on the pass's first batches: a pass shorter than the sweep is refused
    here, before any worker starts (the loader's arithmetic; a day dealt by row groups is counted by rows)."""
    h = cfg.hdet
    if hdet_form(h) != "range_test":
        return
    steps = sum(max(rows - reserved, 0) // global_batch for rows in per_day.values())
    if steps < int(h.range_test.steps):
        raise ConfigError(f"config hdet.range_test.steps={h.range_test.steps}: the pass has only {steps} steps of "
                          f"{global_batch} rows (data.batch_size={cfg.data.batch_size} x trainer.nproc="
                          f"{cfg.trainer.nproc}) and the sweep runs on its first batches: set hdet.range_test.steps "
                          f"<= {steps}, a smaller data.batch_size, or more training days")
