"""``python -m studies.ablation``: the paper's ablation table, reproduced on the benchmark data set.

Runs each configuration of :data:`CONFIGS` (the paper's six presets, plus full HDET started from
a max_lr 10x too low and 10x too high) for several seeds, then writes ``ablation.json`` and
``ablation.md`` (mean and std over seeds of the one-pass train loss, held-out NE per task, the
diverged count and wall time, with the paper's numbers beside) and a comparison ``report.html``
over one seed's runs (``recsys_hdet.evaluate runs=[...]``).

Resumable: a run trains into ``<work>/runs/<config>/seed<k>.partial`` and is renamed to
``seed<k>`` once its ``RunDir.SUMMARY`` exists (completed or diverged: both are results); its line
then goes to ``<out>/results.jsonl`` (:mod:`studies.results`), from which the tables are
built (``--report-only``: from that file alone). A rerun skips runs with a line and starts crashed
ones (a leftover ``.partial``) from scratch. A crashed run does not stop the study; the pipeline
exits 1 at the end, naming it. The working directory is ``<out>`` itself, except for a study under
docs/, whose run directories go to the git-ignored ``outputs/studies/<study>`` (only the results
file and the reports are committed).

Every run is an ordinary ``python -m recsys_hdet.train +experiment=NAME seed=K``
job (``hdet.seed`` follows ``seed``): the warm-start checkpoint is trained on first use (one pre-training run shared by all
seeds: the paper's warm start is one fixed earlier model too).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import sys
from typing import Any, Dict, List, Optional, Sequence

from recsys_hdet.constants import PARAM_GROUPS as GROUPS, TASKS
from studies import lr_area
from studies.contract import StudyMismatch, outcome, paired_over_seeds
from studies.record import sync_records
from studies.reporting import machine_line, write_reports
from studies.results import ResultsError, StudyFiles, is_finished, run_name
from studies.runs import (AblationConfig, add_study_arguments, print_verification, run_dir, run_dir_finished, run_one,
                          verify)


CONFIGS: Sequence[AblationConfig] = (
    AblationConfig("baseline_low", "baseline_low", "DDP, alpha = 0, conservative LR", "0.0001", "3.294"),
    AblationConfig("baseline_high", "baseline_high", "DDP, alpha = 0, 9x LR", "0.0009", "4.169 (diverged)"),
    AblationConfig("warm_init", "warm_init", "noisy warm start only, alpha = 0, 9x LR", "0.0009", "4.674 (diverged)"),
    AblationConfig("hdet_no_autolr", "hdet_no_autolr", "spread + converge + warm init, 9x LR", "0.0009", "3.280"),
    AblationConfig("hdet_no_warm_init", "hdet_no_warm_init", "spread + converge + auto-LR, 9x LR", "0.0009", "3.281"),
    AblationConfig("hdet_full", "hdet_full", "spread + converge + auto-LR + warm init, 9x LR", "0.0009", "3.277"),
    AblationConfig("hdet_full_lr_low", "hdet_full_lr_low", "full HDET, max_lr 10x below hdet_full's", None, None),
    AblationConfig("hdet_full_lr_high", "hdet_full_lr_high", "full HDET, max_lr 10x above hdet_full's", None, None),
)


# ----------------------------------------------------------------------------------------------
# Running


# ----------------------------------------------------------------------------------------------
# Reading results


def base_vs_schedule(hdet_records: List[Dict[str, Any]], schedules: Dict[str, Any]) -> Dict[str, float]:
    """Per LR group: the controlled base relative to the schedule it would otherwise follow,
    as a geometric mean over the syncs where the controller owned the base.

    Below 1: the controller took that group's LR below its schedule (decayed it faster); the
    group with the smallest value decayed fastest. The ratio removes the schedule's own shape,
    which is the same for every group. Empty when the controller never ran (auto-LR off)."""
    out: Dict[str, float] = {}
    for g in GROUPS:
        key = f"lr/{g}"
        logs = [math.log(r["hparams"][key]["next_base"] / schedules[g](r["step"])[0])
                for r in hdet_records
                if key in r.get("hparams", {}) and r["hparams"][key].get("velocity", 0.0) != 0.0
                and r["hparams"][key]["next_base"] > 0]
        if logs:
            out[g] = math.exp(statistics.fmean(logs))
    return out


def _mean_std(values: List[float]) -> Dict[str, Optional[float]]:
    vals = [v for v in values if v is not None and math.isfinite(v)]
    if not vals:
        return {"mean": None, "std": None, "n": 0}
    return {"mean": statistics.fmean(vals), "std": statistics.stdev(vals) if len(vals) > 1 else 0.0, "n": len(vals)}


def collect(results: Dict[str, Dict[str, Any]], seeds: Sequence[int]) -> Dict[str, Any]:
    """ablation.json's content from the study's results lines."""
    rows = []
    for cfg in CONFIGS:
        runs = []
        for seed in seeds:
            name = run_name(cfg.name, seed)
            if not is_finished(results, name):
                continue
            r = results[name]
            runs.append({
                "seed": seed,
                "run": name,
                "status": r["status"],
                "outcome": outcome(r),  # a run that ends at the base rate has failed, whatever its status
                "steps": r["steps"],
                "train_loss": r["train_loss"]["avg"],
                "eval_ne": {t: r.get("eval", {}).get(t, {}).get("ne") for t in TASKS},
                "wall_seconds": r["wall_seconds"],
                "process_seconds": r.get("process_seconds"),
                "base_vs_schedule": base_vs_schedule(sync_records(r), lr_area.schedules(r, r["steps"]))
                if r["status"] == "completed" else {},
            })
        completed = [r for r in runs if r["outcome"] == "completed"]
        decay = {g: _mean_std([r["base_vs_schedule"].get(g) for r in completed]) for g in GROUPS}
        rows.append({
            "config": cfg.name,
            "preset": cfg.preset,
            "what": cfg.what,
            "paper": {"avg_lr": cfg.paper_avg_lr, "train_loss": cfg.paper_train_loss},
            "seeds_run": len(runs),
            "diverged": sum(r["status"] == "diverged" for r in runs),
            "failed": sum(r["outcome"] == "failed" for r in runs),
            # Means over completed runs only: a failed run's loss covers a partial pass or the base rate.
            "train_loss": _mean_std([r["train_loss"] for r in completed]),
            "eval_ne": {t: _mean_std([r["eval_ne"][t] for r in completed]) for t in TASKS},
            "wall_seconds": _mean_std([r["wall_seconds"] for r in runs]),
            "base_vs_schedule": {g: v for g, v in decay.items() if v["n"]},
            "runs": runs,
        })
    return {"seeds": list(seeds), "rows": rows, "hdet_form": hdet_form(results, seeds),
            "contrasts": contrasts(results, seeds)}


# (contender, reference, what the difference isolates): paired by seed on the mean held-out NE over the tasks.
CONTRASTS = (
    ("hdet_full", "hdet_no_autolr", "the controller (same spread, averaging, warm start and max LRs)"),
    ("hdet_no_autolr", "warm_init", "spread + averaging, controller off (same warm start and max LRs)"),
    ("hdet_full", "warm_init", "full HDET against plain (same warm start and max LRs)"),
    ("hdet_no_warm_init", "baseline_high", "HDET without the warm start against plain (same max LRs)"),
    ("warm_init", "baseline_high", "the noisy warm start, plain (same max LRs)"),
    ("baseline_high", "baseline_low", "9x max LRs against the conservative ones, plain"),
)


def contrasts(results: Dict[str, Dict[str, Any]], seeds: Sequence[int]) -> List[Dict[str, Any]]:
    """Each of :data:`CONTRASTS` as contender - reference over the seeds where both completed, with its 95%
    interval and the failures beside (:func:`studies.contract.paired_over_seeds`, which refuses different rows)."""
    out = []
    for contender, reference, what in CONTRASTS:
        runs = {name: {s: results[run_name(name, s)] for s in seeds if is_finished(results, run_name(name, s))}
                for name in (contender, reference)}
        if runs[contender] and runs[reference]:
            out.append({"contender": contender, "reference": reference, "what": what,
                        **paired_over_seeds(runs[contender], runs[reference])})
    return out


HDET_FORM_KEYS = ("space", "score", "signal", "alpha", "sync_every", "controller_start", "beta", "travel_decades")


def hdet_form(results: Dict[str, Dict[str, Any]], seeds: Sequence[int]) -> Optional[Dict[str, Any]]:
    """The controller the HDET configurations ran with, read from the first finished ``hdet_full``
    run's resolved config as its line records it (not from today's conf/, which may have moved since)."""
    for seed in seeds:
        r = results.get(run_name("hdet_full", seed))
        if r and r.get("hdet"):
            h = r["hdet"]["config"]
            return {k: h.get(k) for k in HDET_FORM_KEYS}
    return None


def previous_table(path: str) -> List[str]:
    """The main table of an earlier ablation report (its first markdown table), verbatim."""
    with open(path) as fh:
        lines = fh.read().splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith("| configuration |")), None)
    if start is None:
        raise ValueError(f"{path}: no ablation table (a line starting '| configuration |') found")
    end = start
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    return lines[start:end]


# ----------------------------------------------------------------------------------------------
# Writing


def _fmt(ms: Dict[str, Optional[float]], digits: int = 4) -> str:
    if ms["mean"] is None:
        return "-"
    return f"{ms['mean']:.{digits}f} ± {ms['std']:.{digits}f}"


def render_markdown(result: Dict[str, Any], command: str, machine: str, report: Optional[str],
                    previous: Optional[str] = None) -> str:
    seeds = result["seeds"]
    form = result.get("hdet_form")
    lines = [
        "# HDET ablation on the benchmark data set",
        "",
        f"Produced by `{command}` on {machine}. Seeds {', '.join(map(str, seeds))}: each cell is the "
        "mean ± sample standard deviation over the seeds' completed runs (failed runs, diverged or ended at "
        "the base rate with NE >= 0.999 on a task, are counted, not averaged). Train loss is the task-weighted mean training loss over the one pass (the "
        "paper's metric, per task averaged over contribution, like and long_dwell); NE is the "
        "held-out day's normalized entropy. The paper's numbers (production data, 8 H100, ~30 h a run, "
        "sum over tasks) are on another scale: compare orderings, not values.",
        *(["", "The HDET configurations' controller (from `hdet_full`'s resolved config): "
           + ", ".join(f"`{k}={v}`" for k, v in form.items()) + "."] if form else []),
        "",
        "| configuration | what | train loss | NE contribution | NE like | NE long_dwell | failed | wall s | paper avg LR | paper train loss |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        p = r["paper"]
        lines.append(
            f"| {r['config']} | {r['what']} | {_fmt(r['train_loss'])} | "
            + " | ".join(_fmt(r["eval_ne"][t]) for t in TASKS)
            + f" | {r.get('failed', r['diverged'])}/{r['seeds_run']} | {_fmt(r['wall_seconds'], 0)} | {p['avg_lr'] or '-'} | "
            f"{p['train_loss'] or '(not in the paper)'} |"
        )
    if result.get("contrasts"):
        lines += ["", "## Paired differences", "",
                  "Held-out NE, mean over the three tasks: contender - reference on the seeds where both completed "
                  "(every run trains the same rows under the fairness contract), mean and 95% t-interval; negative: "
                  "the contender is better.", "",
                  "| contender - reference | what it isolates | difference [95% CI] (seeds) | failed (contender / reference) |",
                  "|---|---|---|---|"]
        for c in result["contrasts"]:
            d = c["diff"]
            diff = "-" if d is None else f"{d['mean']:+.4f}" + (
                f" [{d['ci95'][0]:+.4f}, {d['ci95'][1]:+.4f}]" if d["ci95"] else "") + f" ({len(c['seeds'])})"
            lines.append(f"| {c['contender']} - {c['reference']} | {c['what']} | {diff} | "
                         f"{len(c['failed'])} / {len(c['reference_failed'])} |")
    decay_rows = [r for r in result["rows"] if r["base_vs_schedule"]]
    if decay_rows:
        lines += [
            "",
            "## Per-group decay chosen by the controller",
            "",
            "The controlled base learning rate relative to the schedule it replaces (OneCycle at the "
            "same step), geometric mean over the syncs where the controller owned the base; mean ± std "
            "over seeds. Below 1: the controller cut that group's LR below the schedule; the smallest "
            "decayed fastest. The paper's claim: transformer decays fastest, no_decay slowest, "
            "embedding and non_embedding in between.",
            "",
            "| configuration | " + " | ".join(GROUPS) + " | fastest → slowest |",
            "|---|" + "---|" * (len(GROUPS) + 1),
        ]
        for r in decay_rows:
            means = {g: r["base_vs_schedule"][g]["mean"] for g in GROUPS if g in r["base_vs_schedule"]}
            order = " → ".join(sorted(means, key=means.get))
            cells = " | ".join(_fmt(r["base_vs_schedule"][g], 3) if g in r["base_vs_schedule"] else "-" for g in GROUPS)
            lines.append(f"| {r['config']} | {cells} | {order} |")
    lines += ["", "## Runs", "", "| configuration | seed | status | steps | train loss | wall s | run (results.jsonl) |",
              "|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        for run in r["runs"]:
            lines.append(f"| {r['config']} | {run['seed']} | {run['status']} | {run['steps']} | "
                         f"{run['train_loss']:.4f} | {run['wall_seconds']:.0f} | `{run['run']}` |")
    if report:
        lines += ["", f"Comparison report over seed {seeds[0]}'s runs: `{report}` "
                      "(`python -m recsys_hdet.evaluate runs=[...]`)."]
    if previous:
        lines += ["", "## The previous ablation", "",
                  f"Kept beside this one, verbatim from `{previous}` (its own seeds, code and controller "
                  "are described there):", "", *previous_table(previous)]
    return "\n".join(lines) + "\n"


def comparison_report(study: StudyFiles, seed: int) -> Optional[str]:
    """Runs ``recsys_hdet.evaluate`` in comparison mode over one seed's completed runs, into
    ``<out>/comparison/report.html``. It needs the run directories: where they are not in the working
    directory (a report rebuilt from the results file alone), an earlier report is kept as it is."""
    report_dir = os.path.join(study.out, "comparison")
    completed = [c.name for c in CONFIGS if outcome(study.results.get(run_name(c.name, seed))) == "completed"]
    dirs = [run_dir(study.work, c, seed) for c in completed]
    if not completed:
        return None
    if not all(run_dir_finished(d) for d in dirs):
        kept = os.path.join(report_dir, "report.html")
        if os.path.isfile(kept):
            print(f"comparison report: the run directories are not in {study.work}; {kept} kept as it is", flush=True)
            return kept
        print(f"comparison report: skipped (the run directories are not in {study.work})", flush=True)
        return None
    cmd = [sys.executable, "-m", "recsys_hdet.evaluate", f"runs=[{','.join(os.path.abspath(d) for d in dirs)}]",
           f"out={os.path.abspath(report_dir)}"]
    print("comparison report: " + " ".join(cmd), flush=True)
    code = subprocess.call(cmd)
    if code != 0:
        print(f"error: the comparison report failed (exit status {code})", file=sys.stderr)
        return None
    return os.path.join(report_dir, "report.html")


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m studies.ablation", description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="seeds per configuration (default 0 1 2)")
    ap.add_argument("--out", default="outputs/ablation",
                    help="study directory (results.jsonl, ablation.json, ablation.md, comparison/)")
    ap.add_argument("--work", default=None, help="where the run directories go (default: --out, or "
                    "outputs/studies/<study> for a study under docs/)")
    ap.add_argument("--report-only", action="store_true",
                    help="train nothing: write the tables from the results file alone")
    ap.add_argument("--configs", nargs="+", default=None, choices=[c.name for c in CONFIGS],
                    help="a subset of the configurations (default: all)")
    ap.add_argument("--no-report", action="store_true", help="skip the comparison report")
    ap.add_argument("--previous", default=None, help="an earlier ablation.md whose table the report keeps beside "
                    "its own (e.g. after the defaults changed)")
    add_study_arguments(ap)
    ap.add_argument("overrides", nargs="*", help="Hydra overrides passed to every run, e.g. data=tiny (put them "
                    "before --seeds/--configs, whose lists would take them)")
    args = ap.parse_args(argv)
    if args.previous:
        try:  # refused before hours of training, not after
            previous_table(args.previous)
        except (OSError, ValueError) as e:
            print(f"error: --previous {args.previous}: {e}", file=sys.stderr)
            return 2
    configs = [c for c in CONFIGS if args.configs is None or c.name in args.configs]
    try:
        study = StudyFiles.open(args.out, args.work, allow_dirty=args.allow_dirty,
                                train=not args.report_only and args.verify is None)
        if args.verify is not None:
            return print_verification(args.verify, verify(study, args.verify))
    except (ResultsError, StudyMismatch) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    os.makedirs(study.out, exist_ok=True)
    todo = [(c, s) for s in args.seeds for c in configs]  # seed-major: one seed's table fills first
    crashed = []
    for i, (cfg, seed) in enumerate(todo, 1):
        try:
            res = run_one(study, cfg, seed, args.overrides, args.report_only)
        except StudyMismatch as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        if res["skipped"]:
            state = "not run yet" if res["record"] is None else "finished earlier, skipped"
            print(f"[{i}/{len(todo)}] {cfg.name} seed {seed}: {state}", flush=True)
            continue
        if res.get("crashed"):
            crashed.append(f"{cfg.name} seed {seed} (exit status {res['exit_status']}, log {res['log']})")
            print(f"[{i}/{len(todo)}] {cfg.name} seed {seed}: CRASHED, exit status {res['exit_status']}; "
                  f"see {res['log']}", flush=True)
            continue
        r = res["record"]
        print(f"[{i}/{len(todo)}] {cfg.name} seed {seed}: {r['status']}, train loss {r['train_loss']['avg']:.4f}, "
              f"{res['process_seconds']:.0f} s", flush=True)
    result = collect(study.results, args.seeds)
    result["configs"] = [c.name for c in configs]
    report = None if args.no_report else comparison_report(study, args.seeds[0])
    result["comparison_report"] = os.path.relpath(report, study.out) if report else None
    out = study.out
    command = "python -m studies.ablation" + ("" if argv is None else " " + " ".join(argv))
    if argv is None and len(sys.argv) > 1:
        command += " " + " ".join(sys.argv[1:])
    result["command"] = command
    result["machine"] = machine_line()
    write_reports(out, "ablation", result, render_markdown(result, command, result["machine"], result["comparison_report"],
                                                               args.previous))
    print(f"wrote {os.path.join(out, 'ablation.md')} and ablation.json", flush=True)
    if crashed:
        print("error: crashed runs (rerun the same command to retry them):\n  " + "\n  ".join(crashed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
