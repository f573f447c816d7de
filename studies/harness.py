"""``python -m studies.harness --convert RUNS_DIR RESULTS``: records every finished run directory under
RUNS_DIR in a study's results file (how the committed studies' run directories were replaced by their lines).

This module is the command alone. The study library it uses has one module per concern (docs/architecture.md):
:mod:`studies.results` (the results file), :mod:`studies.record` (one run's line), :mod:`studies.runs`
(training a study's runs, ``--verify``, :func:`studies.runs.convert`), :mod:`studies.contract` (the fairness
contract), :mod:`studies.provenance` (the commit a run trains from), :mod:`studies.stats` (paired
differences), :mod:`studies.lr_area` (a run's LRs against its preset's), :mod:`studies.trajectory` (an HDET
run's controlled LRs), :mod:`studies.reporting` (a report's files), and the shared definitions
:mod:`studies.starts` and :mod:`studies.hdet_forms`.
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from studies.results import load
from studies.runs import convert


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m studies.harness", description=__doc__.split("\n\n")[0])
    ap.add_argument("--convert", nargs=2, metavar=("RUNS_DIR", "RESULTS"), required=True,
                    help="record every finished run directory under RUNS_DIR (named by its path there) in RESULTS")
    args = ap.parse_args(argv)
    runs, results = args.convert
    added = convert(runs, results)
    print(f"{results}: {added} runs added, {len(load(results))} in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
