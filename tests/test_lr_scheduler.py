import math

import pytest
import torch

from recsys_hdet.components.lr_scheduler import GroupLRScheduler, OneCycle


@pytest.mark.parametrize("three_phase", [False, True])
@pytest.mark.parametrize("anneal", ["cos", "linear"])
def test_one_cycle_equals_torch_one_cycle_lr_step_for_step(three_phase, anneal):
    total = 997
    params = [torch.nn.Parameter(torch.zeros(1)) for _ in range(2)]
    opt = torch.optim.Adam([{"params": [params[0]]}, {"params": [params[1]]}], lr=1.0)
    ref = torch.optim.lr_scheduler.OneCycleLR(
        opt, max_lr=[0.03, 0.5], total_steps=total, pct_start=0.27, anneal_strategy=anneal,
        three_phase=three_phase, div_factor=25.0, final_div_factor=1e4,
    )
    ours = [OneCycle(m, total, pct_start=0.27, anneal_strategy=anneal, three_phase=three_phase) for m in (0.03, 0.5)]
    for step in range(total):
        for g, sched in zip(opt.param_groups, ours):
            lr, mom = sched(step)
            assert lr == g["lr"], (step, lr, g["lr"])
            assert mom == g["betas"][0]
        opt.step()
        ref.step() if step + 1 < total else None


def test_one_cycle_ends_at_its_floor():
    s = OneCycle(0.01, 100)
    assert s(99)[0] == pytest.approx(s.min_lr, rel=1e-12)
    assert s.min_lr == pytest.approx(0.01 / 25 / 1e4)


def test_group_scheduler_writes_lr_and_beta1_per_named_group():
    groups = {"a": [{"lr": 0.0, "betas": (0.9, 0.999)}], "b": [{"lr": 0.0}, {"lr": 0.0}]}
    sched = GroupLRScheduler(groups, {"a": OneCycle(0.1, 10), "b": OneCycle(1.0, 10)})
    for _ in range(4):
        sched.step()
    assert groups["a"][0]["lr"] == OneCycle(0.1, 10)(4)[0]
    assert groups["a"][0]["betas"] == (OneCycle(0.1, 10)(4)[1], 0.999)
    assert groups["b"][0]["lr"] == groups["b"][1]["lr"] == OneCycle(1.0, 10)(4)[0]
    state = sched.state_dict()
    groups2 = {"a": [{"lr": 0.0, "betas": (0.9, 0.999)}], "b": [{"lr": 0.0}]}
    sched2 = GroupLRScheduler(groups2, {"a": OneCycle(0.1, 10), "b": OneCycle(1.0, 10)})
    sched2.load_state_dict(state)
    assert groups2["a"][0]["lr"] == groups["a"][0]["lr"]


def test_one_cycle_rejects_empty_schedule():
    with pytest.raises(ValueError, match="total_steps"):
        OneCycle(0.1, 0)


def test_cut_learning_rates_and_start_at_of_the_plain_schedule():
    groups = {"a": [{"lr": 0.0, "betas": (0.9, 0.999)}], "b": [{"lr": 0.0, "betas": (0.9, 0.999)}]}
    schedules = {"a": OneCycle(0.01, 100), "b": OneCycle(0.2, 100)}
    sched = GroupLRScheduler(groups, schedules)
    sched.start_at(40)  # a branch takes over at step 40
    assert groups["a"][0]["lr"] == schedules["a"](40)[0] and groups["b"][0]["lr"] == schedules["b"](40)[0]
    sched.cut_learning_rates(0.5)
    sched.step()
    assert groups["a"][0]["lr"] == pytest.approx(0.5 * schedules["a"](41)[0], rel=1e-15)
    resumed = GroupLRScheduler(groups, schedules)
    resumed.load_state_dict(sched.state_dict())
    assert groups["b"][0]["lr"] == pytest.approx(0.5 * schedules["b"](41)[0], rel=1e-15)
    assert resumed.current_lrs()["b"] == groups["b"][0]["lr"]


# --- each group's own decay (optim.schedule.groups) ---------------------------------------------------------------

GROUPS = ("embedding", "transformer", "non_embedding", "no_decay")


def _optim(*overrides):
    from recsys_hdet.config import compose, validate_config

    cfg = compose("config", ["+experiment=baseline_low", *overrides])
    validate_config(cfg)
    return cfg.optim


def _lrs(schedules, total):
    """Every group's (lr, beta1) at every step as the plain control writes them (GroupLRScheduler)."""
    groups = {g: [{"lr": 0.0, "betas": (0.9, 0.999)}] for g in schedules}
    sched = GroupLRScheduler(groups, schedules)
    out = {g: [] for g in schedules}
    for step in range(total):
        for g, pgs in groups.items():
            out[g].append((pgs[0]["lr"], pgs[0]["betas"][0]))
        sched.step()
    return out


