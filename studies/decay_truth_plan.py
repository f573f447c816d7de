"""The decay truth study's plan (:mod:`studies.decay_truth`), defined up front as data: its variants (each group's
decay start and shape, :data:`VARIANTS`), its rate sources (:data:`RATES`), each variant's overrides, and which
runs the study trains (:func:`runs`: a schedule that two variants share is one run).

Every variant differs from the reference (:data:`REFERENCE`, the shared one-cycle) only in *when and how* each
group anneals: the rise (30% of the pass, the preset's ``optim.schedule.pct_start``), the peak rates and the floor
are the reference's. The rise is shared, so no group anneals before 30% of the pass: a group anneals "earlier"
than another by the other holding its peak longer (``optim.schedule.groups.<group>.decay_start``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from recsys_hdet.constants import DENSE_GROUPS, PARAM_GROUPS
from studies.range_tests import HDET_RANGE_TEST
from studies.starts import lr_overrides

# The shared one-cycle every variant is a change of: baseline_low's (the schema's) rise end and anneal shape.
PCT_START = 0.3
SHARED_SHAPE = "cos"
# Where the slower groups start to anneal in the one-group-fastest variants, and a WSD tail's start (its last 20%).
LATE = 0.7
WSD_START = 0.8
# The landscape: (embedding decay start, dense decay start) on this grid, every dense group alike.
GRID = (0.3, 0.5, 0.7)
REFERENCE = "shared"


@dataclass(frozen=True)
class Variant:
    name: str
    family: str                                  # reference | embedding | dense_fastest | paper | shape | grid
    what: str                                    # one line for the report
    decay: Tuple[Tuple[str, float, str], ...]    # (group, decay_start, shape) for every group, PARAM_GROUPS' order

    @property
    def uniform(self) -> bool:
        """Every group on one schedule: a change of the shared schedule, not a separate ordering."""
        return len({(start, shape) for _, start, shape in self.decay}) == 1

    def of(self, group: str) -> Tuple[float, str]:
        return next((start, shape) for g, start, shape in self.decay if g == group)


def _variant(name: str, family: str, what: str, starts: Optional[Mapping[str, float]] = None,
             shapes: Optional[Mapping[str, str]] = None) -> Variant:
    starts, shapes = dict(starts or {}), dict(shapes or {})
    return Variant(name, family, what, tuple((g, float(starts.get(g, PCT_START)), str(shapes.get(g, SHARED_SHAPE)))
                                             for g in PARAM_GROUPS))


def _dense(start: float) -> Dict[str, float]:
    return {g: start for g in DENSE_GROUPS}


def _fastest(group: str) -> Variant:
    others = {g: LATE for g in DENSE_GROUPS if g != group}
    return _variant(f"{group}_fastest", "dense_fastest",
                    f"{group} anneals from the rise's end, the other dense groups hold their peak to {LATE}", others)


_NAMED = (
    _variant(REFERENCE, "reference", "the shared one-cycle: every group cos from the rise's end (0.3)"),
    _variant("emb_early", "embedding", f"the embedding anneals earlier: from 0.3, the dense groups from {LATE}",
             _dense(LATE)),
    _variant("emb_late", "embedding", f"the embedding anneals later: from {LATE}, the dense groups from 0.3",
             {"embedding": LATE}),
    *(_fastest(g) for g in DENSE_GROUPS),
    _variant("paper_ordering", "paper", "the paper's reported ordering: transformer fastest (0.3), non_embedding "
             "0.5, no_decay slowest (0.7); the embedding shared",
             {"transformer": 0.3, "non_embedding": 0.5, "no_decay": 0.7}),
    _variant("shape_linear", "shape", "every group linear from 0.3 (the shape alone)",
             shapes={g: "linear" for g in PARAM_GROUPS}),
    _variant("shape_wsd", "shape", f"a warm-stable-decay tail: every group holds its peak to {WSD_START}, then "
             "linear over the last 20%", {g: WSD_START for g in PARAM_GROUPS}, {g: "linear" for g in PARAM_GROUPS}),
)
_GRID = tuple(_variant(f"grid_e{e:g}_d{d:g}", "grid", f"the embedding from {e:g}, every dense group from {d:g}",
                       {"embedding": e, **_dense(d)}) for e in GRID for d in GRID)
VARIANTS: Dict[str, Variant] = {v.name: v for v in (*_NAMED, *_GRID)}

# Where the pass's peak rates come from, at the setting's best cell (the recovery study's anchor).
RATES: Dict[str, str] = {
    "best_cell": "plain at the best cell's rates",
    "range_test": "hdet=enabled from the best cell (100-step sweep, x0.001-x10000, divisors 10 and 20): the pass "
                  "trains at the rates its range test commits (each run commits its own, before its pass)",
}


def variant_overrides(variant: Variant) -> List[str]:
    """The overrides that give each group its decay: only what differs from the shared one-cycle (a variant equal to
    it has none)."""
    out = []
    for group, start, shape in variant.decay:
        if start != PCT_START:
            out.append(f"optim.schedule.groups.{group}.decay_start={start:g}")
        if shape != SHARED_SHAPE:
            out.append(f"optim.schedule.groups.{group}.anneal_strategy={shape}")
    return out


def rate_overrides(rates: str, anchor: Tuple[float, float]) -> List[str]:
    """The peak rates' overrides: the best cell's max LRs, and under ``range_test`` the range test on the replicas
    as the product ships it (:data:`studies.range_tests.HDET_RANGE_TEST`), sweeping from them."""
    if rates not in RATES:
        raise ValueError(f"rates {rates!r}: one of {', '.join(RATES)}")
    return [*lr_overrides(*anchor), *(HDET_RANGE_TEST if rates == "range_test" else ())]


def owner(name: str) -> str:
    """The variant whose run ``name``'s schedule trains on: the first variant of :data:`VARIANTS` with the same
    decay (``grid_e0.3_d0.3`` is ``shared``'s run; ``grid_e0.3_d0.7`` is ``emb_early``'s)."""
    decay = VARIANTS[name].decay
    return next(v.name for v in VARIANTS.values() if v.decay == decay)


def run_base(rates: str, variant: str) -> str:
    """The run's name in the results file, less its seed: ``<rates>/<owner variant>``."""
    return f"{rates}/{owner(variant)}"


def runs(rates: Sequence[str], variants: Sequence[str], seeds: Sequence[int],
         anchor: Tuple[float, float]) -> List[Tuple[str, int, List[str]]]:
    """The distinct runs of ``variants`` (the reference always among them) at each rate source: (base name, seed,
    overrides), the reference's first, each schedule once, in :data:`VARIANTS`' order."""
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise ValueError(f"variants {unknown}: not variants of the study (the variants: {', '.join(VARIANTS)})")
    owners = list(dict.fromkeys(owner(v) for v in (REFERENCE, *(v for v in VARIANTS if v in variants))))
    return [(run_base(r, o), seed, [*rate_overrides(r, anchor), *variant_overrides(VARIANTS[o])])
            for r in rates for o in owners for seed in seeds]
