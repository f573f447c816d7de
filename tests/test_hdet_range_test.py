"""The range test on HDET's replicas (recsys_hdet/hdet/range_test/sweep.py, range_test_job.py): each replica sweeps
one axis while the other is held low, every rank commits the same suggestion, and the pass is then the plain
run at the committed max LRs from the step-0 state, bit for bit."""
import math

import pytest
import torch

import shutil

from conftest import read_json, read_jsonl, run_evaluate, run_train
from test_evaluate import _chromium, _render
from recsys_hdet.constants import LR_AXES
from recsys_hdet.hdet.range_test.rule import read_curve, suggest_multiplier, sweep_multiplier
from recsys_hdet.hdet.range_test.sweep import ReplicaSweepPlan, commit, sweep

FASTAI = {"embedding": 10.0, "dense": 10.0}  # fastai's divisor on both axes


# ----------------------------------------------------------------------------------------------
# A planted objective: one quadratic per group, gradient descent, stability edge known


class PlantedQuadratics:
    """``sum_g curvature_g x_g^2 / 2`` trained by gradient descent on noisy gradients (``c x + noise``, as
    minibatches give): group g's step is stable below the rate ``2 / curvature_g`` (its stability edge), where
    its loss rises towards the edge (the noise's share grows with the rate) and explodes above it."""

    def __init__(self, edges, noise=0.3, seed=0):
        self.curvature = {g: 2.0 / e for g, e in edges.items()}
        self.x = {g: (2.0 / c) ** 0.5 for g, c in self.curvature.items()}  # every group's loss starts at 1
        self.scale = dict(self.x)  # the noise in units of the group's starting point
        self.lr = {g: 0.0 for g in edges}
        self.noise = noise
        self.generator = torch.Generator().manual_seed(seed)

    def step(self, batch):
        loss = sum(c * self.x[g] ** 2 / 2 for g, c in self.curvature.items())
        for g, c in self.curvature.items():  # x <- x - lr (c x + noise)
            noise = self.noise * c * self.scale[g] * float(torch.randn((), generator=self.generator))
            self.x[g] = min(self.x[g] - self.lr[g] * (c * self.x[g] + noise), 1e100)
        return torch.tensor(loss, dtype=torch.float64)


def planted_suggestions(max_lrs, edges, together=False, steps=100):
    """The committed max LR per axis from a two-replica sweep on the planted quadratics; ``together``: both axes
    rise on every replica (one joint sweep, as a single range test of every group would)."""
    plan = ReplicaSweepPlan(LR_AXES, steps, 0.001, 10000.0, FASTAI)
    curves = []
    for replica in (0, 1):
        objective = PlantedQuadratics(edges)

        def set_multipliers(m, objective=objective, replica=replica):
            if together:
                m = {g: sweep_multiplier(len(curves_of[replica]), plan.low, plan.high, plan.steps) for g in m}
            for g, x in m.items():
                objective.lr[g] = max_lrs[g] * x

        curves_of = {replica: []}

        def train_step(batch, objective=objective, replica=replica):
            loss = objective.step(batch)
            curves_of[replica].append(loss)
            return loss

        curves.append(sweep(plan, replica, iter(range(steps)), train_step, set_multipliers, lambda c: c[None])[0])
    axes = commit(plan, torch.stack(curves), [0, 1])
    return {axis: max_lrs[LR_AXES[axis][0]] * axes[axis]["multiplier"] for axis in LR_AXES}, axes