@pytest.mark.parametrize("overrides", [(), ("optim.schedule.groups.embedding.decay_start=0.3",
                                            "optim.schedule.groups.no_decay.anneal_strategy=cos")])
def test_groups_left_unset_train_on_the_shared_one_cycle_bit_for_bit(overrides):
    """Nothing set (or only the one-cycle's own values): every group's LR and beta1 at every step equal torch's
    OneCycleLR at the group's max LR exactly, as before per-group decay existed."""
    from recsys_hdet.components.lr_scheduler import build_schedules

    optim, total = _optim(*overrides), 961
    schedules = build_schedules(optim, GROUPS, total)
    assert all(type(s) is OneCycle for s in schedules.values())
    ours = _lrs(schedules, total)
    params = [torch.nn.Parameter(torch.zeros(1)) for _ in GROUPS]
    opt = torch.optim.Adam([{"params": [p]} for p in params], lr=1.0)
    ref = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=[float(optim.lr[g]) for g in GROUPS], total_steps=total,
                                              pct_start=0.3, anneal_strategy="cos", div_factor=25.0,
                                              final_div_factor=1e4)
    for step in range(total):
        for g, pg in zip(GROUPS, opt.param_groups):
            assert ours[g][step] == (pg["lr"], pg["betas"][0]), (g, step)
        opt.step()
        ref.step() if step + 1 < total else None


@pytest.mark.parametrize("strategy", ["cos", "linear"])
def test_a_group_s_own_decay_rises_with_the_others_holds_its_peak_then_anneals_to_the_same_floor(strategy):
    from recsys_hdet.components.lr_scheduler import DelayedDecay, build_schedules

    total = 1000
    optim = _optim("optim.schedule.groups.embedding.decay_start=0.7",
                   f"optim.schedule.groups.embedding.anneal_strategy={strategy}")
    schedules = build_schedules(optim, GROUPS, total)
    emb, shared = schedules["embedding"], OneCycle(float(optim.lr.embedding), total)
    assert isinstance(emb, DelayedDecay) and all(type(schedules[g]) is OneCycle for g in GROUPS[1:])
    up, held = 0.3 * total - 1, 0.7 * total - 1
    for step in range(total):
        if step <= up:  # the rise is the shared one-cycle's, bit for bit
            assert emb(step) == shared(step)
        elif step <= held:  # the peak, held; Adam's beta1 at its base
            assert emb(step) == (emb.max_lr, 0.85)
        else:
            lr, momentum = emb(step)
            pct = (step - held) / (total - 1 - held)
            expected = (emb.max_lr - emb.min_lr) * ((1 + math.cos(math.pi * pct)) / 2 if strategy == "cos" else 1 - pct)
            assert lr == pytest.approx(emb.min_lr + expected, rel=1e-12)
            assert 0.85 <= momentum <= 0.95
    assert emb(total - 1)[0] == pytest.approx(shared(total - 1)[0], rel=1e-12) == pytest.approx(shared.min_lr)
    assert emb(total - 1)[1] == pytest.approx(0.95)
    # decay_start at the rise's end with the shared shape computes the one-cycle's values exactly
    same = DelayedDecay(0.05, total, decay_start=0.3, decay_strategy="cos")
    assert [same(s) for s in range(total)] == [OneCycle(0.05, total)(s) for s in range(total)]


def test_each_group_s_schedule_is_described_for_the_summary():
    from recsys_hdet.components.lr_scheduler import build_schedules, describe_schedules

    optim = _optim("optim.schedule.groups.transformer.decay_start=0.5",
                   "optim.schedule.groups.transformer.anneal_strategy=linear")
    d = describe_schedules(build_schedules(optim, GROUPS, 100, {"embedding": 7.0}))
    assert d["transformer"] == {"schedule": "one_cycle", "shared": False, "max_lr": 0.001,
                                "min_lr": pytest.approx(0.001 / 25 / 1e4), "pct_start": 0.3, "decay_start": 0.5,
                                "shape": "linear"}
    assert d["embedding"]["shared"] and d["embedding"]["decay_start"] == 0.3 and d["embedding"]["shape"] == "cos"
    assert d["embedding"]["max_lr"] == 7.0  # a committed rate is the peak the group trains at


