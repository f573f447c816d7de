"""``python -m recsys_hdet.evaluate run_dir=DIR`` (one run) or ``runs=[DIR,...] out=DIR2`` (comparison).

One run: loads the run's config and ``checkpoint/``, scores the held-out day(s) (or ``days=[...]``)
and writes into the run directory ``predictions.parquet`` (one row per impression: ids, segments,
each task's label, prediction and, on synthetic data, the true probability), ``eval.json``
(metrics per task, per segment and on the random-exposure slice, reliability curves; see
:mod:`recsys_hdet.evaluation.segments`) and
``report.html`` (see :mod:`recsys_hdet.evaluation.report`). Each file is written to a temporary name and
renamed, so a failed evaluation leaves the run directory as it was.

Comparison: writes one side-by-side ``report.html`` into its own directory ``out`` (default
``outputs/comparisons/<YYYY-MM-DD_HH-MM-SS>``; never a run's directory). Each run is evaluated on its own held-out
days exactly as ``run_dir=`` would (reusing an ``eval.json`` that scored the same days unless
``rescore=true``); a run that ``days=`` scores on other days than its own is scored into
``out/runs/<n>-<run>/`` (eval.json, predictions.parquet), its run directory left as it is, so comparing a
registry version with its parent on the version's day never rewrites the parent's evaluation.

Exit status 2 for a directory or setting that cannot be evaluated, with a message naming it.
"""

from __future__ import annotations

import os
import sys
from typing import List, Optional, Sequence

from omegaconf import DictConfig
from data_tools.exit_status import ExitStatus



def _shown(m: dict, key: str, digits: int = 4) -> str:
    """A metric for the console, with its 95% interval where eval.json has one; '-' when undefined (one class)."""
    value = m.get(key)
    if value is None:
        return "-"
    low_high = (m.get("interval") or {}).get(key)
    ci = f" [{low_high[0]:.{digits}f}, {low_high[1]:.{digits}f}]" if low_high and None not in low_high else ""
    return f"{value:.{digits}f}{ci}"


