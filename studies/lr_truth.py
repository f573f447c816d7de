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
  (:func:`recsys_hdet.hdet.engine.preference`, :func:`~recsys_hdet.hdet.engine.joint_preferences`):
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

Modes: ``record`` (benchmark data, 2 x 2 layout, 3 seeds, T = 50: the record, docs/lr_truth.*) and
``fast`` (demo data cut to its last two training days, same layout, T = 25: for developing a
signal). ``--start NAME:EMB:DENSE`` replaces the starts.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from recsys_hdet.constants import DENSE_GROUPS, LR_AXES
from recsys_hdet.run_dir import RunDir
from studies import range_commit
from studies.provenance import REPO
from studies.record import sync_records
from studies.results import append, is_finished, load
from studies.runs import StudyError, train_record
from studies.starts import lr_overrides
from studies.stats import paired_ci95

GROUPS = LR_AXES  # what a branch multiplies
ROUND_MULTIPLIERS = (1.0, 10 ** 0.5, 10.0)  # explore_round: x1, x3.16, x10 of the start, one group (or all)
MULTIPLIERS = (0.5, 1.0, 2.0)
FRACTIONS = (0.25, 0.5, 0.75)
DIVERGED_NE = 1.0  # a diverged run scores as the base-rate predictor (docs/lr_recovery.md's rule)
ALPHA = 0.25  # the product's spread (conf/hdet/enabled.yaml)
SCORES = ("zscore", "rank", "regression", "effect")
# score "effect": the product's effect-size controller (conf/hdet/enabled.yaml's effect_scale, min_t
# and trust region ln(1 + alpha)); its value is the move it makes over the windows, as a fraction of
# the largest (a whole trust region every sync): 0 where it rests.
EFFECT = {"effect_scale": 0.005, "min_t": 2.0}
REST = 0.1  # an effect signal whose mean move is under this many trust regions per sync is at rest
# a mean of scores that cancel (e.g. +1/3 and -1/3 over three seeds) has no sign: left at rounding
# noise (1e-17), its sign depends on the summation order of the numerical library
SIGN_TOLERANCE = 1e-9
# A signal run per (start, seed, checkpoint) for each of these (name: its overrides); the scorecard's
# losses are their sync records' "losses", and the probe run's "train_losses" (the window loss).
# discounted_credit_greedy: the same signal with mu = 0 at the last iterate (one step of a T = 50
# window), the greedy hypergradient, as its control; anneal_probe_local: the default signal with
# independent dense replicas between syncs (trainer.dense_gradients=local, local SGD).
SIGNAL_RUNS = {
    "probe": ("hdet.signal=probe",),
    "serving": ("hdet.signal=serving",),
    "averaged_probe": ("hdet.signal=averaged_probe",),
    "anneal_probe": ("hdet.signal=anneal_probe",),
    "discounted_credit": ("hdet.signal=discounted_credit",),
    "discounted_credit_greedy": ("hdet.signal=discounted_credit", "hdet.discounted_credit.mu=0",
                                 "hdet.discounted_credit.fraction=0.02"),
    "anneal_probe_local": ("hdet.signal=anneal_probe", "trainer.dense_gradients=local"),
}
LOSSES = ("probe", "train", *(s for s in SIGNAL_RUNS if s != "probe"))


@dataclass
class Mode:
    overrides: Tuple[str, ...]  # every run's
    starts: Dict[str, Tuple[float, float]]  # name -> (embedding, dense) peak LRs
    seeds: Tuple[int, ...]
    sync_every: int  # T: the signal runs' window, and every run's log interval
    windows: int  # syncs a signal run measures
    layout: Tuple[int, int] = (4, 2)  # nproc, sharding_group_size
    reserve_rows: int = 4096
    fractions: Tuple[float, ...] = FRACTIONS  # where the trunk keeps checkpoints
    groups: Tuple[str, ...] = tuple(GROUPS)  # which groups' LRs are branched
    # Explore-then-commit's falsification (--explore-round): where one round starts (0: the pass's start,
    # else a trunk checkpoint), how long it is (it must divide the checkpoint's step: the round is one
    # HDET window), which groups and which starts.
    round_fractions: Tuple[float, ...] = (0.0, 0.25)
    round_steps: int = 125
    round_groups: Tuple[str, ...] = ("embedding", "dense", "all")
    round_starts: Tuple[str, ...] = ("low",)


