"""Explore-then-commit's hand-over in a real run: after the last exploration round HDET hands the pass to
the plain LR control at the held max LRs, so from there the run is bit for bit the plain run branched from
its state with those LRs (the exploration costs nothing afterwards). Real 2-process runs on tiny data: two
sharding groups of one rank, so the embedding's LR has two replicas to explore as well as the dense ones."""
import math

import pytest
from omegaconf import OmegaConf

from conftest import read_json, read_jsonl, run_train

COMMON = ["data=tiny", "trainer.log_every=5", "trainer.nproc=2", "trainer.sharding_group_size=1",
          "data.reserve_rows=1024", "trainer.tensorboard=false"]
# Two rounds of 10 steps (a decade, then half of one, between the two replicas), anneal-then-probe scored
# on the 1024 reserved rows (2 x 256 of them for the cooldown).
EXPLORE = ["hdet=controller", "hdet.explore_rounds=2", "hdet.explore_steps=10", "hdet.sync_every=5",
           "hdet.probe_rows=1024", "hdet.anneal_probe.steps=2"]
COMMIT_STEP = 20

pytestmark = pytest.mark.slow  # two 2-rank runs (~2 minutes on 2 cores): the default run's budget; `make test-all`


def test_after_the_commit_the_run_is_the_plain_run_branched_from_its_state_at_the_held_lrs(tmp_path, data_cache,
                                                                                           tiny_dataset):
    """Mutants: syncs (and the signal's cooldown) going on after the commit, the held LRs not reaching the
    plain schedule, the embedding replicas averaged at HDET's cadence after the commit."""
    hdet_dir = tmp_path / "hdet"
    proc = run_train(hdet_dir, *COMMON, *EXPLORE, "trainer.periodic_checkpoint.keep_at=[0.5]",
                     data_cache=data_cache)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    hdet = read_json(hdet_dir / "summary.json")
    assert hdet["status"] == "completed" and hdet["hdet"]["handed_over_at"] == COMMIT_STEP, hdet["hdet"]
    syncs = read_jsonl(hdet_dir / "hdet.jsonl")
    assert [r["step"] for r in syncs] == [10, COMMIT_STEP], "no sync after the commit"
    held = hdet["lr"]["controlled_max_lr"]
    hdet_lrs = {r["step"]: r["lr"] for r in read_jsonl(hdet_dir / "metrics.jsonl")}
    assert set(held) == {"embedding", "transformer", "non_embedding", "no_decay"}
    # Each round moves the base to one of its two replicas (never x1): every group's held LR moved.
    configured = OmegaConf.load(hdet_dir / ".hydra" / "config.yaml").optim.lr
    for g in held:
        best = [r["hparams"][f"lr/{g}"]["best_multiplier"] for r in syncs]
        assert all(m is not None and m != 1.0 for m in best), (g, best)
        assert held[g] == pytest.approx(float(configured[g]) * math.prod(best), rel=1e-9), (g, held[g], best)

    kept = sorted(int(p.name.split("-")[1]) for p in (hdet_dir / "checkpoint").glob("step-*"))
    assert len(kept) == 1 and kept[0] >= COMMIT_STEP, kept  # taken after the step's sync: the committed state
    ckpt = hdet_dir / "checkpoint" / f"step-{kept[0]}"
    plain_dir = tmp_path / "plain"
    proc = run_train(plain_dir, *COMMON, f"trainer.branch_from={ckpt}",
                     *(f"optim.lr.{g}={v!r}" for g, v in held.items()), data_cache=data_cache)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    plain = read_json(plain_dir / "summary.json")
    assert (plain["eval"], plain["train_loss"], plain["steps"]) == (hdet["eval"], hdet["train_loss"], hdet["steps"])
    for r in read_jsonl(plain_dir / "metrics.jsonl"):  # the same learning rates, step for step, bit for bit
        assert r["lr"] == hdet_lrs[r["step"]], (r["step"], r["lr"], hdet_lrs[r["step"]])
