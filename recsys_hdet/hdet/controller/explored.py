"""Where explored hyperparameters beyond the learning rate take effect (docs/method.md: other hyperparameters).

Each builder returns one :class:`~recsys_hdet.hdet.controller.engine.ScalarHParam` whose ``apply`` writes
this replica's value into the model, the optimizer or the loss (through the setters of
:mod:`recsys_hdet.components.hparam_bindings`), on the step it changes:
- ``dropout`` (additive, clamped to [0, max]): every ``nn.Dropout`` module's ``p`` and every
  ``nn.MultiheadAttention``'s attention dropout;
- ``weight_decay`` (multiplicative): the decoupled weight decay (AdamW) of the dense groups that
  decay (transformer, non_embedding); TorchRec's fused rowwise Adagrad has no decoupled decay, so
  the embedding group is not decayed;
- ``temperature`` (multiplicative): the interaction block's attention temperature;
- ``label_smoothing`` (additive, clamped to [0, max]): the BCE targets' smoothing.
Their base schedule is constant (the configured starting value); with ``decay: schedule`` a
constant schedule means no drift, so only the replicas' losses move the base.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping

from torch import nn

from recsys_hdet.components.hparam_bindings import LossSettings, set_dropout, set_temperature
from recsys_hdet.hdet.hparams import ReplicaAxis, ScalarHParam

EXPLORABLE = ("dropout", "weight_decay", "temperature", "label_smoothing")


def build_explored_hparams(
    explore: Mapping[str, Any],
    starts: Mapping[str, float],
    model: nn.Module,
    dense_groups: Mapping[str, List[Dict[str, Any]]],
    loss: LossSettings,
    axis: ReplicaAxis,
) -> List[ScalarHParam]:
    """One ScalarHParam per configured entry of ``hdet.explore`` (``None`` entries are skipped)."""
    unknown = sorted(set(explore) - set(EXPLORABLE))
    if unknown:
        raise ValueError(f"config hdet.explore.{unknown[0]}: unknown; explorable: {list(EXPLORABLE)}")
    hparams: List[ScalarHParam] = []
    for name in EXPLORABLE:
        spec = explore.get(name)
        if spec is None:
            continue
        start = float(starts[name])
        constant = lambda step, v=start: v
        if name == "dropout":
            hparams.append(ScalarHParam(
                "dropout", axis, constant, floor=0.0, ceiling=float(spec["max"]),
                apply=lambda v: set_dropout(model, v), space="additive", spread=float(spec["spread"])))
        elif name == "label_smoothing":
            hparams.append(ScalarHParam(
                "label_smoothing", axis, constant, floor=0.0, ceiling=float(spec["max"]),
                apply=lambda v: setattr(loss, "label_smoothing", v), space="additive", spread=float(spec["spread"])))
        elif name == "weight_decay":
            decayed = [pg for g in ("transformer", "non_embedding") for pg in dense_groups.get(g, [])]

            def apply_wd(v: float, groups=decayed) -> None:
                for pg in groups:
                    pg["weight_decay"] = v

            hparams.append(ScalarHParam(
                "weight_decay", axis, constant, floor=float(spec.get("min", 0.0)),
                ceiling=float(spec["max_multiple"]) * start, apply=apply_wd, spread=float(spec["spread"])))
        elif name == "temperature":
            hparams.append(ScalarHParam(
                "temperature", axis, constant, floor=float(spec["min"]), ceiling=float(spec["max"]),
                apply=lambda v: set_temperature(model, v), spread=float(spec["spread"])))
    return hparams
