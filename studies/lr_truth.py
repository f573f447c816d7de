"""Ground truth for learning-rate direction, and a scorecard of the controller's signals against it.

The question a controller answers at a sync is: from this point of the pass, would a higher or a
lower learning rate for this group end the pass better? That can be measured directly:

- **trunk**: a plain run from a start (every group's peak LR), keeping checkpoints at 25%, 50%
  and 75% of the pass (``trainer.periodic_checkpoint.keep_at``);
- **branch**: from each kept checkpoint, the rest of the same pass with one group's LR multiplied
  by x0.5 or x2 (``trainer.branch_from``): the embedding group, and the three dense groups
  together. x1 is the trunk itself: a branch at the trunk's LRs reproduces it bit for bit
  (tests/test_branch.py). Seeds are paired: a seed's branches start from that seed's trunk;
- **truth** per (start, checkpoint, group): the multiplier with the best mean held-out NE (mean over
  the three tasks), or ``none`` where the 95% paired t-interval of (best - runner-up) over seeds
  covers zero. A run that diverges counts as NE 1.0 (the base-rate predictor), as in the recovery
  study; rollback is off in every run here, so a too-high LR shows as what it is;
- **signals**: from each kept checkpoint, HDET with the product's spread (log space, alpha 0.25,
  every group spread, controller from that step) for ``windows`` syncs of T steps, then stopped
  (``trainer.stop_at_step``): one run per entry of ``SIGNAL_RUNS`` (a signal, or a signal with
  other settings: its sync records carry every rank's signal loss and window training loss). Every score the engine
  offers is computed from those records with the engine's own functions
  (:func:`recsys_hdet.hdet.controller.engine.preference`, :func:`~recsys_hdet.hdet.controller.engine.joint_preferences`):
  ``{probe,train,serving}/{zscore,rank,regression}`` and ``paper`` (softmax, sigma 0.1, on the
  training losses: the paper's score; on the log spread, not its linear one). A signal's value per
  group is its mean over the windows (regression: the fit pooled over them with beta 0.9, as the
  engine pools it), the dense groups' is the mean of the three;
- **scorecard**: a signal agrees with a case when the sign of its value (mean over seeds) points
  to the truth's side (x2: +, x0.5: -). Cases whose truth is ``none`` or ``x1`` are listed, not
  scored: a sign cannot say "stay".

**Explore round** (``--explore-round``: explore-then-commit's falsification, ``hdet.explore_rounds``):
from the pass's start and from the trunk's checkpoints at ``round_fractions``, each group's LR (and all
groups') x1, x3.16 and x10 for one round of ``round_steps`` steps scored by the anneal-then-probe signal at
the round's end, and to the end of the pass; the table (``explore_round`` in the JSON) says whether the
round's score orders the multipliers as the held-out NE at the end does. Record mode: the ``low`` start,
rounds of 125 steps from 0% and 25%, the embedding, the dense groups and all.

**Range commit** (``--range-commit``: the range test on the replicas' kill test, :mod:`studies.range_commit`):
the form's sweep and commit alone from the recovery study's starts, 3 seeds; ``range_commit`` in the JSON.

Every run is one line of ``results.jsonl`` (:mod:`studies.record`: overrides, seed, status,
NE per task, steps, times, and a signal run's sync records; a line's kind, start, seed, checkpoint,
group and multiplier are read from its name and overrides): the report is rebuilt from it alone
(``--report-only``), and a run with a line is never trained again (resume). Run directories live under ``--work`` (git-ignored
``outputs/`` by default), never in docs.

Modes: ``record`` (benchmark data, 2 x 2 layout, 3 seeds, T = 50: the record, docs/results/lr_truth/lr_truth.*) and
``fast`` (demo data cut to its last two training days, same layout, T = 25: for developing a
signal). ``--start NAME:EMB:DENSE`` replaces the starts.

This module is the study's command and its training (:class:`Study`, :func:`main`); its other modules, imported
by it alone: :mod:`studies.lr_truth_plan` (the modes, multipliers and signal runs), :mod:`studies.lr_truth_scorecard`
(the truth, the signals' values, the scorecard and the explore-round table, from the results lines alone) and
:mod:`studies.lr_truth_report` (the report's rendering).
"""

