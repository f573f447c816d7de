"""The serving artifact: ``python -m recsys_hdet.export run_dir=DIR out=MODEL_DIR`` writes

- ``model.pt2``: the ranker as a ``torch.export`` program (:mod:`recsys_hdet.serving.program`): processed
  rows in, one probability per task out; ``torch.export.load`` needs torch alone;
- ``vocab/<feature>.parquet``: the id vocabularies the model's tables were trained with (DATA_CONTRACT.md's
  ``raw_id``, ``row``, ``count``; rows past the model's table cut off), to map raw ids to rows;
- ``raw_model.pt2`` (``raw_program=true``): the same ranker taking a serving request's raw ids and values
  (:mod:`recsys_hdet.serving.raw_program`); an option because it holds the tables a second time;
- ``manifest.json``: what the program takes and returns (tasks, features in input order, table sizes,
  the dense standardization, the string categoricals' codes; ``raw_program``: the raw program's file and
  its request's inputs) and where it came from (commit, run, checkpoint, its steps, training and held-out
  days, data set, export time, torch version); ``files``: each file's size and sha256.

Written into ``MODEL_DIR.tmp-*`` and renamed into place: a failed export leaves nothing.
"""

from __future__ import annotations

import datetime as dt
import os
from typing import Any, Dict, Optional

import polars as pl
import torch

# vocab/<feature>.parquet as in a processed data set: predict converts raw logs with the model
# directory as the data set whose vocabularies it extends
from data_tools.fileio import staged_directory, write_manifest
from data_tools.vocab import VOCAB_DIR, vocab_path
from recsys_hdet.serving.manifest import (FORMAT, FORMAT_VERSION, MANIFEST_FILE, PROGRAM_FILE, RAW_PROGRAM_FILE,
                                          ArtifactError, file_record)

