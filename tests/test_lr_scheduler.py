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