@pytest.mark.parametrize("misset", [100.0, 0.01])
def test_each_axis_finds_its_planted_edge_with_the_other_axis_misset_100x(misset):
    """Planted edges: embedding 30, dense 0.02; the rule's answer is a tenth of the edge (the smoothed minimum
    lies near the edge). The embedding's max LR is set right, the dense groups' 100x off either way: each axis's
    suggestion lies within a factor 2 of a tenth of its edge. Swept together, the explosion of the axis whose
    edge comes first (in multiples of its max LR) cuts both curves, and the other axis's suggestion is far off."""
    edges = {"embedding": 30.0, "transformer": 0.02, "non_embedding": 0.02, "no_decay": 0.02}
    max_lrs = {"embedding": 3.0, **{g: 0.002 * misset for g in LR_AXES["dense"]}}
    found, axes = planted_suggestions(max_lrs, edges)
    for axis, rate in found.items():
        target = edges[LR_AXES[axis][0]] / 10
        assert target / 2 <= rate <= target * 2, (axis, rate, target, axes[axis]["multiplier"])
        assert axes[axis]["cut_at"] is not None  # each sweep reached its explosion and was cut there
    together, _ = planted_suggestions(max_lrs, edges, together=True)
    off = [axis for axis, rate in together.items() if not edges[LR_AXES[axis][0]] / 20 <= rate <= edges[LR_AXES[axis][0]] / 5]
    assert off == (["embedding"] if misset > 1 else ["dense"]), together  # the axis whose edge lies further up


def test_the_plan_sweeps_one_axis_per_replica_and_holds_the_other_low_and_pools_replicas():
    plan = ReplicaSweepPlan(LR_AXES, 5, 0.01, 100.0, FASTAI, off_map="commit")
    assert [plan.axis_of(r) for r in range(4)] == ["embedding", "dense", "embedding", "dense"]
    assert plan.multipliers(0, 4) == {"embedding": pytest.approx(100.0), **{g: 0.01 for g in LR_AXES["dense"]}}
    assert plan.multipliers(1, 2) == {"embedding": 0.01, **{g: pytest.approx(1.0) for g in LR_AXES["dense"]}}
    # 4 replicas of 1 rank: ranks 0 and 2 sweep the embedding, 1 and 3 the dense groups; each axis's curve is
    # the lower median of its replicas' (each replica's: its ranks' mean); one replica whose loss turned non-finite
    # does not end the curve while half of them are finite
    curves = torch.tensor([[2.0, 1.0, 0.5, 9.0, 9.0], [2.0, 1.5, 1.0, 0.8, 0.7],
                           [2.0, 1.2, 0.5, 9.0, math.nan], [2.0, 1.5, 1.0, 0.8, 0.7]], dtype=torch.float64)
    axes = commit(plan, curves, [0, 1, 2, 3])
    assert axes["embedding"]["ranks"] == [0, 2] and axes["dense"]["ranks"] == [1, 3]
    assert axes["embedding"]["loss"] == [2.0, 1.0, 0.5, 9.0, 9.0]
    assert axes["embedding"]["replicas"]["2"] == {"ranks": [2], "loss": [2.0, 1.2, 0.5, 9.0, None]}
    assert axes["embedding"]["multipliers"][0] == pytest.approx(0.01) and axes["embedding"]["multipliers"][-1] == 100.0
    assert axes["embedding"]["minimum_at"] == axes["embedding"]["multipliers"][2] and len(axes["embedding"]["smoothed"]) == 5
    # three replicas on an axis (R = 6): the curve ends where most of them blew up, not at the first one's blow-up
    six = commit(plan, torch.tensor([[1.0, 0.5, math.nan, math.nan, 1.0], [2.0, 1.5, 1.0, 0.8, 0.7],
                                     [1.0, 0.6, 0.4, math.nan, 1.0], [2.0, 1.5, 1.0, 0.8, 0.7],
                                     [1.0, 0.7, 0.5, 0.3, 1.0], [2.0, 1.5, 1.0, 0.8, 0.7]], dtype=torch.float64),
                 [0, 1, 2, 3, 4, 5])
    assert six["embedding"]["ranks"] == [0, 2, 4] and six["embedding"]["loss"][:3] == [1.0, 0.6, 0.5]
    assert six["embedding"]["loss"][3] is None  # two of the three blew up at the fourth step
    assert axes["dense"]["multiplier"] == suggest_multiplier([1, 2, 3, 4, 5], [2.0, 1.5, 1.0, 0.8, 0.7], 0.01, 100.0, 5)
    assert axes["dense"]["range_edge"] == "high" and axes["dense"]["cut_at"] is None
    assert {"range_edge_high", "never_exploded"} <= set(axes["dense"]["off_map"]) and not axes["dense"]["kept_configured"]
    assert axes["embedding"]["off_map"] == [] and axes["embedding"]["descent"] > 0.5
    assert read_curve([1.0, 0.5, math.inf], 0.9) == (1, 2) and read_curve([2.0, 1.0], 0.9) == (1, None)
    # no finite loss at all: the configured rates are kept, and the record says so
    nan = commit(plan, torch.full((4, 5), math.nan, dtype=torch.float64), [0, 1, 2, 3])
    assert nan["embedding"]["multiplier"] == 1.0 and nan["embedding"]["no_suggestion"]
    with pytest.raises(ValueError, match="at least 2 replicas"):
        commit(plan, curves[:1], [0])
    with pytest.raises(ValueError, match="only 2 steps"):
        sweep(plan, 0, iter(range(2)), lambda b: torch.tensor(1.0), lambda m: None, lambda c: c[None])


