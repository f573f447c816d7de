"""The HDET forms more than one study runs, each spelled out as its overrides so that a study does not move
when the product's defaults do: the product's default, :data:`HDET_ANNEAL_EFFECT` (the recovery study's
``hdet`` contender and the base of its controller variants; the paired set ``local_sgd``'s form).
"""

from __future__ import annotations

# The controller the recovery study chose (conf/hdet/controller.yaml), spelled out so that the study does not move when the
# defaults do: the anneal-then-probe signal (4 cooldown steps to LR 0 on reserved rows, probed,
# restored) under the effect-size controller (docs/results/hdet_history.md).
HDET_ANNEAL_EFFECT = ("hdet=controller", "hdet.space=log", "hdet.score=effect", "hdet.signal=anneal_probe",
                      "hdet.anneal_probe.steps=4", "hdet.effect_scale=0.005", "hdet.min_t=2.0", "hdet.alpha=0.25",
                      "hdet.controller_start=0", "hdet.beta=0.9")
