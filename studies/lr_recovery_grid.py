"""The recovery study's lattice (:mod:`studies.lr_recovery`): its cells, the plateau around the best cell,
the rule that grows the neighbourhood, and the cells as the results file's JSON reads them.

A cell is one point of the lattice (half a decade apart on each axis) with every plain run trained there: the
neighbourhood's runs and the plain runs of the starts, which are named by their cell, so the same seed at the
same point is one run.
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Dict, List, Optional, Sequence, Tuple

from recsys_hdet.constants import DENSE_GROUPS
from studies.contract import outcome

# The lattice the grid's cells lie on: each axis's LRs are GRID_CENTRE x 10^(k/2) (5 points span 100x).
GRID_CENTRE = {"embedding": 0.06, "dense": 0.003}
POINTS = 5  # the lattice's spacing: GRID_CENTRE x 10^(-1 + 2k / (POINTS - 1))


def grid_lr(centre: float, points: int, k: int) -> float:
    """The k-th LR of a grid axis; k outside 0..points-1 continues the axis beyond its ends."""
    return centre * 10 ** (-1 + 2 * k / (points - 1))


def grid_index(lr: float, centre: float, points: int) -> Optional[int]:
    """The grid index of ``lr`` on an axis (inverse of :func:`grid_lr`); None when it is off the lattice."""
    x = (math.log10(lr / centre) + 1) * (points - 1) / 2
    k = round(x)
    return k if abs(x - k) < 1e-3 else None


def grid_name(i: int, j: int) -> str:
    return f"grid/e{i}_d{j}"


class Cell:
    def __init__(self, i: int, j: int, embedding: float, dense: float) -> None:
        self.i, self.j, self.embedding, self.dense = i, j, embedding, dense
        self.ne: Dict[int, Optional[float]] = {}  # seed -> mean NE over the tasks; None: failed
        self.runs: List[str] = []

    @property
    def key(self) -> Tuple[int, int]:
        return self.i, self.j

    @property
    def failed(self) -> bool:
        """A cell where any seed failed (diverged or collapsed): not a safe place to train."""
        return any(v is None for v in self.ne.values())

    @property
    def mean(self) -> Optional[float]:
        return None if self.failed or not self.ne else statistics.fmean(self.ne.values())


def cell_lrs(i: int, j: int) -> Tuple[float, float]:
    return grid_lr(GRID_CENTRE["embedding"], POINTS, i), grid_lr(GRID_CENTRE["dense"], POINTS, j)


def cell_of(embedding: float, dense: float) -> Optional[Tuple[int, int]]:
    i, j = grid_index(embedding, GRID_CENTRE["embedding"], POINTS), grid_index(dense, GRID_CENTRE["dense"], POINTS)
    return None if i is None or j is None else (i, j)


def plain_cells(records: Dict[str, Dict[str, Any]]) -> Dict[Tuple[int, int], Cell]:
    """The lattice's cells from a results file: every finished plain run named ``grid/...``."""
    cells: Dict[Tuple[int, int], Cell] = {}
    for name in sorted(records):
        r = records[name]
        result = outcome(r)
        if r.get("hdet") or result is None or not name.startswith("grid/"):
            continue
        dense = [r["max_lr"][g] for g in DENSE_GROUPS]
        key = cell_of(r["max_lr"]["embedding"], dense[0])
        if key is None or max(dense) > min(dense) * (1 + 1e-6):
            continue
        cell = cells.setdefault(key, Cell(*key, *cell_lrs(*key)))
        cell.runs.append(name)
        cell.ne[r["seed"]] = r["mean_ne"] if result == "completed" else None
    return cells


def near(a: Cell, b: Cell, decades: float = 0.5) -> bool:
    """Whether ``b`` lies within ``decades`` of ``a`` on both axes (half a decade: the 8 grid neighbours)."""
    return all(abs(math.log10(x / y)) <= decades + 1e-9 for x, y in ((a.embedding, b.embedding), (a.dense, b.dense)))


