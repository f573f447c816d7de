"""The ground-truth study's tables from its results lines alone (:mod:`studies.lr_truth`): the truth per
(start, checkpoint, group) (:func:`truth`), every signal's value from a signal run's sync records
(:func:`signal_values`), the scorecard (:func:`collect`), and explore-then-commit's falsification table
(:func:`explore_round_cases`).
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Dict, List, Optional

from recsys_hdet.constants import DENSE_GROUPS
from studies.lr_truth_plan import ALPHA, MULTIPLIERS, ROUND_MULTIPLIERS, SIGNAL_RUNS, Mode, checkpoint_step, pct
from studies.record import sync_records
from studies.runs import StudyError
from studies.stats import paired_ci95

DIVERGED_NE = 1.0  # a diverged run scores as the base-rate predictor (docs/results/lr_recovery/lr_recovery.md's rule)
SCORES = ("zscore", "rank", "regression", "effect")
# score "effect": the product's effect-size controller (conf/hdet/controller.yaml's effect_scale, min_t
# and trust region ln(1 + alpha)); its value is the move it makes over the windows, as a fraction of
# the largest (a whole trust region every sync): 0 where it rests.
EFFECT = {"effect_scale": 0.005, "min_t": 2.0}
REST = 0.1  # an effect signal whose mean move is under this many trust regions per sync is at rest
# a mean of scores that cancel (e.g. +1/3 and -1/3 over three seeds) has no sign: left at rounding
# noise (1e-17), its sign depends on the summation order of the numerical library
SIGN_TOLERANCE = 1e-9
LOSSES = ("probe", "train", *(s for s in SIGNAL_RUNS if s != "probe"))


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
    from recsys_hdet.hdet.controller.statistics import effect_move, joint_effects, joint_preferences, new_joint_fit, preference

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
            "explore_round": explore_round_cases(results, mode)}


def chosen_signal() -> str:
    """The controller's signal and score (``hdet=controller`` composed: conf/hdet/controller.yaml over the
    schema's defaults), as the scorecard names it."""
    from recsys_hdet.config import compose

    h = compose("config", ["hdet=controller"]).hdet
    return f"{h.signal}/{h.score}"


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