def test_each_axis_is_read_with_its_own_divisor():
    """The third form's rule: the same curves read with divisors 10 and 20 commit the embedding where fastai's rule
    does and the dense groups at half that multiplier; the record names the divisor, and the range's top end moves
    with it (the largest suggestion a sweep can make is high / divisor)."""
    curves = torch.tensor([[2.0, 1.0, 0.5, 0.4, 9.0], [2.0, 1.5, 1.0, 0.8, 0.7]], dtype=torch.float64)
    fastai = commit(ReplicaSweepPlan(LR_AXES, 5, 0.01, 100.0, FASTAI, off_map="commit"), curves, [0, 1])
    third = commit(ReplicaSweepPlan(LR_AXES, 5, 0.01, 100.0, {"embedding": 10.0, "dense": 20.0}, off_map="commit"),
                   curves, [0, 1])
    assert third["embedding"]["multiplier"] == fastai["embedding"]["multiplier"]
    assert third["dense"]["multiplier"] == pytest.approx(fastai["dense"]["multiplier"] / 2)
    assert (third["embedding"]["divisor"], third["dense"]["divisor"]) == (10.0, 20.0)
    assert fastai["dense"]["range_edge"] == "high" and third["dense"]["range_edge"] == "high"
    for bad in ({"embedding": 10.0}, {"embedding": 10.0, "dense": 0.5}):
        with pytest.raises(ValueError, match="divisors"):
            ReplicaSweepPlan(LR_AXES, 5, 0.01, 100.0, bad)


