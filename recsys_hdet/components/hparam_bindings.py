"""The model's and the loss's scalar knobs beyond the learning rate, as setters: the dropout rate, the
attention temperature, the loss's label smoothing (:class:`LossSettings`, read by the training step).

The training job sets them from the config; HDET explores them through these setters
(:mod:`recsys_hdet.hdet.controller.explored`). This module knows nothing of HDET.
"""

from __future__ import annotations

from torch import nn


class LossSettings:
    """Mutable loss knobs the training step reads each step."""

    def __init__(self, label_smoothing: float = 0.0) -> None:
        self.label_smoothing = label_smoothing


def set_dropout(model: nn.Module, p: float) -> None:
    for m in model.modules():
        if isinstance(m, nn.Dropout):
            m.p = p
        elif isinstance(m, nn.MultiheadAttention):
            m.dropout = p


def set_temperature(model: nn.Module, t: float) -> None:
    for m in model.modules():
        if hasattr(m, "attention_temperature"):
            m.attention_temperature = t