def evaluate_run(run_dir: str, days: Optional[Sequence[str]] = None, data_root: Optional[str] = None,
                 batch_size: int = 4096, nproc: int = 1, rescore: bool = True, into: Optional[str] = None) -> dict:
    """Evaluates one run directory; returns eval.json's content. ``into``: another directory for eval.json
    and predictions.parquet (no report.html), the run directory then left untouched (a comparison's)."""
    from data_tools.fileio import write_json_atomic
    from recsys_hdet.evaluation import evaluate_frame, load_run, predictions_frame, score_run
    from recsys_hdet.evaluation.report import render_run, write_report
    from recsys_hdet.evaluation.run_artifacts import RunArtifacts
    from recsys_hdet.run_dir import RunDir

    run = load_run(run_dir, days, data_root)
    target = RunDir(into) if into else run.files
    eval_path, pred_path = target.path(RunDir.EVAL), target.path(RunDir.PREDICTIONS)
    report_path = None if into else run.files.path(RunDir.REPORT)
    if not rescore and os.path.isfile(eval_path) and os.path.isfile(pred_path):
        previous = target.evaluation()
        if previous.get("days") == run.eval_days:
            print(f"{run.run_dir}: {eval_path} already scored days {run.eval_days}; reused (rescore=true to redo)")
            if report_path and not os.path.isfile(report_path):
                write_report(report_path, render_run(RunArtifacts(run.run_dir)))
            return previous
    print(f"{run.run_dir}: scoring days {run.eval_days} with {nproc} worker(s)", flush=True)
    probs = score_run(run, batch_size=batch_size, nproc=nproc, scratch=into)
    df = predictions_frame(run, probs)
    import datetime as dt

    from recsys_hdet.components.model_checkpoint import read_meta

    steps = read_meta(run.checkpoint).get("steps")
    result = {"run_dir": run.run_dir, "days": run.eval_days, "experiment": run.summary.get("experiment"),
              "checkpoint": run.checkpoint, "checkpoint_steps": steps, "commit": run.summary.get("code"),
              "evaluated_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              **evaluate_frame(df, list(run.cfg.tasks))}
    # All of them are written to temporary names first and renamed together at the end, so a
    # failure (e.g. in rendering) leaves the directory as it was.
    written = [pred_path, eval_path] + ([report_path] if report_path else [])
    try:
        df.write_parquet(pred_path + ".new")
        write_json_atomic(eval_path + ".new", result)
        if report_path:
            artifacts = RunArtifacts(run.run_dir)
            artifacts.evaluation = result
            write_report(report_path + ".new", render_run(artifacts))
    except BaseException:
        for tmp in written:
            if os.path.exists(tmp + ".new"):
                os.remove(tmp + ".new")
        raise
    for path in written:
        os.replace(path + ".new", path)
    if not into:  # the run's own evaluation: into its MLflow run, when it has one (recsys_hdet/tracking.py)
        from recsys_hdet.tracking import log_evaluation

        log_evaluation(run.run_dir, result, written)
    for task, m in result["eval"].items():
        o = result.get("oracle", {}).get(task)
        print(f"  {task:>12}: AUC {_shown(m, 'auc')}  NE {_shown(m, 'ne')}" + (f"  (oracle {_shown(o, 'ne')})" if o else "")
              + f"  logloss {_shown(m, 'logloss')}  calibration {_shown(m, 'calibration', 3)}"
              + f"  positives {m.get('positives')} of {m['count']}")
    rnd = result["random_exposure"]
    if rnd["status"] == "present":
        print(f"  random exposure (is_rand = 1, the unbiased estimate), n={rnd['rows']}:")
        for task, m in rnd["eval"].items():
            print(f"  {task:>12}: AUC {_shown(m, 'auc')}  NE {_shown(m, 'ne')}  calibration "
                  f"{_shown(m, 'calibration', 3)}  positives {m.get('positives')}")
    else:
        print(f"  random exposure slice absent: {rnd['reason']}")
    print(f"  wrote {', '.join(os.path.basename(p) for p in written)} in {os.path.dirname(eval_path)}", flush=True)
    if report_path:
        print(f"report: {report_path}", flush=True)
    return result


def default_comparison_dir() -> str:
    """A comparison's directory when ``out=`` is not given: ``outputs/comparisons/<YYYY-MM-DD_HH-MM-SS>`` (beside
    the runs' own ``outputs/<experiment_name>/<YYYY-MM-DD_HH-MM-SS>``: :data:`recsys_hdet.run_dir.TIME_FORMAT`), a
    new one per comparison."""
    import datetime as dt

    from recsys_hdet.run_dir import TIME_FORMAT

    return os.path.join("outputs", "comparisons", dt.datetime.now().strftime(TIME_FORMAT))


def compare_runs(run_dirs: Sequence[str], out: Optional[str] = None, labels: Optional[Sequence[str]] = None,
                 days: Optional[Sequence[str]] = None, data_root: Optional[str] = None, batch_size: int = 4096,
                 nproc: int = 1, rescore: bool = False) -> str:
    """The side-by-side report of ``run_dirs`` in ``out`` (see the module's docstring); returns its path.
    EvaluationError when ``out`` is one of the runs' directories or holds a run."""
    from recsys_hdet.evaluation import EvaluationError, load_run
    from recsys_hdet.evaluation.report import render_comparison, write_report
    from recsys_hdet.evaluation.run_artifacts import RunArtifacts
    from recsys_hdet.run_dir import RunDir

    if labels is not None and len(labels) != len(run_dirs):
        raise EvaluationError(f"labels: {len(labels)} names for {len(run_dirs)} runs")
    out = os.path.abspath(out or default_comparison_dir())
    dirs = [os.path.abspath(str(d)) for d in run_dirs]
    for d in dirs:
        if os.path.realpath(d) == os.path.realpath(out):
            raise EvaluationError(f"out={out}: the directory of the run {d}; a comparison writes its own report.html "
                                  "and never over a run's files: choose another out=DIR")
    held = [n for n in (RunDir.SUMMARY, RunDir.EVAL) if os.path.isfile(os.path.join(out, n))]
    if held:
        raise EvaluationError(f"out={out}: holds a run's {held[0]}; a comparison never writes over a run's files: "
                              "choose another out=DIR")
    runs = []
    for i, d in enumerate(dirs):
        own_days = load_run(d, None, data_root).eval_days
        evaluation_dir = None
        if days and [str(x) for x in days] != own_days:  # not the run's own evaluation: kept out of its directory
            evaluation_dir = os.path.join(out, "runs", f"{i + 1}-{os.path.basename(d.rstrip('/'))}")
            os.makedirs(evaluation_dir, exist_ok=True)
            evaluate_run(d, days, data_root, batch_size, nproc, rescore, into=evaluation_dir)
        else:
            evaluate_run(d, None, data_root, batch_size, nproc, rescore)
        runs.append(RunArtifacts(d, labels[i] if labels else None, evaluation_dir))
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
            compare_runs(runs, str(cfg.out) if cfg.out else None, list(cfg.labels) if cfg.labels else None, **common)
    except EvaluationError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(ExitStatus.USAGE)

