"""The ``hdet`` config group's base schema and the name of a config's form.

Each HDET form's schema extends :class:`HDETForm` with the keys that form reads, in its own subpackage
(:class:`recsys_hdet.hdet.range_test.config.RangeTestForm`, :class:`recsys_hdet.hdet.controller.config.ControllerForm`);
:mod:`recsys_hdet.hdet.config` maps the group's options to them. Import-light (no torch).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class HDETForm:
    """The ``hdet`` config group's base schema, and ``hdet=disabled``'s whole one: plain data-parallel training.
    Each form's schema extends it with the keys that form reads (:class:`RangeTestForm`, :class:`ControllerForm`);
    the chosen option's yaml names its schema (``defaults: [enabled_schema]``), so Hydra refuses another form's
    key as unknown."""
    enabled: bool = False   # false: plain data-parallel training (every replica the same hyperparameters)


def hdet_form(hdet: Any) -> str:
    """The form a config's ``hdet`` node trains with: ``plain``, ``range_test`` (``hdet=enabled``) or ``controller``
    (``hdet=controller``), told by its keys, so that a config read back from a run (untyped) is named as the
    typed one it was composed as."""
    if isinstance(hdet, HDETForm):  # the typed config (config_schema.check's): only the range test's has range_test
        return "plain" if not hdet.enabled else "range_test" if hasattr(hdet, "range_test") else "controller"
    if not hdet or not hdet.get("enabled"):
        return "plain"
    # A config recorded before the forms had their own schemas held range_test.steps 0 under the controller.
    return "range_test" if int((hdet.get("range_test") or {}).get("steps") or 0) > 0 else "controller"