def test_an_answer_off_the_map_is_flagged_and_by_default_the_axis_keeps_its_configured_rates():
    """Planted curves: the embedding's loss falls and explodes inside the range (on the map); the dense groups' is
    flat and noisy (an axis the loss does not depend on, or a warm-started model): it never descends and never
    explodes, so its minimum says nothing. By default (off_map=keep) that axis trains at its configured rates
    (multiplier 1) and the record says why; with off_map=commit the rule's answer is committed, flagged the same.
    An answer at the range's top from a falling curve is a lower bound: committed, flagged."""
    steps = 40
    rising = [sweep_multiplier(k, 0.001, 10000.0, steps) for k in range(steps)]
    embedding = [0.7 / (1 + 10 * m) + (50.0 if m > 30 else 0.0) for m in rising]  # falls, then explodes at x30
    noise = torch.Generator().manual_seed(0)
    flat = [0.40 + 0.002 * float(torch.randn((), generator=noise)) for _ in rising]
    curves = torch.tensor([embedding, flat], dtype=torch.float64)
    kept = commit(ReplicaSweepPlan(LR_AXES, steps, 0.001, 10000.0, FASTAI), curves, [0, 1])
    assert kept["embedding"]["off_map"] == [] and not kept["embedding"]["kept_configured"]
    assert 0.3 <= kept["embedding"]["multiplier"] <= 3.0  # a tenth of the planted edge (x30), within x10
    dense = kept["dense"]
    assert "never_descended" in dense["off_map"] and "never_exploded" in dense["off_map"] and dense["descent"] < 0.02
    assert dense["kept_configured"] and dense["multiplier"] == 1.0 and dense["suggested"] is not None
    committed = commit(ReplicaSweepPlan(LR_AXES, steps, 0.001, 10000.0, FASTAI, off_map="commit"), curves, [0, 1])
    assert committed["dense"]["off_map"] == dense["off_map"] and not committed["dense"]["kept_configured"]
    assert committed["dense"]["multiplier"] == dense["suggested"]
    # a curve that falls and never explodes (the edge above the range): its answer, the range's top, is a lower
    # bound: committed under keep too, flagged
    falling = torch.tensor([embedding, [0.7 / (1 + m) for m in rising]], dtype=torch.float64)
    top = commit(ReplicaSweepPlan(LR_AXES, steps, 0.001, 10000.0, FASTAI), falling, [0, 1])["dense"]
    assert top["off_map"] == ["range_edge_high", "never_exploded"] and not top["kept_configured"]
    assert top["multiplier"] == top["suggested"] == pytest.approx(1000.0)
    # a curve that rises from its first steps (every rate tried too high): its answer lies at the range's low end
    rises = torch.tensor([embedding, [0.4 * (1 + m) for m in rising]], dtype=torch.float64)
    low = commit(ReplicaSweepPlan(LR_AXES, steps, 0.001, 10000.0, FASTAI), rises, [0, 1])["dense"]
    assert "range_edge_low" in low["off_map"] and "never_descended" in low["off_map"] and low["multiplier"] == 1.0
    # a warm start: flat and noisy, its lowest point by chance at the second step (13% below the first), rising
    # slowly after: the answer lies at the range's bottom, a fall of noise alone: kept
    noisy = [0.30, 0.26, 0.29, 0.27, 0.31, 0.28] + [0.29 * (1 + 0.01 * k) for k in range(steps - 6)]
    warm = commit(ReplicaSweepPlan(LR_AXES, steps, 0.001, 10000.0, FASTAI),
                  torch.tensor([noisy, noisy], dtype=torch.float64), [0, 1])
    for axis in LR_AXES:
        assert "range_edge_low" in warm[axis]["off_map"] and warm[axis]["kept_configured"], warm[axis]["off_map"]
        assert warm[axis]["multiplier"] == 1.0 and warm[axis]["early_noise"] is not None
    with pytest.raises(ValueError, match="off_map"):
        ReplicaSweepPlan(LR_AXES, steps, 0.001, 10000.0, FASTAI, off_map="ignore")


def test_one_replica_or_another_form_is_refused_before_training(tmp_path, data_cache, tiny_dataset):
    from recsys_hdet.api import compose_config
    from recsys_hdet.config import validate_config
    from recsys_hdet.config_values import ConfigError

    base = ["data=tiny", "hdet=enabled", "hdet.range_test.steps=8"]
    for extra, named in ((["trainer.nproc=2", "trainer.sharding_group_size=2"], "at least 2 replicas"),
                         (["trainer.nproc=2", "trainer.sharding_group_size=1", "optim.dense.type=prodigy"],
                          "sets its own step size")):
        with pytest.raises(ConfigError, match=named):
            validate_config(compose_config([*base, *extra]))
    for bad in ("hdet.range_test.steps=1", "hdet.range_test.low=0", "hdet.range_test.high=0.0001",
                "hdet.range_test.divisors.dense=0.5",
                "+hdet.range_test.divisors.other=10"):
        with pytest.raises(ConfigError, match="hdet.range_test"):
            validate_config(compose_config([*base, "trainer.nproc=2", "trainer.sharding_group_size=1", bad]))