def export_run(run_dir: str, out: str, data_root: Optional[str] = None, overwrite: bool = False,
               raw_program: bool = False) -> Dict[str, Any]:
    """Exports a completed run's ``checkpoint/`` into ``out``; returns the manifest. ``raw_program``: also
    ``raw_model.pt2``, the program that reads raw requests (ArtifactError when the model has a feature it
    cannot read raw, e.g. an id feature without a vocabulary)."""
    import torch.distributed.checkpoint as dcp

    from recsys_hdet.components.dataset import DenseNormalization
    from recsys_hdet.components.hparam_bindings import set_temperature
    from recsys_hdet.components.model_checkpoint import META_FILE, read_meta
    from recsys_hdet.evaluation import EvaluationError, load_run
    from recsys_hdet.evaluation.scoring import final_temperature
    from recsys_hdet.models.ranker import build_model
    from recsys_hdet.provenance import code_version
    from recsys_hdet.serving.program import ServingRanker, export_program

    out = os.path.abspath(out)
    if os.path.exists(out) and not overwrite:
        raise ArtifactError(f"out={out}: already exists (overwrite=true replaces it)")
    try:
        run = load_run(run_dir, None, data_root)
    except EvaluationError as e:
        raise ArtifactError(str(e)) from None
    ckpt_meta = read_meta(run.checkpoint)
    normalization = DenseNormalization.from_checkpoint(run.checkpoint)
    if normalization is None:
        raise ArtifactError(f"{os.path.join(run.checkpoint, META_FILE)}: no dense_normalization (a checkpoint from before the "
                            "format-2 data sets): retrain the run")
    tables = ckpt_meta.get("model_inputs", {}).get("sparse") or {n: int(s["vocab"]) for n, s in run.meta.sparse.items()}
    meta = run.meta
    if any(int(meta.sparse[n]["vocab"]) != tables.get(n) for n in meta.sparse):
        # The data set's tables grew since the run trained (days appended): build the model the run trained.
        meta.sparse = {n: {**s, "vocab": int(tables[n])} for n, s in meta.sparse.items()}
    ranker = build_model(run.cfg, meta, device="cpu")
    state = {"model": ranker.state_dict()}
    dcp.load(state, checkpoint_id=run.checkpoint)  # no process group: DCP gathers every shard into whole tables
    ranker.load_state_dict(state["model"])
    temperature = final_temperature(run.run_dir, float(run.cfg.model.attention_temperature))
    set_temperature(ranker, temperature)
    module = ServingRanker(ranker, meta.single_features, meta.multi_features, normalization.mean, normalization.std)
    program = export_program(module)
    cut = {name: pl.read_parquet(vocab_path(meta.root, name)).filter(pl.col("row") < tables[name])
           for name in meta.sparse if os.path.isfile(vocab_path(meta.root, name))}
    raw, raw_inputs = _raw_program(module, cut, tables, normalization.features, meta.root) if raw_program \
        else (None, None)

    with staged_directory(out, replace=overwrite) as tmp:
        torch.export.save(program, os.path.join(tmp, PROGRAM_FILE))
        if raw is not None:
            torch.export.save(raw, os.path.join(tmp, RAW_PROGRAM_FILE))
        os.makedirs(os.path.join(tmp, VOCAB_DIR))
        vocabularies = {}
        for name, vocab in cut.items():
            vocab.write_parquet(vocab_path(tmp, name))
            vocabularies[name] = f"{VOCAB_DIR}/{name}.parquet"
        manifest = {
            "format": FORMAT, "format_version": FORMAT_VERSION, "program": PROGRAM_FILE,
            "inputs": "dense [B, D] float32 (NaN = missing), ids [B, S] int64, [values [N] int64 per multi-valued "
                      "feature], [offsets [B+1] int64 per multi-valued feature]; output [B, T] float32 probabilities",
            "tasks": list(run.cfg.tasks),
            "dense": list(normalization.features),
            "single_features": meta.single_features,
            "multi_features": meta.multi_features,
            "tables": {n: int(tables[n]) for n in meta.sparse},
            "vocabularies": vocabularies,
            "string_vocabs": meta.source.get("string_vocabs", {}),
            "dense_normalization": normalization.to_dict(),
            "attention_temperature": temperature,
            "commit": run.summary.get("code", "unknown (the run predates recorded commits)"),
            "exported_by": code_version(),
            "run_dir": run.run_dir,
            "experiment": run.summary.get("experiment"),
            "checkpoint": run.checkpoint,
            "checkpoint_steps": ckpt_meta.get("steps"),
            "train_days": list(run.train_days),
            "eval_days": list(run.eval_days),
            "data_root": meta.root,
            "exported_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "torch_version": torch.__version__,
        }
        if raw is not None:
            manifest["raw_program"] = {"file": RAW_PROGRAM_FILE, "call": "program(request): request a dict of "
                                       "these tensors, B rows; output [B, T] float32 probabilities",
                                       "inputs": raw_inputs}
        manifest["files"] = {name: file_record(os.path.join(tmp, name))  # each checked when the model is loaded
                             for name in (PROGRAM_FILE, *([RAW_PROGRAM_FILE] if raw is not None else []),
                                          *vocabularies.values())}
        write_manifest(tmp, MANIFEST_FILE, manifest)
    return manifest


def _raw_program(module, vocabularies: Dict[str, pl.DataFrame], tables: Dict[str, int], dense, root: str):
    """The raw-request program of the serving ranker ``module`` and its inputs (name -> dtype, shape,
    meaning); ArtifactError when the model has an id feature without a vocabulary (its raw ids have no rows)
    or a feature the program has no raw form for."""
    from data_tools.vocab import ID_FEATURES
    from recsys_hdet.serving.raw_program import RawServingRanker, export_raw_program

    features = module.single_features + module.multi_features
    lacking = [n for n in ID_FEATURES if n in features and n not in vocabularies]
    if lacking:
        raise ArtifactError(f"{vocab_path(root, lacking[0])}: missing; raw_program=true maps raw ids through the "
                            "data set's vocabularies (convert it again to write them)")
    arrays = {n: (v["raw_id"].to_numpy(), v["row"].to_numpy()) for n, v in vocabularies.items()}
    try:
        raw = RawServingRanker(module, arrays, tables, dense)
    except ValueError as e:
        raise ArtifactError(f"raw_program=true: {e}") from None
    return export_raw_program(raw), raw.inputs
