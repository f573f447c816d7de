"""The ``hdet`` config group: its options, each form's schema, and a config recorded before each form had its own.

- ``hdet=disabled``: :class:`recsys_hdet.hdet.form.HDETForm` (``enabled`` alone: plain data-parallel training), the
  base of the others and the type of the training schema's ``hdet`` field, so that Hydra takes the chosen option's
  own schema (conf/hdet/<option>.yaml names ``<option>_schema`` in its defaults) and a key of another form is an
  unknown key.
- ``hdet=enabled``: :class:`recsys_hdet.hdet.range_test.config.RangeTestForm`, the range test on the replicas.
- ``hdet=controller``: :class:`recsys_hdet.hdet.controller.config.ControllerForm`, the paper's controller.

Each form's keys are declared once, in its own subpackage; :func:`recsys_hdet.hdet.form.hdet_form` names a config's
form (typed or as a run recorded it); :func:`recorded_hdet` reads a config recorded before the forms had their own
schemas. The one module that knows both forms (the subpackages import nothing of each other). Import-light.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

from recsys_hdet.hdet.controller.config import ControllerForm
from recsys_hdet.hdet.form import HDETForm
from recsys_hdet.hdet.range_test.config import RangeTestForm

# The ``hdet`` group's options and their schemas (conf/hdet/<option>.yaml names ``<option>_schema``).
FORM_SCHEMAS = {"disabled": HDETForm, "enabled": RangeTestForm, "controller": ControllerForm}
SCHEMA_OF_FORM = {"plain": HDETForm, "range_test": RangeTestForm, "controller": ControllerForm}


def recorded_hdet(hdet: Mapping[str, Any], overrides: Sequence[str] = ()) -> Tuple[Dict[str, Any], Optional[str]]:
    """A run's recorded ``hdet`` node in today's shape, and one line saying how it was read when it was recorded
    before each form had its own schema (None when it is today's shape).

    Until then ``hdet=enabled`` composed every controller key: first meaning the controller (before the range test
    had a name: ``range_test.steps`` 0 or absent), then the range test (``range_test.steps`` > 0), the controller's
    keys recorded beside it but never read. A plain run recorded them too (never read). ``overrides``: the run's
    command-line overrides (Hydra's), which tell an old ``hdet=enabled`` that meant the controller from
    ``hdet=controller``, where the keys cannot (without them that run is read as the controller it trained, and
    no line says so)."""
    h = dict(hdet or {})
    said_enabled = "hdet=enabled" in overrides
    if not h.get("enabled"):
        return {"enabled": False}, None  # plain: any other key recorded was never read
    steps = int((h.get("range_test") or {}).get("steps") or 0)
    if steps > 0:
        today = {"enabled": True, "range_test": dict(h["range_test"])}
        extra = sorted(set(h) - set(today))
        return today, (f"recorded with hdet=enabled's old config, which also held {len(extra)} keys of HDET's "
                       "controller that the range test never read (hdet.alpha, ...): read as hdet=enabled without "
                       "them") if extra else None
    controller = {k: v for k, v in h.items() if k != "range_test"}  # range_test.steps 0: the controller's, unread
    return controller, ("recorded with hdet=enabled when that name meant HDET's controller (before the range test "
                        "on the replicas took it): read as hdet=controller") if said_enabled else None