def test_each_form_composes_only_its_own_keys_and_steps_0_names_the_controller():
    """Issue 57 item 4: hdet=enabled composes the range test's keys alone; a controller key under it is unknown and
    named as hdet=controller's (and the other way round); range_test.steps=0, which once ran the controller, is
    refused naming hdet=controller; --help lists each form's keys."""
    from conftest import config_error

    from recsys_hdet.api import compose_config

    layout = ["data=tiny", "trainer.nproc=2", "trainer.sharding_group_size=1"]
    assert set(compose_config([*layout, "hdet=enabled"]).hdet) == {"enabled", "range_test"}
    assert set(compose_config([*layout, "hdet=disabled"]).hdet) == {"enabled"}
    controller = compose_config([*layout, "hdet=controller"]).hdet
    assert "range_test" not in controller and {"alpha", "signal", "probe_rows", "sync_every"} <= set(controller)
    for overrides, needles in (
            (["hdet=enabled", "hdet.range_test.steps=0"], ["hdet.range_test.steps=0", "hdet=controller"]),
            (["hdet=enabled", "hdet.alpha=-5"], ["hdet.alpha: unknown key", "a key of hdet=controller"]),
            (["hdet=enabled", "hdet.signal=probe"], ["hdet.signal: unknown key", "a key of hdet=controller"]),
            (["hdet=controller", "hdet.range_test.steps=8"], ["hdet.range_test: unknown key", "a key of hdet=enabled"]),
            (["hdet.alpah=0.1"], ["hdet.alpah: unknown key", "did you mean hdet.alpha, a key of hdet=controller?"])):
        message = config_error(*layout, *overrides)
        for needle in needles:
            assert needle in message, message
    from recsys_hdet.train import usage

    text = usage()
    assert "keys of hdet=enabled (only with that option):" in text and "hdet.range_test.off_map=STR" in text
    assert "keys of hdet=controller (only with that option):" in text and "hdet.alpha=FLOAT" in text


def test_a_config_recorded_before_the_forms_had_their_own_keys_is_read_with_one_notice(tmp_path):
    """A run recorded while hdet=enabled composed every controller key reads in today's shape, with one line: the
    range test's (the controller keys it never read dropped), and the controller's of the era when hdet=enabled meant
    it (its overrides say so); today's shapes read as they are, silently. The retraining job's comparison with such
    a version's config refuses nothing and notes the line; a resolved config file of each form trains typed."""
    from omegaconf import OmegaConf

    from pipelines.settings import config_differences
    from recsys_hdet.api import compose_config
    from recsys_hdet.config import recorded_config
    from recsys_hdet.config_schema import check, structured
    from recsys_hdet.hdet.controller.config import ControllerForm
    from recsys_hdet.hdet.range_test.config import RangeTestForm

    layout = ["data=tiny", "trainer.nproc=2", "trainer.sharding_group_size=1"]
    now = compose_config([*layout, "hdet=enabled"])
    controller = OmegaConf.to_container(compose_config([*layout, "hdet=controller"]).hdet, resolve=True)
    today = OmegaConf.to_container(now, resolve=True)
    old_range_test = {**today, "hdet": {**controller, "enabled": True, "range_test": dict(today["hdet"]["range_test"])}}
    read, notice = recorded_config(old_range_test)
    assert read["hdet"] == today["hdet"]
    assert "controller that the range test never read" in notice and "read as hdet=enabled" in notice
    old_controller = {**today, "hdet": {**controller, "range_test": {**today["hdet"]["range_test"], "steps": 0}}}
    read, notice = recorded_config(old_controller, ["data=tiny", "hdet=enabled"])
    assert read["hdet"] == controller and "when that name meant HDET's controller" in notice
    assert "read as hdet=controller" in notice
    assert recorded_config(today) == (today, None)
    assert recorded_config({**today, "hdet": controller}, ["hdet=controller"]) == ({**today, "hdet": controller}, None)
    found = config_differences(OmegaConf.create(old_range_test), now, carry_lr=False, where="v0001")
    assert found.refused == [] and found.noted == [f"v0001: {recorded_config(old_range_test)[1]}"]
    assert type(check(structured(OmegaConf.create(today))).hdet) is RangeTestForm
    assert type(check(structured(OmegaConf.create({**today, "hdet": controller}))).hdet) is ControllerForm