@pytest.mark.parametrize("overrides, key, says", [
    (("optim.schedule.groups.embedding.decay_start=0.2",), "optim.schedule.groups.embedding.decay_start",
     "[optim.schedule.pct_start=0.3, 1)"),
    (("optim.schedule.groups.transformer.decay_start=1.0",), "optim.schedule.groups.transformer.decay_start", "1)"),
    (("optim.schedule.groups.embedding.anneal_strategy=sqrt",), "optim.schedule.groups.embedding.anneal_strategy",
     "cos, linear"),
    (("optim.schedule.groups.embedding.decay_strat=0.5",), "optim.schedule.groups.embedding.decay_strat",
     "did you mean optim.schedule.groups.embedding.decay_start"),
    (("optim.schedule.groups.no_decay.decay_start=0.5", "optim.schedule.three_phase=true"),
     "optim.schedule.groups.no_decay", "three_phase"),
    (("optim.schedule.groups.embedding.decay_start=0.5", "optim.schedule.name=range_test"),
     "optim.schedule.groups.embedding", "optim.schedule.name=range_test would not read it"),
    (("optim.schedule.groups.non_embedding.decay_start=0.5", "optim.dense.type=schedulefree_adamw"),
     "optim.schedule.groups.non_embedding", "Schedule-Free AdamW"),
    (("optim.schedule.groups.transformer.anneal_strategy=linear", "hdet=controller"),
     "optim.schedule.groups.transformer", "hdet=controller"),
])
def test_what_cannot_work_is_refused_naming_the_key(overrides, key, says):
    from conftest import config_error

    message = config_error("+experiment=baseline_low", *overrides)
    assert key in message and says in message, message


def test_what_can_work_is_accepted():
    """hdet=enabled commits the peaks and the pass trains on each group's decay; Schedule-Free keeps the embedding
    group's one-cycle, whose decay it reads; Prodigy's LRs are multipliers of its step under the schedule."""
    for overrides in (("hdet=enabled", "optim.schedule.groups.embedding.decay_start=0.7"),
                      ("optim.dense.type=schedulefree_adamw", "optim.schedule.groups.embedding.decay_start=0.7"),
                      ("optim.dense.type=prodigy", "optim.schedule.groups.no_decay.decay_start=0.7"),
                      ("hdet=controller", "optim.schedule.groups.embedding.decay_start=0.3")):  # the shared shape
        _optim(*overrides)


def test_a_config_recorded_before_the_groups_existed_reads_as_the_shared_one_cycle():
    """Resume, branch and the retraining job's settings check compare recorded configs key by key: one recorded
    without optim.schedule.groups is the run that trained every group on the one-cycle."""
    from omegaconf import OmegaConf

    from recsys_hdet.config import compose, recorded_config
    from recsys_hdet.config_values import flatten
    from recsys_hdet.resume import ADDED_KEYS, config_changes

    now = OmegaConf.to_container(compose("config", ["+experiment=baseline_low"]), resolve=True)
    old = OmegaConf.to_container(compose("config", ["+experiment=baseline_low"]), resolve=True)
    del old["optim"]["schedule"]["groups"]
    read, _ = recorded_config(old)
    assert read["optim"]["schedule"]["groups"] == now["optim"]["schedule"]["groups"]
    assert config_changes(old, now) == ([], [])
    assert {k: v for k, v in flatten(now).items() if k.startswith("optim.schedule.groups.")} == \
        {k: v for k, v in ADDED_KEYS.items() if k.startswith("optim.schedule.groups.")}
    later = OmegaConf.to_container(compose("config", ["+experiment=baseline_low",
                                                      "optim.schedule.groups.embedding.decay_start=0.5"]), resolve=True)
    assert config_changes(old, later)[0] == ["optim.schedule.groups.embedding.decay_start"]


def test_lr_find_sweeps_without_the_groups_decay_and_suggests_their_peaks():
    from recsys_hdet.config import validate_config
    from recsys_hdet.lr_find import check_config, sweep_config
    from recsys_hdet.components.lr_scheduler import own_decays
    from recsys_hdet.config import compose

    cfg = compose("config", ["+experiment=baseline_low", "optim.schedule.groups.embedding.decay_start=0.7"])
    check_config(cfg)
    for axis in ("embedding", "dense"):
        sweep = sweep_config(cfg, axis)
        assert own_decays(sweep.optim.schedule) == {} and sweep.optim.schedule.name == "range_test"
        validate_config(sweep)


def test_the_plain_control_s_summary_names_each_group_s_schedule_as_trained():
    from recsys_hdet.components.lr_scheduler import build_schedules
    from recsys_hdet.lr_control import ScheduledLR

    class Optimizer:
        groups = {g: [{"lr": 0.0, "betas": (0.9, 0.999)}] for g in GROUPS}

        def apply_hparams(self):
            pass

    optim = _optim("optim.schedule.groups.embedding.decay_start=0.5")
    control = ScheduledLR(Optimizer(), build_schedules(optim, GROUPS, 50, {"embedding": 3.0}), True, 50, 1,
                          record={"lr": {"controlled_max_lr": {"embedding": 3.0}}})
    lr = control.summary(1.0)["lr"]
    assert lr["controlled_max_lr"] == {"embedding": 3.0}  # the form's record kept beside it
    assert lr["schedule"]["embedding"]["decay_start"] == 0.5 and not lr["schedule"]["embedding"]["shared"]
    assert lr["schedule"]["embedding"]["max_lr"] == 3.0
    assert all(lr["schedule"][g]["shared"] and lr["schedule"][g]["decay_start"] == 0.3 for g in GROUPS[1:])
