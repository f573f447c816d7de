"""``python -m recsys_hdet.evaluate run_dir=DIR`` (one run) or ``runs=[DIR,...] out=DIR2`` (comparison).

One run: loads the run's config and ``checkpoint/``, scores the held-out day(s) (or ``days=[...]``)
and writes into the run directory ``predictions.parquet`` (one row per impression: ids, segments,
each task's label, prediction and, on synthetic data, the true probability), ``eval.json``
(metrics per task, per segment and on the random-exposure slice, reliability curves; see
:mod:`recsys_hdet.evaluation.segments`) and
``report.html`` (see :mod:`recsys_hdet.evaluation.report`). Each file is written to a temporary name and
renamed, so a failed evaluation leaves the run directory as it was.

Comparison: evaluates every run as above (reusing an ``eval.json`` that scored the same days
unless ``rescore=true``) and writes one side-by-side ``report.html`` into ``out``.

Exit status 2 for a directory or setting that cannot be evaluated, with a message naming it.
"""

from __future__ import annotations

import os
import sys
from typing import List, Optional, Sequence

from omegaconf import DictConfig
from data_tools.exit_status import ExitStatus



def evaluate_run(run_dir: str, days: Optional[Sequence[str]] = None, data_root: Optional[str] = None,
                 batch_size: int = 4096, nproc: int = 1, rescore: bool = True) -> dict:
    """Evaluates one run directory; returns eval.json's content."""
    from data_tools.fileio import write_json_atomic
    from recsys_hdet.evaluation import evaluate_frame, load_run, predictions_frame, score_run
    from recsys_hdet.evaluation.report import render_run, write_report
    from recsys_hdet.evaluation.run_artifacts import RunArtifacts
    from recsys_hdet.run_dir import RunDir

    run = load_run(run_dir, days, data_root)
    eval_path, pred_path, report_path = (run.files.path(n) for n in (RunDir.EVAL, RunDir.PREDICTIONS, RunDir.REPORT))
    if not rescore and os.path.isfile(eval_path) and os.path.isfile(pred_path):
        previous = run.files.evaluation()
        if previous.get("days") == run.eval_days:
            print(f"{run.run_dir}: eval.json already scored days {run.eval_days}; reused (rescore=true to redo)")
            if not os.path.isfile(report_path):
                write_report(report_path, render_run(RunArtifacts(run.run_dir)))
            return previous
    print(f"{run.run_dir}: scoring days {run.eval_days} with {nproc} worker(s)", flush=True)
    probs = score_run(run, batch_size=batch_size, nproc=nproc)
    df = predictions_frame(run, probs)
    import datetime as dt

    from recsys_hdet.components.model_checkpoint import read_meta

    steps = read_meta(run.checkpoint).get("steps")
    result = {"run_dir": run.run_dir, "days": run.eval_days, "experiment": run.summary.get("experiment"),
              "checkpoint": run.checkpoint, "checkpoint_steps": steps, "commit": run.summary.get("code"),
              "evaluated_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              **evaluate_frame(df, list(run.cfg.tasks))}
    # All three are written to temporary names first and renamed together at the end, so a
    # failure (e.g. in rendering) leaves the run directory as it was.
    df.write_parquet(pred_path + ".tmp")
    write_json_atomic(eval_path + ".new", result)
    artifacts = RunArtifacts(run.run_dir)
    artifacts.evaluation = result
    try:
        write_report(report_path + ".new", render_run(artifacts))
    except Exception:
        for tmp in (pred_path + ".tmp", eval_path + ".new", report_path + ".new"):
            if os.path.exists(tmp):
                os.remove(tmp)
        raise
    os.replace(pred_path + ".tmp", pred_path)
    os.replace(eval_path + ".new", eval_path)
    os.replace(report_path + ".new", report_path)
    num = lambda x, d=4: "-" if x is None else f"{x:.{d}f}"  # None: undefined on a one-class slice
    for task, m in result["eval"].items():
        o = result.get("oracle", {}).get(task)
        print(f"  {task:>12}: AUC {num(m['auc'])}  NE {num(m['ne'])}" + (f"  (oracle {num(o['ne'])})" if o else "")
              + f"  logloss {num(m['logloss'])}  calibration {num(m['calibration'], 3)}  n={m['count']}")
    rnd = result["random_exposure"]
    if rnd["status"] == "present":
        print(f"  random exposure (is_rand = 1, the unbiased estimate), n={rnd['rows']}: "
              + "  ".join(f"{t} NE {num(m['ne'])} AUC {num(m['auc'])}" for t, m in rnd["eval"].items()))
    else:
        print(f"  random exposure slice absent: {rnd['reason']}")
    print(f"  wrote eval.json, predictions.parquet, report.html in {run.run_dir}", flush=True)
    print(f"report: {report_path}", flush=True)
    return result


def compare_runs(run_dirs: Sequence[str], out: str, labels: Optional[Sequence[str]] = None, **kwargs) -> str:
    from recsys_hdet.evaluation import EvaluationError
    from recsys_hdet.evaluation.report import render_comparison, write_report
    from recsys_hdet.evaluation.run_artifacts import RunArtifacts

    if labels is not None and len(labels) != len(run_dirs):
        raise EvaluationError(f"labels: {len(labels)} names for {len(run_dirs)} runs")
    for d in run_dirs:
        evaluate_run(d, **kwargs)
    runs = [RunArtifacts(os.path.abspath(d), labels[i] if labels else None) for i, d in enumerate(run_dirs)]
    seen = [r.label for r in runs]
    if len(set(seen)) < len(seen):  # same experiment twice (e.g. two seeds): tell them apart
        for r in runs:
            r.label = f"{r.label} ({os.path.basename(r.run_dir.rstrip('/'))})"
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "report.html")
    write_report(path, render_comparison(runs))
    print(f"wrote {path}", flush=True)
    return path


def main(cfg: DictConfig) -> None:
    """The command's body, given the composed ``conf/evaluate.yaml`` (``recsys_hdet/evaluate.py``
    is the Hydra entry point: Hydra finds ``conf/`` relative to it)."""
    from omegaconf import OmegaConf

    from recsys_hdet.config_values import ConfigError
    from recsys_hdet.evaluation import EvaluationError
    from recsys_hdet.distributed import quiet_library_warnings

    quiet_library_warnings()
    common = dict(days=list(cfg.days) if cfg.days else None, data_root=cfg.data.root,
                  batch_size=int(cfg.batch_size), nproc=int(cfg.nproc), rescore=bool(cfg.rescore))
    try:
        if (cfg.run_dir is None) == (cfg.runs is None):
            raise EvaluationError("give exactly one of run_dir=DIR or runs=[DIR,...]")
        try:
            OmegaConf.to_object(cfg)  # the schema's value checks (recsys_hdet/job_schema.py)
        except ConfigError as e:
            raise EvaluationError(str(e)) from None
        if cfg.run_dir is not None:
            evaluate_run(str(cfg.run_dir), **common)
        else:
            runs: List[str] = [str(r) for r in cfg.runs]
            if not runs:
                raise EvaluationError("runs=[]: no run directories given")
            compare_runs(runs, os.path.abspath(str(cfg.out or ".")), list(cfg.labels) if cfg.labels else None, **common)
    except EvaluationError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(ExitStatus.USAGE)

