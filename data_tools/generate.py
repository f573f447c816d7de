"""``python -m data_tools.generate`` (``recsys-hdet-generate``): the synthetic generator's command.

``--out DIR [--seed N --n-users N ...]``: a new raw data set (:func:`data_tools.synthetic.generate`:
KuaiRand-schema CSVs with a known ground truth, ``oracle.json``); or ``--append-to ROOT [--days N]``:
the next N (default 1) days of the processed synthetic data set ROOT (built by ``ensure_dataset``),
from the same ground truth with the drift continued, converted into ROOT in place
(:func:`data_tools.prepare.append_synthetic_days`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from data_tools.errors import DataError
from data_tools.prepare import append_synthetic_days
from data_tools.synthetic import GeneratorConfig, generate
from data_tools.exit_status import ExitStatus


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m data_tools.generate", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    target = ap.add_mutually_exclusive_group(required=True)
    target.add_argument("--out", help="write a new raw data set (CSVs + oracle.json) into this directory")
    target.add_argument("--append-to", metavar="ROOT",
                        help="a processed synthetic data set: append its next --days days (default 1) in place")
    fields = dataclasses.fields(GeneratorConfig)
    for f in fields:
        ap.add_argument("--" + f.name.replace("_", "-"), type=type(f.default), default=None,
                        help=f"default {f.default}" + (" (with --append-to: days to append, default 1)"
                                                       if f.name == "days" else ""))
    args = ap.parse_args(argv)
    given = {f.name: getattr(args, f.name) for f in fields if getattr(args, f.name) is not None}
    if args.append_to is not None:
        other = sorted(k for k in given if k != "days")
        if other:
            ap.error(f"--append-to uses the data set's own generator config; "
                     f"--{other[0].replace('_', '-')} cannot be given with it")
        try:
            new = append_synthetic_days(args.append_to, given.get("days", 1))
        except DataError as e:
            print(f"ERROR: {e}", file=sys.stderr)
            return ExitStatus.USAGE
        print(f"appended {len(new)} day(s) to {args.append_to}: {', '.join(new)}")
        return 0
    try:
        cfg = GeneratorConfig(**given)  # its checks name the field and the value
        oracle = generate(cfg, args.out, verbose=True)
    except DataError as e:
        print(f"ERROR: {e}", file=sys.stderr)
        return ExitStatus.USAGE
    print(json.dumps(oracle, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
