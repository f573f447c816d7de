"""studies.probe_bias's reading of a run's signal: the joint slope fit recovers planted effects."""
import json

import numpy as np
import pytest

from studies.probe_bias import GROUPS, probe_slopes


def test_probe_slopes_recover_each_group_s_planted_effect(tmp_path):
    """Four ranks, embedding spread over 2 blocks of 2 ranks, the dense groups per rank, independent
    permutations each sync; losses = sum_g slope_g * log2(multiplier_g) + noise. The joint fit must
    recover every slope, though any single group's correlation is confounded by the others."""
    rng = np.random.default_rng(0)
    planted = {"embedding": -3e-4, "transformer": 1e-4, "non_embedding": 2e-4, "no_decay": 0.0}
    offsets4, offsets2 = np.array([-1.0, -1 / 3, 1 / 3, 1.0]), np.array([-1.0, 1.0])
    with open(tmp_path / "hdet.jsonl", "w") as f:
        for step in range(1, 201):
            hp, loss = {}, np.full(4, 0.2)
            for g in GROUPS:
                u = rng.permutation(offsets2 if g == "embedding" else offsets4)
                values = [1e-3 * 2.0 ** x for x in u]
                hp[f"lr/{g}"] = {"base": 1e-3, "values": values}
                per_rank = np.repeat(u, 2) if g == "embedding" else u
                loss += planted[g] * per_rank  # log2(value / base) = u
            loss += rng.normal(0, 2e-5, 4)
            f.write(json.dumps({"step": step, "losses": loss.tolist(), "hparams": hp}) + "\n")
    from data_tools.fileio import read_jsonl

    for half in probe_slopes(read_jsonl(str(tmp_path / "hdet.jsonl"))):
        for g in GROUPS:
            assert half[g] == pytest.approx(planted[g], abs=1e-5), (g, half)
