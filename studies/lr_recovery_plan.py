"""The recovery study's plan (:mod:`studies.lr_recovery`): its starts (:data:`studies.starts.STARTS`, those
recorded in the results file from an earlier ``--start``, and those passed with ``--start``) and which contender
is trained at which start (:func:`planned`).
"""

from __future__ import annotations

import math
import os
import re
from typing import Any, Dict, Optional, Sequence, Tuple

from data_tools.fileio import read_json
from recsys_hdet.constants import DENSE_GROUPS
from studies.contract import StudyMismatch
from studies.lr_recovery_contenders import CONTROLLER_VARIANTS, RANGE_TEST_VARIANTS, RETIRED_VARIANTS
from studies.provenance import REPO
from studies.starts import STARTS

# What each start of :data:`studies.starts.STARTS` is.
START_LABELS = {
    "best": "the best cell: the plateau start",
    "old_tuned": "embedding 10x low, dense 3x high: the earlier study's 'tuned' start",
    "all_low": "every group 10x low", "all_high": "every group 10x high",
    "emb_low_dense_high": "embedding 10x low, dense 10x high", "emb_high_dense_low": "embedding 10x high, dense 10x low",
    "emb_low": "embedding 10x low, dense at the best cell",
    "emb_low_30": "embedding 30x low, dense at the best cell", "all_high_3": "every group 3x high",
}
# The starts the study had before the range test on the replicas: the controller forms are planned at these only.
EARLIER_STARTS = ("best", "old_tuned", "all_low", "all_high", "emb_low_dense_high", "emb_high_dense_low", "emb_low")
# The controller issue's variants run only at the best start and the four starts its targets name; at old_tuned
# and emb_high_dense_low they are "not planned" (a run recorded there is read, and not counted as planned): the
# pre-registered rule's step 1 (which reads every start) already excludes every variant at the best start.
CONTROLLER_STARTS = ("best", "all_low", "all_high", "emb_low_dense_high", "emb_low")
# The range test on the replicas' kill test (studies/range_commit.py, ``range_commit`` there): the form runs in
# full only once it has passed (docs/results/hdet_history.md, range-test-rule 1).
KILL_TEST_FILE = os.path.join(REPO, "docs", "results", "lr_truth", "lr_truth.json")


def range_test_verdict(path: str = KILL_TEST_FILE) -> str:
    """The current form's kill-test verdict: "passed", "killed" or "pending" (no table yet)."""
    return str(((read_json(path) or {}).get("range_commit") or {}).get("verdict", "pending"))


def planned(variant: str, start: str, contenders: Optional[Sequence[str]] = None) -> bool:
    """Whether ``variant`` is trained at ``start``. The controller forms (``hdet`` and the controller issue's
    variants) are dominated: planned only where they were before (``hdet`` at :data:`EARLIER_STARTS`, the
    variants at :data:`CONTROLLER_STARTS`), never at a newer start; the retired finder nowhere; the range test
    on the replicas only once its kill test passed (:func:`range_test_verdict`); every other contender at every
    start, a ``--start`` start included. ``contenders`` (a setting's: :attr:`studies.settings.Setting.contenders`)
    plans those alone; the range test's revised rule is planned only where a setting names it (it was fitted on the
    benchmark: hdet_history.md, range-rule-revised)."""
    if variant in RETIRED_VARIANTS or (contenders is not None and variant not in contenders):
        return False
    if variant in RANGE_TEST_VARIANTS:
        return range_test_verdict() == "passed" and (variant == "hdet_range_test" or contenders is not None)
    if variant in CONTROLLER_VARIANTS:
        return start in CONTROLLER_STARTS
    if variant == "hdet":
        return start in EARLIER_STARTS
    return True


# ----------------------------------------------------------------------------------------------
# Starts from the command line (--start NAME=EMB_FACTOR,DENSE_FACTOR) and from the results file.

START_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
SHARED_PREFIXES = ("grid", "prodigy")  # run names shared across starts (run_name_of): not a start's name
# The contenders whose runs train at the start's own LRs: a start's factors are read back from their lines.
AT_START_LRS = ("plain_rollback", "schedulefree", *RANGE_TEST_VARIANTS)