# ----------------------------------------------------------------------------------------------
# A real 2-replica run


# Dropout on: the pass after the sweep draws the same masks as the plain run only if the generators came back.
COMMON = ["data=tiny", "trainer.log_every=5", "trainer.nproc=2", "trainer.sharding_group_size=1",
          "trainer.tensorboard=false", "model.dropout=0.1"]
# 12 sweep steps from x0.001 to x1e6: both sweeps reach their explosion on the tiny data.
RANGE_TEST = ["hdet=enabled", "hdet.range_test.steps=12", "hdet.range_test.low=0.001", "hdet.range_test.high=1000000"]
KEEP = "trainer.periodic_checkpoint.keep_at=[0.5]"  # a checkpoint kept mid-pass, to branch from


@pytest.mark.slow  # two 2-rank runs (~1.5 minutes on 2 cores); run by `make test-recovery` in CI
def test_after_the_commit_the_run_is_the_plain_run_at_the_committed_lrs_bit_for_bit(tmp_path, data_cache,
                                                                                   tiny_dataset):
    """The sweeps blow up (loss non-finite or cut at the explosion) and leave nothing behind: the committed run
    equals a plain run from the same step-0 state at the committed max LRs, step for step, bit for bit."""
    hdet_dir = tmp_path / "range_test"
    proc = run_train(hdet_dir, *COMMON, *RANGE_TEST, KEEP, "trainer.tensorboard=true", data_cache=data_cache)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    record = read_json(hdet_dir / "range_test.json")
    summary = read_json(hdet_dir / "summary.json")
    assert summary["status"] == "completed" and summary["hdet"]["form"] == "range_test"
    committed = record["committed"]
    assert summary["lr"]["controlled_max_lr"] == committed
    assert record["replica_axis"] == {"0": "embedding", "1": "dense"}
    assert record["dense_gradients_reduced_over"] == 1  # within each replica (one rank each), not the world
    assert {a: record["axes"][a]["ranks"] for a in LR_AXES} == {"embedding": [0], "dense": [1]}
    for axis in LR_AXES:  # each sweep exploded: cut by the rule, or a non-finite loss on its replica
        a = record["axes"][axis]
        assert a["cut_at"] is not None and not a["no_suggestion"], (axis, a)
        assert all(committed[g] == pytest.approx(record["start"][g] * a["multiplier"], rel=1e-5) for g in LR_AXES[axis])
    assert all(math.isfinite(v) for v in summary["train_loss"].values())

    plain_dir = tmp_path / "plain"
    proc = run_train(plain_dir, *COMMON, *(f"optim.lr.{g}={v!r}" for g, v in committed.items()), KEEP,
                     data_cache=data_cache)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    plain = read_json(plain_dir / "summary.json")
    assert (plain["eval"], plain["train_loss"], plain["steps"]) == (summary["eval"], summary["train_loss"],
                                                                     summary["steps"])
    hdet_records = {r["step"]: r for r in read_jsonl(hdet_dir / "metrics.jsonl")}
    for r in read_jsonl(plain_dir / "metrics.jsonl"):
        h = hdet_records[r["step"]]
        assert (r["lr"], r["loss"]) == (h["lr"], h["loss"]), r["step"]
    assert summary["lr"]["max_lr"] == committed and summary["lr"]["configured_max_lr"] == record["start"]
    assert summary["cost"]["range_test"] == {"steps": 12, "seconds": record["seconds"]}
    assert summary["cost"]["pass"]["steps"] == summary["steps"]
    assert summary["cost"]["total"]["steps"] == summary["steps"] + 12
    # The curves a person reads: per axis the multipliers, raw and smoothed loss, each replica's; in TensorBoard
    # (tensorboard/range_test) and in the evaluation report (checked in Chromium where it is installed).
    for axis in LR_AXES:
        a = record["axes"][axis]
        assert len(a["multipliers"]) == len(a["loss"]) == len(a["smoothed"]) == 12 and a["minimum_at"] is not None
        assert list(a["replicas"]) == [str(a["ranks"][0])]
        # the check of the curve (tests/test_range_check.py), recorded in both files
        assert isinstance(a["check"]["trusted"], bool)
        assert summary["hdet"]["range_test"]["axes"][axis]["check"] == a["check"]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(hdet_dir / "tensorboard" / "range_test"))
    events.Reload()
    tags = events.Tags()["scalars"]
    assert {f"range_test/{axis}/{c}" for axis in LR_AXES for c in ("loss", "smoothed", "log10_multiplier")} <= set(tags)
    assert len(events.Scalars("range_test/dense/log10_multiplier")) == 12
    ev = run_evaluate(f"run_dir={hdet_dir}", data_cache=data_cache)
    assert ev.returncode == 0, ev.stderr[-2000:]
    report = (hdet_dir / "report.html").read_text()
    assert "HDET: the range test on the replicas" in report and "committed max LRs" in report
    assert "HDET was off" not in report and "the rates the range test committed" in report
    if _chromium() and shutil.which("chromedriver"):
        declared, decoded, text = _render(hdet_dir / "report.html")
        assert decoded == declared and "the range test on the replicas" in text

    # A branch from the range-test run's kept checkpoint reuses its commit (no sweep: it starts mid-pass) and, at
    # the same settings, ends where that run ended, bit for bit.
    kept = next((hdet_dir / "checkpoint").glob("step-*"))
    branch = run_train(tmp_path / "branch", *COMMON, *RANGE_TEST, f"trainer.branch_from={kept}", data_cache=data_cache)
    assert branch.returncode == 0, branch.stdout[-3000:] + branch.stderr[-3000:]
    assert f"reusing the commit of {kept}" in branch.stdout and "HDET range test committed" not in branch.stdout
    b = read_json(tmp_path / "branch" / "summary.json")
    assert (b["eval"], b["lr"]["max_lr"]) == (summary["eval"], committed)
    assert not (tmp_path / "branch" / "range_test.json").exists()
    # From a plain run's checkpoint, or with other sweep settings, there is no commit to reuse: refused at launch.
    plain_kept = next((plain_dir / "checkpoint").glob("step-*"))
    for source, extra, says in ((plain_kept, [f"optim.lr.{g}={v!r}" for g, v in committed.items()],
                                 "committed no range-test rates"),
                                (kept, ["hdet.range_test.steps=10"], "hdet.range_test.steps (12 -> 10)")):
        refused = run_train(tmp_path / "refused", *COMMON, *RANGE_TEST, *extra, f"trainer.branch_from={source}",
                            data_cache=data_cache)
        assert refused.returncode == 2 and says in refused.stderr, refused.stderr[-2000:]
        assert not (tmp_path / "refused" / "metrics.jsonl").exists()


