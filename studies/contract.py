"""The fairness contract every comparison of contenders runs under (docs/studies.md, "The fairness contract").

Every run a study trains through :func:`studies.runs.run_one` gets the same rows (``data.reserve_rows``: the
probe rows are reserved from every contender's days, not only from HDET's) and the same rollback settings
(:class:`Contract`: its overrides come first, and a study cannot change them for one run), and is judged by
the same failure rule (:func:`outcome`: a diverged run, or one that ends at the base-rate predictor,
:data:`COLLAPSED_NE`, has failed); :func:`paired_over_seeds` pairs two contenders only on the seeds where
both completed and refuses runs that trained different rows (:func:`check_same_rows`). A study invocation
that would break the contract or its results file raises :class:`StudyMismatch`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence

from studies.stats import paired


class StudyMismatch(ValueError):
    """A study invocation that would break its results file: other overrides than a finished run's,
    a dirty tree writing a committed file, a pairing across different trained rows."""


@dataclass(frozen=True)
class Contract:
    """What every contender of a comparison gets: the same trained rows (``reserve_rows`` reserved from
    each training day by every run, so that a probe signal's rows are outside every run's training
    rows) and the same rollback (on for all: ``max_rollbacks`` restores at ``lr_factor`` each)."""

    reserve_rows: int = 4096
    max_rollbacks: int = 3
    rollback_lr_factor: float = 0.5

    def overrides(self) -> List[str]:
        return [f"data.reserve_rows={self.reserve_rows}", f"trainer.rollback.max_rollbacks={self.max_rollbacks}",
                f"trainer.rollback.lr_factor={self.rollback_lr_factor}"]

    def apply(self, overrides: Sequence[str]) -> List[str]:
        """The contract's overrides, then the study's; a study override of a contract key is refused."""
        keys = {o.split("=", 1)[0] for o in self.overrides()}
        clash = [o for o in overrides if o.split("=", 1)[0].lstrip("+") in keys]
        if clash:
            raise StudyMismatch(f"{clash}: the fairness contract sets these keys for every contender "
                                f"({self.overrides()}); a study cannot change them for one run")
        return [*self.overrides(), *overrides]


CONTRACT = Contract()
# A run whose held-out NE reaches this on any task predicts (about) the base rate: it has failed,
# whatever its status says (NE 1 is the base-rate predictor's; above it, worse than that).
COLLAPSED_NE = 0.999


def outcome(record: Optional[Mapping[str, Any]]) -> Optional[str]:
    """"completed", "failed" (diverged, or completed at NE >= COLLAPSED_NE on some task, i.e. at or
    below the base-rate predictor) or None (no result: not run, crashed, stopped)."""
    if record is None:
        return None
    if record.get("status") == "diverged":
        return "failed"
    if record.get("status") != "completed":
        return None
    return "failed" if collapsed(record) else "completed"


def collapsed(record: Mapping[str, Any]) -> bool:
    """A completed run whose held-out NE on some task is at the base-rate predictor's or worse."""
    return any(m["ne"] >= COLLAPSED_NE for m in (record.get("eval") or {}).values())


def check_same_rows(a: Mapping[str, Any], b: Mapping[str, Any]) -> None:
    """Refuses to pair two runs that trained different rows (their ``rows`` records differ)."""
    if a.get("rows") != b.get("rows"):
        raise StudyMismatch(f"{a.get('name')} and {b.get('name')} trained different rows "
                            f"({a.get('rows')} vs {b.get('rows')}): no paired difference across them")


def paired_over_seeds(contender: Mapping[int, Mapping[str, Any]], reference: Mapping[int, Mapping[str, Any]],
                      value=lambda r: r["mean_ne"]) -> Dict[str, Any]:
    """contender - reference on every seed where both completed (:func:`outcome`), with the 95%
    interval (:func:`studies.stats.paired`); the failures of each side are reported beside, never paired.
    Records that trained different rows are refused (:func:`check_same_rows`)."""
    seeds = sorted(set(contender) & set(reference))
    for s in seeds:
        check_same_rows(contender[s], reference[s])
    both = [s for s in seeds if outcome(contender[s]) == "completed" and outcome(reference[s]) == "completed"]
    return {"diff": paired([value(contender[s]) - value(reference[s]) for s in both]), "seeds": both,
            "failed": sorted(s for s in contender if outcome(contender[s]) == "failed"),
            "reference_failed": sorted(s for s in reference if outcome(reference[s]) == "failed")}