# The record's plateau start is the recovery grid's best cell (docs/lr_recovery.md: embedding 6,
# dense 0.0095); "low" is every group 10x below it.
MODES = {
    "record": Mode(("+experiment=baseline_low",), {"plateau": (6.0, 0.0095), "low": (0.6, 0.00095)}, (0, 1, 2), 50, 4),
    # Demo data, its last two training days: a pass of ~146 steps. The demo preset's LRs stand for the
    # plateau here (not measured), "low" 10x below.
    "fast": Mode(("+experiment=baseline_low", "data=demo", "data.train_days=2"),
                 {"preset": (0.05, 0.002), "low": (0.005, 0.0002)}, (0, 1, 2), 25, 4),
    # For the harness's own end-to-end test: tiny data, two ranks.
    "tiny": Mode(("data=tiny",), {"preset": (0.05, 0.002)}, (0, 1), 5, 1, layout=(2, 1), reserve_rows=2048,
                 fractions=(0.5,), groups=("dense",), round_fractions=(0.0, 0.5), round_steps=5,
                 round_groups=("dense",), round_starts=("preset",)),
}


def pct(fraction: float) -> str:
    return f"c{round(fraction * 100)}"


def checkpoint_step(record: Dict[str, Any]) -> int:
    """The step a branch or signal run started from: its trainer.branch_from checkpoint's."""
    for o in record["overrides"]:
        if o.startswith("trainer.branch_from="):
            return int(o.rsplit("step-", 1)[1])
    raise StudyError(f"{record['name']}: not a branch (no trainer.branch_from override)")