def test_a_layout_of_one_replica_names_the_fix_and_a_pass_shorter_than_the_sweep_is_refused_at_launch(
        tmp_path, data_cache, tiny_dataset):
    """hdet=enabled on the default layout (4 workers, one sharding group of 4) names the sharding group that gives 2
    replicas; a sweep longer than the pass is refused before any worker starts: exit 2, one line, nothing trained."""
    from recsys_hdet.api import compose_config
    from recsys_hdet.config import validate_config
    from recsys_hdet.config_values import ConfigError

    with pytest.raises(ConfigError, match=r"trainer.nproc=4 / trainer.sharding_group_size=4 makes 1: set "
                                          r"trainer.sharding_group_size=2 \(2 replicas of 2 ranks\)"):
        validate_config(compose_config(["data=tiny", "hdet=enabled"]))
    proc = run_train(tmp_path / "short", *COMMON, "hdet=enabled", "hdet.range_test.steps=100000", data_cache=data_cache)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and "the pass has only" in proc.stderr and "hdet.range_test.steps <=" in proc.stderr
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "short" / "metrics.jsonl").exists()


@pytest.mark.slow  # one 3-rank run (~1 minute on 2 cores)
def test_three_replicas_sweep_the_embedding_twice_and_pool_it(tmp_path, data_cache, tiny_dataset):
    """R = 3 (three sharding groups of one rank): replicas 0 and 2 sweep the embedding on their own data, replica 1
    the dense groups; the embedding's curve is the lower median of the two, each kept in the record."""
    run_dir = tmp_path / "r3"
    proc = run_train(run_dir, "data=tiny", "trainer.log_every=5", "trainer.nproc=3", "trainer.sharding_group_size=1",
                     "trainer.tensorboard=false", *RANGE_TEST, data_cache=data_cache)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    record = read_json(run_dir / "range_test.json")
    assert record["replica_axis"] == {"0": "embedding", "1": "dense", "2": "embedding"}
    emb = record["axes"]["embedding"]
    assert emb["ranks"] == [0, 2] and sorted(emb["replicas"]) == ["0", "2"]
    two = [emb["replicas"][r]["loss"] for r in ("0", "2")]
    assert two[0] != two[1]  # each replica swept on its own rows
    for k, pooled in enumerate(emb["loss"]):
        values = sorted(v if v is not None else math.inf for v in (two[0][k], two[1][k]))
        assert (pooled if pooled is not None else math.inf) == values[0]  # the lower median of two
    assert read_json(run_dir / "summary.json")["status"] == "completed"