def plateau_analysis(cells: Dict[Tuple[int, int], Cell]) -> Optional[Dict[str, Any]]:
    """The best cell, each cell's paired difference from it, and the plateau.

    - best: the completed cell with the lowest mean NE (a cell with a failed seed is not a candidate);
    - paired difference: the mean over the seeds a cell shares with the best of (cell - best) on the
      same seed;
    - pooled paired std: the root of the dof-weighted mean variance of those differences over every cell
      that shares 2+ seeds with the best. One std for every cell: a cell's own std from 3 seeds would let
      a noisy cell in and keep a steady one out;
    - plateau: every completed cell whose paired difference is within one pooled paired std of the best,
      and not within half a decade of a failed cell (:func:`near`).
    None when no cell has completed; ``plateau`` None while no cell shares 2+ seeds with the best."""
    done = {k: c for k, c in cells.items() if c.mean is not None}
    if not done:
        return None
    best = min(done, key=lambda k: (done[k].mean, k))
    b = done[best]
    stats: Dict[Tuple[int, int], Dict[str, Any]] = {}
    num = den = 0.0
    pool: List[Tuple[int, int]] = []
    for k, c in sorted(done.items()):
        shared = sorted(set(c.ne) & set(b.ne))
        diffs = [c.ne[s] - b.ne[s] for s in shared]
        if len(diffs) >= 2 and k != best:
            num += (len(diffs) - 1) * statistics.variance(diffs)
            den += len(diffs) - 1
            pool.append(k)
        stats[k] = {"diff": statistics.fmean(diffs) if diffs else c.mean - b.mean, "shared_seeds": shared}
    pooled = math.sqrt(num / den) if den else None
    failed = [c for c in cells.values() if c.failed]
    plateau = None
    if pooled is not None:
        plateau = []
        for k, st in stats.items():
            st["within"] = st["diff"] <= pooled
            st["near_failed"] = any(near(done[k], d) for d in failed)
            if st["within"] and not st["near_failed"]:
                plateau.append(k)
    excluded = [k for k, st in stats.items() if st.get("within") and st.get("near_failed")]
    return {"best": best, "stats": stats, "pooled_std": pooled, "pool": pool, "plateau": plateau,
            "near_failed": excluded if pooled is not None else [],
            "missing_neighbours": missing_neighbours(cells, best)}


AROUND = tuple((di, dj) for di in (-1, 0, 1) for dj in (-1, 0, 1))


def missing_neighbours(cells: Dict[Tuple[int, int], Cell], key: Tuple[int, int]) -> List[Tuple[int, int]]:
    """The 8 grid neighbours of ``key`` that have no finished run."""
    return [(key[0] + di, key[1] + dj) for di, dj in AROUND if (di, dj) != (0, 0)
            and (key[0] + di, key[1] + dj) not in cells]


def neighbourhood_runs(cells: Dict[Tuple[int, int], Cell], seeds: Sequence[int],
                       anchor: Tuple[int, int]) -> List[Tuple[int, int, int]]:
    """The (i, j, seed) runs still to train: every seed on the anchor's cell and its 8 neighbours, then on
    the best cell's (:func:`plateau_analysis`) and its 8 neighbours' while it lacks one. A caller repeats
    it until it returns nothing (each answer depends on the runs before)."""
    def around(key: Tuple[int, int]) -> List[Tuple[int, int, int]]:
        return [(key[0] + di, key[1] + dj, s) for di, dj in AROUND for s in seeds
                if s not in (cells.get((key[0] + di, key[1] + dj)).ne if (key[0] + di, key[1] + dj) in cells else {})]

    todo = around(anchor)
    if todo:
        return todo
    an = plateau_analysis(cells)
    return around(an["best"]) if an else []


def cell_json(c: Cell, an: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    out = {"embedding": c.embedding, "dense": c.dense, "ne": c.mean,
           "status": "failed" if c.failed else "completed", "seeds": sorted(c.ne), "runs": c.runs}
    if an is not None and c.key in an["stats"]:
        out["paired_diff"] = an["stats"][c.key]["diff"]
    return out


def plateau_json(cells: Dict[Tuple[int, int], Cell], an: Dict[str, Any]) -> Dict[str, Any]:
    pooled = an["pooled_std"]
    keys = an["plateau"] or []
    # Each cell stands for the LRs within half a grid step of it (a quarter decade).
    half = 10 ** (1 / (POINTS - 1))
    lr_range = {axis: [min(getattr(cells[k], axis) for k in keys) / half,
                       max(getattr(cells[k], axis) for k in keys) * half] if keys else None
                for axis in ("embedding", "dense")}
    rule = {"paired_std_pooled": pooled, "std": "pooled",
            "pooled_from": [{"embedding": cells[k].embedding, "dense": cells[k].dense, "seeds": sorted(cells[k].ne)}
                            for k in an["pool"]],
            "lr_range": lr_range,
            "left_out_near_failed": [{"embedding": cells[k].embedding, "dense": cells[k].dense, "ne": cells[k].mean,
                                      "paired_diff": an["stats"][k]["diff"]} for k in an["near_failed"]],
            "text": "cells whose mean paired difference from the best cell is within one pooled paired std (pooled "
                    "over every cell sharing 2+ seeds with the best), not within half a decade (factor sqrt(10) on "
                    "each axis) of a failed cell; the LR range extends half a grid step beyond the plateau's outer cells"}
    return {"cells": [{**cell_json(cells[k], an), "runs": None} for k in keys] if an["plateau"] is not None else None,
            "rule": rule, "lr_range": lr_range}

