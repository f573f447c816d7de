"""Scoring, step 1 of the offline evaluation, and the one scoring function of the project.

:func:`predict_batches` runs a model's forward over batches on the model's device and returns the
predicted probabilities, labels and padding mask on the host, in stream order: the trainer's
held-out pass and HDET's probe rows (through :class:`~recsys_hdet.models.ranker.TrainingRanker`'s
``logits``) and :func:`score_run` (a plain :class:`~recsys_hdet.models.ranker.MultiTaskRanker`)
all score through it.

:func:`score_run` loads a finished run's config and ``checkpoint/`` into the same TorchRec model
(any layout: DCP reshards), scores the chosen days on ``nproc`` local workers and returns the
predicted probabilities in the days' file order.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence

import numpy as np
import torch
from omegaconf import OmegaConf

from recsys_hdet.components.dataset import DatasetMeta, RowHoldout
from recsys_hdet.evaluation.segments import RunInfo
from recsys_hdet.run_dir import RunDir


@torch.no_grad()
def predict_batches(logits: Callable[[torch.Tensor, Any], torch.Tensor], batches: Iterable[Any],
                    device: torch.device, extras: Sequence[str] = ()) -> Dict[str, torch.Tensor]:
    """``logits(dense, sparse)`` over ``batches`` (each moved to ``device`` here), in eval mode when
    ``logits`` is a module. Returns, on the host and concatenated in stream order, padding rows
    included: ``logits``, ``probs`` and ``labels`` [rows, tasks], ``mask`` [rows] (False on padding),
    and each of ``extras`` (columns the batches carry)."""
    module = logits if isinstance(logits, torch.nn.Module) else getattr(logits, "__self__", None)
    was_training = bool(getattr(module, "training", False))
    if isinstance(module, torch.nn.Module):
        module.eval()
    out: Dict[str, List[torch.Tensor]] = {"logits": [], "labels": [], "mask": [], **{c: [] for c in extras}}
    try:
        for batch in batches:
            batch = batch.to(device, non_blocking=True)
            out["logits"].append(logits(batch.dense, batch.sparse).cpu())
            out["labels"].append(batch.labels.cpu())
            out["mask"].append(batch.mask.cpu())
            for c in extras:
                out[c].append(batch.extras[c].cpu())
    finally:
        if isinstance(module, torch.nn.Module):
            module.train(was_training)
    result = {k: torch.cat(v) if v else torch.empty(0) for k, v in out.items()}
    result["probs"] = torch.sigmoid(result["logits"])
    return result


@torch.no_grad()
def score_held_out(logits: Callable[[torch.Tensor, Any], torch.Tensor], stream: Any, tasks: Sequence[str],
                   device: torch.device):
    """The trainer's held-out pass: every rank scores its part of ``stream`` (a padded stream over the
    held-out rows, with the oracle columns where the data has them); rank 0 gathers the scores and returns
    (metrics per task, oracle metrics per task or {}), the other ranks ({}, {})."""
    import torch.distributed as dist

    from recsys_hdet.evaluation.task_metrics import oracle_metrics, task_metrics

    extras = list(stream.extras)
    scored = predict_batches(logits, stream, device, extras)
    mask = scored["mask"]
    local = (scored["probs"][mask], scored["labels"][mask],
             torch.stack([scored[c] for c in extras], dim=1)[mask] if extras else None)
    rank, world = dist.get_rank(), dist.get_world_size()
    gathered: Optional[List[Any]] = [None] * world if rank == 0 else None
    dist.gather_object(local, gathered, dst=0)
    if rank != 0:
        return {}, {}
    all_p = torch.cat([g[0] for g in gathered])
    all_y = torch.cat([g[1] for g in gathered])
    metrics = {t: task_metrics(all_p[:, i], all_y[:, i]) for i, t in enumerate(tasks)}
    oracle = {}
    if extras:
        all_o = torch.cat([g[2] for g in gathered])
        oracle = {t: oracle_metrics(all_o[:, i], all_y[:, i]) for i, t in enumerate(tasks)}
    return metrics, oracle


def final_temperature(run_dir: str, default: float) -> float:
    """The attention temperature the run ended with: HDET's last base when it explored it (the
    value lives in the module, not in the checkpoint), else the configured one."""
    records = RunDir(run_dir).syncs()
    last = records[-1] if records else None
    if last and "temperature" in last.get("hparams", {}):
        return float(last["hparams"]["temperature"]["next_base"])
    return default


def _score_worker(cfg_dict: Dict[str, Any], checkpoint: str, days: List[str], batch_size: int,
                  temperature: float, out_path: str) -> int:
    from recsys_hdet.distributed import quiet_library_warnings

    quiet_library_warnings()
    import torch.distributed as dist

    from recsys_hdet.components.model_checkpoint import META_FILE, load_model
    from recsys_hdet.components.dataset import DenseNormalization
    from recsys_hdet.components.dataloader import ParquetBatchStream
    from recsys_hdet.components.hparam_bindings import set_temperature
    from recsys_hdet.components.optimizer import fused_params
    from recsys_hdet.distributed import init_process_groups, shard_model, threads_per_worker
    from recsys_hdet.models.ranker import build_model

    cfg = OmegaConf.create(cfg_dict)
    world = int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(threads_per_worker(None, int(os.environ.get("LOCAL_WORLD_SIZE", world))))
    pgs = init_process_groups(world)  # one sharding group: the tables sharded over all workers
    try:
        meta = DatasetMeta.load(cfg.data.root)
        model = shard_model(build_model(cfg, meta), pgs, fused_params(cfg.optim.embedding, 0.0),
                            list(cfg.model.sharding_types))
        load_model(model, checkpoint)
        set_temperature(model, temperature)
        model.eval()
        # The dense inputs are standardized as in training (the training days' statistics).
        normalization = DenseNormalization.from_checkpoint(checkpoint)
        if normalization is None:
            raise RuntimeError(f"{os.path.join(checkpoint, META_FILE)}: no dense_normalization (a checkpoint from before the "
                               "format-2 data sets): retrain the run")
        stream = ParquetBatchStream(meta, days, batch_size, pgs.layout.rank, world, 0,
                                    shuffle_within_day=False, pad_last=True, normalization=normalization,
                                    holdout=RowHoldout.from_config(cfg.data), part="holdout")
        # global batch b, rank r: rows [b*G + r*B, b*G + (r+1)*B) of the day
        probs = predict_batches(model, stream, pgs.device)["probs"].float()
        local = probs.view(-1, batch_size, probs.shape[-1]) if len(probs) else torch.empty(0)
        gathered: Optional[List[Any]] = [None] * world if pgs.layout.rank == 0 else None
        dist.gather_object(local, gathered, dst=0)
        if pgs.layout.rank == 0:
            # [rank][batch][row][task] -> day order: batch-major, then rank, then row; padding is at the
            # end of each day's last global batch, so dropping it keeps the day's row count.
            stacked = torch.stack(gathered)  # type: ignore[arg-type]
            per_batch = stacked.permute(1, 0, 2, 3).reshape(stacked.shape[1], -1, stacked.shape[-1])
            parts, b = [], 0
            for day in days:
                n = stream.batches_in_day(day)
                rows = stream.rows_in_day(day)
                parts.append(per_batch[b:b + n].reshape(-1, per_batch.shape[-1])[:rows])
                b += n
            np.save(out_path, torch.cat(parts).numpy())
        dist.barrier()
        return 0
    finally:
        dist.destroy_process_group()


def score_run(run: RunInfo, batch_size: int = 4096, nproc: int = 1, scratch: Optional[str] = None) -> np.ndarray:
    """Predicted probabilities [rows, tasks] for ``run.eval_days``, in the days' file order (with a
    ``data.holdout``, of their held-out rows). ``scratch``: where the workers' temporary output goes
    (default: the run directory; pass another for a run directory that must stay untouched)."""
    from recsys_hdet.distributed import launch

    cfg_dict = OmegaConf.to_container(run.cfg, resolve=True)
    cfg_dict["data"]["root"] = run.meta.root  # type: ignore[index]
    temperature = final_temperature(run.run_dir, float(run.cfg.model.attention_temperature))
    with tempfile.TemporaryDirectory(dir=scratch or run.run_dir, prefix=".eval-") as tmp:
        out_path = os.path.join(tmp, "probs.npy")
        code = launch(_score_worker, (cfg_dict, run.checkpoint, run.eval_days, batch_size, temperature, out_path), nproc)
        if code != 0 or not os.path.isfile(out_path):
            raise RuntimeError(f"scoring {run.run_dir} failed (worker exit status {code})")
        return np.load(out_path)