def parse_start(text: str) -> Tuple[str, Tuple[float, float]]:
    """A ``--start`` value, ``NAME=EMB_FACTOR,DENSE_FACTOR``: (name, (embedding factor, dense factor)), factors of
    the anchor. StudyMismatch, naming the problem, for a malformed value or a factor that is not a positive
    finite number."""
    name, eq, factors = text.partition("=")
    if not eq or not START_NAME.fullmatch(name) or name in SHARED_PREFIXES:
        raise StudyMismatch(f"--start {text}: expected NAME=EMB_FACTOR,DENSE_FACTOR, NAME of letters, digits, "
                            f"'_', '.', '-' (not {' or '.join(SHARED_PREFIXES)})")
    parts = factors.split(",")
    if len(parts) != 2:
        raise StudyMismatch(f"--start {text}: expected two factors, EMB_FACTOR,DENSE_FACTOR (got {len(parts)})")
    out = []
    for axis, part in zip(("embedding", "dense"), parts):
        try:
            x = float(part)
        except ValueError:
            raise StudyMismatch(f"--start {text}: the {axis} factor {part!r} is not a number") from None
        if not math.isfinite(x) or x <= 0:
            raise StudyMismatch(f"--start {text}: the {axis} factor {part} is not a positive finite number")
        out.append(x)
    return name, (out[0], out[1])


def same_factors(a: Tuple[float, float], b: Tuple[float, float]) -> bool:
    """Two starts' factors name one point (to the 6 significant digits a start's LRs carry)."""
    return all(math.isclose(x, y, rel_tol=1e-5) for x, y in zip(a, b))


def extra_starts(texts: Sequence[str], recorded: Dict[str, Tuple[float, float]]) -> Dict[str, Tuple[float, float]]:
    """The starts the ``--start`` values add to :data:`STARTS`: parsed (:func:`parse_start`), and refused
    (StudyMismatch) where a NAME is already a start, of :data:`STARTS`, of ``recorded`` (:func:`recorded_starts`)
    or an earlier value, with other factors. A value repeating a start of :data:`STARTS` adds nothing."""
    out: Dict[str, Tuple[float, float]] = {}
    for text in texts:
        name, factors = parse_start(text)
        have = out.get(name) or STARTS.get(name) or recorded.get(name)
        if have is not None and not same_factors(have, factors):
            raise StudyMismatch(f"--start {text}: the start {name!r} exists with factors {have[0]:.6g},{have[1]:.6g}; "
                                "choose another NAME")
        if name not in STARTS:
            out[name] = have or factors
    return out


def recorded_starts(records: Dict[str, Dict[str, Any]], anchor: Tuple[float, float]) -> Dict[str, Tuple[float, float]]:
    """The starts outside :data:`STARTS` that have results lines (a start once passed with ``--start``): from each
    line ``{name}/{contender}/seed{n}`` of a contender trained at the start's own LRs (:data:`AT_START_LRS`), the
    factors max LR / anchor (embedding; the first dense group), 6 significant digits. StudyMismatch when one
    name's lines disagree."""
    found: Dict[str, Tuple[float, float]] = {}
    for name in sorted(records):
        parts = name.split("/")
        if len(parts) != 3 or parts[0] in STARTS or parts[0] in SHARED_PREFIXES or parts[1] not in AT_START_LRS:
            continue
        lr = records[name].get("max_lr") or {}
        if "embedding" not in lr or DENSE_GROUPS[0] not in lr:
            continue
        factors = (float(f"{lr['embedding'] / anchor[0]:.6g}"), float(f"{lr[DENSE_GROUPS[0]] / anchor[1]:.6g}"))
        if parts[0] in found and not same_factors(found[parts[0]], factors):
            raise StudyMismatch(f"{name}: trained at factors {factors} of the anchor, where the start {parts[0]!r}'s "
                                f"other lines have {found[parts[0]]}")
        found.setdefault(parts[0], factors)
    return found