# ----------------------------------------------------------------------------------------------
# The study.

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
                         [*base, f"trainer.branch_from={ckpt}", "hdet=enabled", *signal_overrides,
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
                    self.run(name, [*self.common(e, d, seed), *branch, "hdet=enabled", "hdet.signal=anneal_probe",
                                    "hdet.space=log", "hdet.alpha=0", "hdet.autolr=false", f"hdet.sync_every={R}",
                                    f"trainer.stop_at_step={at + R}"])


# ----------------------------------------------------------------------------------------------
# Explore-then-commit's falsification table (from the results lines alone).

def round_score(line: Optional[Dict[str, Any]], at: int, round_steps: int) -> Optional[float]:
    """A round run's score: the ranks' mean anneal-then-probe loss at the sync that ends the round (inf when
    the round diverged first: the worst; None when the run is missing)."""
    if line is None:
        return None
    syncs = [x for x in sync_records(line) if x["step"] == at + round_steps]
    finite = [v for v in (syncs[0]["losses"] if syncs else []) if v is not None and math.isfinite(v)]
    return statistics.fmean(finite) if finite else math.inf


def explore_round_cases(results: Dict[str, Dict[str, Any]], mode: Mode) -> Dict[str, Any]:
    """Per (start, round fraction, group): each multiplier's end-of-pass NE and round score, mean over the
    seeds that have all of both; the order of the multipliers by each, and whether they agree (the whole
    order, and the best)."""
    cases = []
    for start in mode.round_starts:
        for fraction in mode.round_fractions:
            for group in mode.round_groups:
                end: Dict[float, Dict[int, float]] = {x: {} for x in ROUND_MULTIPLIERS}
                score: Dict[float, Dict[int, float]] = {x: {} for x in ROUND_MULTIPLIERS}
                for seed in mode.seeds:
                    prefix = f"{start}/seed{seed}"
                    # x1's end: the trunk as trained again beside the branches (its latest line) where there is one:
                    # a trunk recorded on another day can end a little away (Study.retrain_trunk)
                    trunk = results.get(f"{prefix}/trunk_again") or results.get(f"{prefix}/trunk")
                    if trunk is None:
                        continue
                    at = round(fraction * trunk["steps"] / mode.sync_every) * mode.sync_every
                    for mult in ROUND_MULTIPLIERS:
                        line = trunk if mult == 1.0 else results.get(f"{prefix}/{pct(fraction)}/{group}_x{mult:.3g}")
                        name = f"{prefix}/{pct(fraction)}/round_x1" if mult == 1.0 else \
                            f"{prefix}/{pct(fraction)}/round_{group}_x{mult:.3g}"
                        ne, sc = branch_ne(line), round_score(results.get(name), at, mode.round_steps)
                        if ne is not None and sc is not None:
                            end[mult][seed], score[mult][seed] = ne, sc
                seeds = sorted(set.intersection(*(set(v) for v in end.values())))
                case: Dict[str, Any] = {"start": start, "fraction": fraction, "group": group, "seeds": seeds}
                if seeds:
                    end_mean = {x: statistics.fmean(end[x][s] for s in seeds) for x in ROUND_MULTIPLIERS}
                    score_mean = {x: statistics.fmean(score[x][s] for s in seeds) for x in ROUND_MULTIPLIERS}
                    by_end = [f"x{x:.3g}" for x in sorted(ROUND_MULTIPLIERS, key=end_mean.get)]
                    by_round = [f"x{x:.3g}" for x in sorted(ROUND_MULTIPLIERS, key=score_mean.get)]
                    case.update({"end_ne": {f"x{x:.3g}": v for x, v in end_mean.items()},
                                 "round_score": {f"x{x:.3g}": v for x, v in score_mean.items()},
                                 "order_by_end": by_end, "order_by_round": by_round,
                                 "same_order": by_end == by_round, "same_best": by_end[0] == by_round[0]})
                cases.append(case)
    scored = [c for c in cases if c["seeds"]]
    return {"round_steps": mode.round_steps, "cases": cases,
            "same_order": sum(c["same_order"] for c in scored), "same_best": sum(c["same_best"] for c in scored),
            "scored": len(scored)}


def render_explore_round(table: Dict[str, Any]) -> List[str]:
    lines = ["", "## Explore round: does one round's score rank x1 / x3.16 / x10 as the end of the pass does?", "",
             f"Each multiplier of one group's LR (or all groups') trained for one round of {table['round_steps']} steps "
             "from the pass's start or a trunk checkpoint, scored by the anneal-then-probe signal at the round's end "
             "(HDET with alpha 0: no spread, no controller); and trained to the end of the pass (held-out NE; x1 is the "
             "trunk). Means over the seeds that have every run. "
             f"Same order in {table['same_order']} of {table['scored']} cases, same best in {table['same_best']}.", "",
             "| start | from | group | end NE x1 / x3.16 / x10 | round score x1 / x3.16 / x10 | order by end | "
             "order by round | same order | seeds |", "|---|---|---|---|---|---|---|---|---|"]
    for c in table["cases"]:
        if not c["seeds"]:
            lines.append(f"| {c['start']} | {c['fraction']:.0%} | {c['group']} | - | - | - | - | - | 0 |")
            continue
        ends = " / ".join(f"{v:.4f}" for v in c["end_ne"].values())
        rounds = " / ".join(f"{v:.5f}" for v in c["round_score"].values())
        lines.append(f"| {c['start']} | {c['fraction']:.0%} | {c['group']} | {ends} | {rounds} | "
                     f"{' < '.join(c['order_by_end'])} | {' < '.join(c['order_by_round'])} | "
                     f"{'yes' if c['same_order'] else 'no'} | {len(c['seeds'])} |")
    return lines


# ----------------------------------------------------------------------------------------------
# Truth and scores (from the results lines alone).

def branch_ne(line: Optional[Dict[str, Any]]) -> Optional[float]:
    if line is None:
        return None
    return line["mean_ne"] if line["status"] == "completed" else DIVERGED_NE


def truth(ne: Dict[float, Dict[int, float]]) -> Dict[str, Any]:
    """``ne``: multiplier -> seed -> NE. The best multiplier by mean over the seeds every multiplier
    has, and the paired interval of (best - runner-up); ``none`` where it covers zero."""
    seeds = sorted(set.intersection(*(set(v) for v in ne.values()))) if ne else []
    if len(ne) < len(MULTIPLIERS) or len(seeds) < 2:
        return {"best": None, "seeds": seeds}
    means = {m: statistics.fmean(ne[m][s] for s in seeds) for m in MULTIPLIERS}
    order = sorted(MULTIPLIERS, key=means.get)
    best, runner_up = order[0], order[1]
    mean, low, high = paired_ci95([ne[best][s] - ne[runner_up][s] for s in seeds])
    decided = high < 0
    return {"best": f"x{best:g}" if decided else "none", "leader": f"x{best:g}", "runner_up": f"x{runner_up:g}",
            "diff": mean, "ci95": [low, high], "means": {f"x{m:g}": means[m] for m in MULTIPLIERS}, "seeds": seeds}


def _offsets(sync: Dict[str, Any], name: str) -> List[float]:
    """Each replica's spread offset u from the recorded values: value = base (1 + alpha)^u."""
    h = sync["hparams"][name]
    return [math.log(v / h["base"]) / math.log(1 + ALPHA) for v in h["values"]]


def signal_values(syncs: List[Dict[str, Any]], loss_key: str, score: str, sharding_group_size: int) -> Dict[str, float]:
    """One signal's value per reported group from a signal run's sync records (hdet.jsonl's form;
    see the module)."""
    import torch

    from recsys_hdet.hdet.hparams import ReplicaAxis
    from recsys_hdet.hdet.statistics import effect_move, joint_effects, joint_preferences, new_joint_fit, preference

    names = list(syncs[0]["hparams"])
    world = len(syncs[0]["losses"])
    axes = {n: ReplicaAxis.per_block(world, sharding_group_size) if n == "lr/embedding" else ReplicaAxis.per_rank(world)
            for n in names}
    per_sync: Dict[str, List[float]] = {n: [] for n in names}
    fit = new_joint_fit(len(names))
    for sync in syncs:
        raw = sync[loss_key]
        if raw is None:
            raise StudyError(f"sync at step {sync['step']}: no {loss_key!r} losses recorded")
        rank_loss = torch.tensor([float("nan") if x is None else x for x in raw], dtype=torch.float64)
        rank_ok = torch.isfinite(rank_loss)
        offsets = {n: torch.tensor(_offsets(sync, n), dtype=torch.float64) for n in names}
        if score in ("regression", "effect"):
            X = torch.stack([offsets[n][torch.tensor(axes[n].replica_of_rank)] for n in names], dim=1)
            if score == "regression":
                prefs = joint_preferences(fit, X, rank_loss, rank_ok, list(range(len(names))), 0.9)
            else:
                finite = rank_loss[torch.isfinite(rank_loss) & rank_ok]
                level = float(finite.abs().mean()) if len(finite) else float("nan")
                width = math.log(1 + ALPHA)
                effects = joint_effects(fit, X, rank_loss, rank_ok, list(range(len(names))), 0.9)
                prefs = {i: effect_move(e, width, level, EFFECT["effect_scale"], EFFECT["min_t"], width) / width
                         for i, e in effects.items()}
            for i, n in enumerate(names):
                per_sync[n].append(prefs.get(i, 0.0))
            continue
        for n in names:
            owner = torch.tensor(axes[n].replica_of_rank)
            replicas = len(offsets[n])
            losses = torch.stack([rank_loss[owner == r].mean() for r in range(replicas)])
            ok = torch.isfinite(losses)
            per_sync[n].append(preference(losses, ok, offsets[n], score, 0.1))
    # effect: the mean move per sync over the windows, in trust regions (moves raise the LR when positive)
    value = {n: (v[-1] if score == "regression" else statistics.fmean(v))
             for n, v in per_sync.items()}
    return {"embedding": value["lr/embedding"], "dense": statistics.fmean(value[f"lr/{g}"] for g in DENSE_GROUPS)}


def full_windows(line: Dict[str, Any], sync_every: int) -> List[Dict[str, Any]]:
    """A signal run's syncs (hdet.jsonl's form) that close a whole window of T steps after its
    checkpoint (a run that reaches the pass's end first has a last, shorter window there: left out)."""
    at = checkpoint_step(line)
    return [x for x in sync_records(line) if (x["step"] - at) % sync_every == 0]


def signals_of(lines: Dict[str, Dict[str, Any]], mode: Mode) -> Dict[str, Dict[str, float]]:
    """Every scored signal's value per group at one (start, seed, checkpoint), from the signal runs
    there (``lines``: hdet.signal -> results line) that recorded whole windows."""
    out = {}
    for loss in LOSSES:
        line, key = (lines.get("probe"), "train_losses") if loss == "train" else (lines.get(loss), "losses")
        if line is None:
            continue
        for score in SCORES:
            out[f"{loss}/{score}"] = signal_values(full_windows(line, mode.sync_every), key, score, mode.layout[1])
    if "probe" in lines:
        out["paper"] = signal_values(full_windows(lines["probe"], mode.sync_every), "train_losses", "softmax",
                                     mode.layout[1])
    return out


def collect(results: Dict[str, Dict[str, Any]], mode: Mode) -> Dict[str, Any]:
    cases, signal_table = [], {}
    for start in mode.starts:
        trunks = {s: results.get(f"{start}/seed{s}/trunk") for s in mode.seeds}
        for fraction in mode.fractions:
            for group in mode.groups:
                ne: Dict[float, Dict[int, float]] = {m: {} for m in MULTIPLIERS}
                for s in mode.seeds:
                    prefix = f"{start}/seed{s}/{pct(fraction)}"
                    for m in MULTIPLIERS:
                        line = trunks[s] if m == 1.0 else results.get(f"{prefix}/{group}_x{m:g}")
                        value = branch_ne(line)
                        if value is not None:
                            ne[m][s] = value
                values: Dict[str, List[float]] = {}
                windows, steps = set(), set()
                for s in mode.seeds:
                    lines = {k: results.get(f"{start}/seed{s}/{pct(fraction)}/signal_{k}") for k in SIGNAL_RUNS}
                    lines = {k: v for k, v in lines.items() if v and full_windows(v, mode.sync_every)}
                    for line in lines.values():
                        windows.add(len(full_windows(line, mode.sync_every)))
                        steps.add(checkpoint_step(line))
                    for name, by_group in signals_of(lines, mode).items():
                        values.setdefault(name, []).append(by_group[group])
                case = {"start": start, "checkpoint": fraction, "group": group, **truth(ne),
                        "checkpoint_steps": sorted(steps), "signal_windows": sorted(windows),
                        "signals": {k: statistics.fmean(v) for k, v in values.items()},
                        "signal_seeds": {k: len(v) for k, v in values.items()}}
                cases.append(case)
    for case in cases:
        direction = {"x2": 1, "x0.5": -1}.get(case.get("best") or "")
        for name, value in case["signals"].items():
            entry = signal_table.setdefault(name, {"agree": 0, "cases": 0, "per_start": {}})
            if name.endswith("/effect") and case.get("best") == "none":
                # where the truth tells no multiplier apart the controller should rest: a mean move
                # under a tenth of the trust region per sync counts as resting
                entry["none_cases"] = entry.get("none_cases", 0) + 1
                entry["none_at_rest"] = entry.get("none_at_rest", 0) + int(abs(value) < REST)
            if direction:
                per_start = entry["per_start"].setdefault(case["start"], {"agree": 0, "cases": 0})
                for tally in (entry, per_start):
                    tally["cases"] += 1
                    tally["agree"] += int(value * direction > SIGN_TOLERANCE)
    trunks_again = [{"trunk": n[:-len("_again")], "recorded": results[n[:-len("_again")]]["mean_ne"],
                     "again": line["mean_ne"]}
                    for n, line in sorted(results.items()) if n.endswith("/trunk_again") and n[:-len("_again")] in results]
    return {"cases": cases, "scorecard": signal_table, "chosen": chosen_signal(), "trunks_again": trunks_again,
            "explore_round": explore_round_cases(results, mode), "range_commit": range_commit.table(results),
            "finder_commit": range_commit.finder_table(results)}


def chosen_signal() -> str:
    """The product's default signal and score (conf/hdet/enabled.yaml), as the scorecard names it."""
    from omegaconf import OmegaConf

    h = OmegaConf.load(os.path.join(REPO, "conf", "hdet", "enabled.yaml"))
    return f"{h.signal}/{h.score}"


def render(result: Dict[str, Any], mode_name: str, mode: Mode, wall: float) -> str:
    lines = [f"# Learning-rate ground truth and the signal scorecard ({mode_name} mode)", "",
             "Generated by `python -m studies.lr_truth --mode " + mode_name + "` from `results.jsonl` "
             "(see the module docstring for the method). NE is the mean held-out NE over the three tasks; "
             "a diverged run counts as NE 1.0.", "",
             "Starts (embedding, dense peak LR): " + ", ".join(f"{k} ({e:g}, {d:g})" for k, (e, d) in mode.starts.items())
             + f". Seeds {list(mode.seeds)}, layout {mode.layout[0]} ranks in sharding groups of {mode.layout[1]}, "
             f"signals over {mode.windows} windows of T = {mode.sync_every} steps. Run time of the finished runs: "
             f"{wall / 60:.0f} min.", "",
             "Signal runs (each from every kept checkpoint, with HDET's product spread, log space, alpha "
             f"{ALPHA:g}): " + "; ".join(f"`{name}` ({' '.join(o)})" for name, o in SIGNAL_RUNS.items())
             + ". `train` and `paper` score the probe run's window training losses.", "", "## Truth", "",
             "| start | checkpoint (step) | group | NE x0.5 | NE x1 | NE x2 | best | best - runner-up (95% CI) | seeds | "
             "signal windows |", "|---|---|---|---|---|---|---|---|---|---|"]
    for c in result["cases"]:
        where = f"{c['checkpoint']:.0%} ({', '.join(map(str, c['checkpoint_steps'])) or '-'})"
        windows = ", ".join(map(str, c["signal_windows"])) or "-"
        if c.get("best") is None:
            lines.append(f"| {c['start']} | {where} | {c['group']} | - | - | - | needs 2+ seeds with every multiplier | - | "
                         f"{len(c['seeds'])} | {windows} |")
            continue
        means = c["means"]
        lines.append(f"| {c['start']} | {where} | {c['group']} | {means['x0.5']:.4f} | {means['x1']:.4f} | "
                     f"{means['x2']:.4f} | {c['best']} (leader {c['leader']}) | {c['diff']:+.4f} "
                     f"[{c['ci95'][0]:+.4f}, {c['ci95'][1]:+.4f}] | {len(c['seeds'])} | {windows} |")
    again = result.get("trunks_again") or []
    if again:
        lines += ["", "## Trunks trained again", "",
                  "Signal runs added later branch from trunks trained again (run directories are not kept); "
                  "across machines training is not bit-exact, so the trunk a new signal run starts from "
                  "differs from the one the truth's branches started from by this much:", "",
                  "| trunk | recorded NE | trained again | difference |", "|---|---|---|---|"]
        for t in again:
            lines.append(f"| {t['trunk']} | {t['recorded']:.5f} | {t['again']:.5f} | {t['again'] - t['recorded']:+.5f} |")
    lines += ["", "## Scorecard", "",
              "Agreement of each signal's sign (mean over seeds) with the truth's side, over the cases whose truth is "
              "x0.5 or x2; cases with truth `none` or `x1` are not scored.", "",
              f"The product's default (conf/hdet/enabled.yaml): `{result['chosen']}`.", "",
              "`<signal>/effect` is the effect-size controller (score=effect) run on the signal's losses: its value is "
              "its mean move per sync in trust regions (0: at rest). The last column counts the `none` cases where it "
              f"rests (mean move under {REST} trust region per sync); the other scores never rest.", "",
              "| signal | agree / cases | " + " | ".join(mode.starts) + " | at rest where the truth is none |",
              "|---|---|" + "---|" * len(mode.starts) + "---|"]
    for name, entry in sorted(result["scorecard"].items()):
        per_start = [entry.get("per_start", {}).get(start) for start in mode.starts]
        rest = f"{entry['none_at_rest']} / {entry['none_cases']}" if "none_cases" in entry else "-"
        lines.append(f"| {name} | {entry['agree']} / {entry['cases']} | "
                     + " | ".join(f"{t['agree']} / {t['cases']}" if t else "-" for t in per_start) + f" | {rest} |")
    lines += ["", "## Signal values per case", "",
              "Positive: the higher LRs did better in the windows after the checkpoint.", "",
              "| start | checkpoint | group | truth | " + " | ".join(sorted(result["scorecard"])) + " |",
              "|---|---|---|---|" + "---|" * len(result["scorecard"])]
    for c in result["cases"]:
        lines.append(f"| {c['start']} | {c['checkpoint']:.0%} | {c['group']} | {c.get('best') or '-'} | "
                     + " | ".join(f"{c['signals'][k]:+.2f}" if k in c["signals"] else "-"
                                  for k in sorted(result["scorecard"])) + " |")
    if result.get("explore_round", {}).get("scored"):
        lines += render_explore_round(result["explore_round"])
    if any(s["seeds"] for s in result["range_commit"]["starts"].values()):
        lines += range_commit.render(result["range_commit"])
    if any(s["seeds"] for s in result["finder_commit"]["starts"].values()):
        lines += range_commit.render_finder(result["finder_commit"])
    return "\n".join(lines) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m studies.lr_truth", description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=sorted(MODES), default="record")
    parser.add_argument("--out", help="where results.jsonl and the report go (default: docs/ for record, "
                                      "outputs/lr_truth_fast/ for fast)")
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
    out = args.out or (os.path.join(REPO, "docs") if args.mode == "record" else os.path.join(REPO, "outputs", "lr_truth_fast"))
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