def test_a_snapshot_restores_fbgemm_s_step_counters_and_the_next_steps_are_the_same():
    """The step-0 restore after a sweep (components.train_state.Snapshot of a ModelState): fbgemm's kernels count
    their steps twice, ``iter`` (checkpointed) and the host copy ``iter_cpu`` their updates read, re-read from
    ``iter`` only while it is 0; both come back, and the steps after the restore repeat the steps after the
    snapshot bit for bit (weights and optimizer state)."""
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (ComputeDevice, EmbeddingLocation,
                                                                         SplitTableBatchedEmbeddingBagsCodegen)

    from recsys_hdet.components.train_state import ModelState, RNGState, Snapshot

    torch.manual_seed(0)
    tbe = SplitTableBatchedEmbeddingBagsCodegen([(50, 4, EmbeddingLocation.HOST, ComputeDevice.CPU)],
                                                optimizer=EmbOptimType.EXACT_ROWWISE_ADAGRAD, learning_rate=0.1)
    model = torch.nn.ModuleDict({"tbe": tbe, "dense": torch.nn.Sequential(torch.nn.Dropout(0.3), torch.nn.Linear(4, 1))})
    optimizer = torch.optim.Adam(model["dense"].parameters())

    def step():
        out = model["dense"](tbe(torch.tensor([1, 2, 3, 7]), torch.tensor([0, 2, 4]))).sum()
        out.backward()
        optimizer.step()
        optimizer.zero_grad()
        return float(out)

    for _ in range(3):
        step()
    saved = Snapshot(ModelState(model, optimizer), RNGState())
    first = [step() for _ in range(4)]
    after = (tbe.split_embedding_weights()[0].clone(), [p.clone() for p in model["dense"].parameters()])
    assert (int(tbe.iter), int(tbe.iter_cpu)) == (7, 7)
    saved.restore()
    assert (int(tbe.iter), int(tbe.iter_cpu)) == (3, 3)
    again = [step() for _ in range(4)]
    assert again == first  # the dropout masks too: the generator came back
    assert torch.equal(tbe.split_embedding_weights()[0], after[0])
    assert all(torch.equal(a, b) for a, b in zip(model["dense"].parameters(), after[1]))