from __future__ import annotations
import argparse
import json
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from recsys_hdet.run_dir import RunDir
from studies import range_commit
from studies.lr_truth_plan import ALPHA, MODES, ROUND_MULTIPLIERS, SIGNAL_RUNS, Mode, pct
from studies.lr_truth_report import render
from studies.lr_truth_scorecard import collect
from studies.provenance import REPO
from studies.results import append, is_finished, load
from studies.runs import StudyError, train_record
from studies.starts import lr_overrides


@dataclass
class Study:
    mode: Mode
    results_path: str
    work: str
    data_cache: Optional[str] = None
    results: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    signal_runs: Tuple[str, ...] = tuple(SIGNAL_RUNS)  # which signal runs to train (all are reported)

    def run(self, name: str, overrides: Sequence[str]) -> Dict[str, Any]:
        """The run's results line: from the file when it finished earlier, else trained now."""
        if is_finished(self.results, name):
            return self.results[name]
        record = train_record(self.work, name, overrides, self.data_cache)
        append(self.results_path, record)
        self.results[name] = record
        print(f"{name}: {record['status']}, mean NE {record['mean_ne']}, {record['process_seconds']:.0f} s", flush=True)
        return record

    def retrain_trunk(self, name: str, recorded: Dict[str, Any], checkpoint: str) -> None:
        """Trains a recorded trunk again for its kept checkpoints (signal runs added in a later session
        branch from them; run directories are not kept in docs), as the line ``<name>_again``.

        Training is deterministic on one machine, not across machines: the trunk trained again on
        another day can end a little away from the recorded one (measured: plateau seed 0, 0.77753
        against the recorded 0.77679, with the code of the record and today's alike). The truth keeps
        the recorded branches; the report lists each trunk's two NEs, the size of that drift."""
        again_name = f"{name}_again"
        if again_name in self.results and os.path.isdir(checkpoint):
            return
        print(f"{name}: training the recorded trunk again for its kept checkpoints", flush=True)
        again = train_record(self.work, name, recorded["overrides"], self.data_cache)
        if again["status"] != recorded["status"] or not os.path.isdir(checkpoint):
            raise StudyError(f"{name}: trained again, it ends {again['status']} (recorded: {recorded['status']}) "
                             f"or kept no checkpoint at {checkpoint}: the truth's trunk cannot be reproduced here")
        append(self.results_path, {**again, "name": again_name})
        self.results[again_name] = {**again, "name": again_name}
        print(f"{again_name}: mean NE {again['mean_ne']} (recorded {recorded['mean_ne']})", flush=True)

    def common(self, embedding: float, dense: float, seed: int) -> List[str]:
        m = self.mode
        return [*m.overrides, *lr_overrides(embedding, dense), f"seed={seed}", f"trainer.nproc={m.layout[0]}",
                f"trainer.sharding_group_size={m.layout[1]}", f"trainer.log_every={m.sync_every}",
                f"data.reserve_rows={m.reserve_rows}", "trainer.rollback.max_rollbacks=0",
                "trainer.periodic_checkpoint.every_steps=0", "trainer.checkpoint=false", "trainer.tensorboard=false"]

    def start(self, start: str, seed: int) -> None:
        embedding, dense = self.mode.starts[start]
        base = self.common(embedding, dense, seed)
        prefix = f"{start}/seed{seed}"
        keep_at = ",".join(map(str, self.mode.fractions))
        trunk = self.run(f"{prefix}/trunk", [*base, f"trainer.periodic_checkpoint.keep_at=[{keep_at}]"])
        if trunk["status"] != "completed":
            raise StudyError(f"start {start!r} (embedding {embedding:g}, dense {dense:g}), seed {seed}: the plain run "
                             f"{trunk['status']} at step {trunk['steps']}: no ground truth from a pass that does not "
                             "train; choose a start whose plain run completes")
        steps, T = trunk["steps"], self.mode.sync_every
        for fraction in self.mode.fractions:
            at = round(fraction * steps / T) * T  # where the trunk kept it (trainer.py: keep_at)
            ckpt = os.path.join(RunDir(os.path.join(self.work, prefix, "trunk")).path(RunDir.CHECKPOINT), f"step-{at}")
            pending = [g for g in self.mode.groups for m in (0.5, 2.0) if f"{prefix}/{pct(fraction)}/{g}_x{m:g}" not in self.results]
            pending_signals = [s for s in self.signal_runs if f"{prefix}/{pct(fraction)}/signal_{s}" not in self.results]
            if (pending or pending_signals) and not os.path.isdir(ckpt):
                self.retrain_trunk(f"{prefix}/trunk", trunk, ckpt)
            for group in self.mode.groups:
                for m in (0.5, 2.0):
                    lrs = {"embedding": embedding, "dense": dense}
                    lrs[group] *= m
                    self.run(f"{prefix}/{pct(fraction)}/{group}_x{m:g}",
                             [*self.common(lrs["embedding"], lrs["dense"], seed), f"trainer.branch_from={ckpt}"])
            for signal in self.signal_runs:
                signal_overrides = SIGNAL_RUNS[signal]
                self.run(f"{prefix}/{pct(fraction)}/signal_{signal}",
                         [*base, f"trainer.branch_from={ckpt}", "hdet=controller", *signal_overrides,
                          "hdet.space=log", f"hdet.alpha={ALPHA}", f"hdet.sync_every={T}", f"hdet.controller_start={at}",
                          f"trainer.stop_at_step={at + self.mode.windows * T}"])


    def trunk(self, start: str, seed: int) -> Dict[str, Any]:
        embedding, dense = self.mode.starts[start]
        keep_at = ",".join(map(str, self.mode.fractions))
        return self.run(f"{start}/seed{seed}/trunk",
                        [*self.common(embedding, dense, seed), f"trainer.periodic_checkpoint.keep_at=[{keep_at}]"])

    def explore_round(self, start: str, seed: int) -> None:
        """Explore-then-commit's falsification at one (start, seed): from the pass's start and from the
        trunk's checkpoints at ``round_fractions``, each group's LR x1, x3.16 and x10 (i) for one round of
        ``round_steps`` steps, scored at its end by the anneal-then-probe signal (HDET with alpha 0: no
        spread, no controller; the round's score is the ranks' mean probe loss), and (ii) to the end of the
        pass (the truth: held-out NE; x1 is the trunk). :func:`explore_round_cases` compares the orders."""
        m, R = self.mode, self.mode.round_steps
        embedding, dense = m.starts[start]
        prefix = f"{start}/seed{seed}"
        trunk = self.trunk(start, seed)
        if trunk["status"] != "completed":
            raise StudyError(f"{prefix}: the trunk {trunk['status']}: no truth from a pass that does not train")
        for fraction in m.round_fractions:
            at = round(fraction * trunk["steps"] / m.sync_every) * m.sync_every
            if at % R:
                raise StudyError(f"explore round at {fraction:.0%}: step {at} is not a multiple of the round's "
                                 f"{R} steps (the round must be one HDET window)")
            branch: List[str] = []
            if at:
                ckpt = os.path.join(RunDir(os.path.join(self.work, prefix, "trunk")).path(RunDir.CHECKPOINT), f"step-{at}")
                if not os.path.isdir(ckpt):
                    self.retrain_trunk(f"{prefix}/trunk", trunk, ckpt)
                branch = [f"trainer.branch_from={ckpt}"]
            for group in m.round_groups:
                for mult in ROUND_MULTIPLIERS:
                    e = embedding * (mult if group in ("embedding", "all") else 1.0)
                    d = dense * (mult if group in ("dense", "all") else 1.0)
                    if mult != 1.0:
                        self.run(f"{prefix}/{pct(fraction)}/{group}_x{mult:.3g}", [*self.common(e, d, seed), *branch])
                    name = f"{prefix}/{pct(fraction)}/round_x1" if mult == 1.0 else \
                        f"{prefix}/{pct(fraction)}/round_{group}_x{mult:.3g}"
                    self.run(name, [*self.common(e, d, seed), *branch, "hdet=controller", "hdet.signal=anneal_probe",
                                    "hdet.space=log", "hdet.alpha=0", "hdet.autolr=false", f"hdet.sync_every={R}",
                                    f"trainer.stop_at_step={at + R}"])


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m studies.lr_truth", description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=sorted(MODES), default="record")
    parser.add_argument("--out", help="where results.jsonl and the report go (default: docs/results/lr_truth/ for "
                                      "record, outputs/lr_truth_fast/ for fast)")
    parser.add_argument("--work", help="run directories (default: outputs/studies/lr_truth_<mode>)")
    parser.add_argument("--seeds", type=int, nargs="+", help="seeds (default: the mode's)")
    parser.add_argument("--start", action="append", metavar="NAME:EMB:DENSE", help="a start (repeatable)")
    parser.add_argument("--report-only", action="store_true", help="rebuild the report from results.jsonl")
    parser.add_argument("--signals", nargs="+", choices=list(SIGNAL_RUNS), default=list(SIGNAL_RUNS),
                        help="train only these signal runs (every recorded one is reported; default: all)")
    parser.add_argument("--data-cache", help="data directory (RECSYS_HDET_DATA)")
    parser.add_argument("--explore-round", action="store_true",
                        help="train explore-then-commit's falsification runs (one round vs the end of the pass) "
                             "instead of the branches and signal runs")
    parser.add_argument("--range-commit", action="store_true",
                        help="train the range test on the replicas' kill test (sweep and commit only, from the "
                             "recovery study's starts: studies/range_commit.py) instead of the branches and signal runs")
    args = parser.parse_args(argv)
    mode = MODES[args.mode]
    if args.seeds:
        mode.seeds = tuple(args.seeds)
    if args.start:
        try:
            mode.starts = {n: (float(e), float(d)) for n, e, d in (s.split(":") for s in args.start)}
        except ValueError:
            parser.error(f"--start {args.start}: expected NAME:EMB:DENSE, e.g. low:0.6:0.00095")
    out = args.out or (os.path.join(REPO, "docs", "results", "lr_truth") if args.mode == "record"
                       else os.path.join(REPO, "outputs", "lr_truth_fast"))
    stem = "lr_truth" if args.mode == "record" else f"lr_truth_{args.mode}"
    results_path = os.path.join(out, stem, "results.jsonl")
    study = Study(mode, results_path, args.work or os.path.join(REPO, "outputs", "studies", stem), args.data_cache,
                  load(results_path), tuple(args.signals))
    status = 0
    if not args.report_only:
        try:
            if args.range_commit:
                range_commit.train_all(study.run)
            for seed in (() if args.range_commit else mode.seeds):  # seed-major: whole seeds for every start
                for start in (mode.round_starts if args.explore_round else mode.starts):
                    (study.explore_round if args.explore_round else study.start)(start, seed)
        except StudyError as e:
            print(f"error: {e}", file=sys.stderr)
            status = 2
    result = collect(study.results, mode)
    result.update({"range_commit": range_commit.table(study.results),
                   "range_commit_retired": {form: range_commit.table(study.results, form=form)
                                            for form in range_commit.KILL_TESTS if form != range_commit.CURRENT},
                   "range_rule_dev": range_commit.rule_dev(study.results),
                   "range_divisor_dev": range_commit.divisor_dev(study.results),
                   "finder_commit": range_commit.finder_table(study.results)})
    wall = sum(r["process_seconds"] or 0 for r in study.results.values())
    result.update({"mode": args.mode, "starts": {k: list(v) for k, v in mode.starts.items()}, "seeds": list(mode.seeds),
                   "run_minutes": wall / 60})
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"{stem}.json"), "w") as f:
        json.dump(result, f, indent=1, sort_keys=True)
    with open(os.path.join(out, f"{stem}.md"), "w") as f:
        f.write(render(result, args.mode, mode, wall))
    print(f"wrote {os.path.join(out, stem + '.md')} and .json ({len(study.results)} runs in {results_path})")
    return status


if __name__ == "__main__":
    sys.exit(main())