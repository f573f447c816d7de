"""``python -m data_tools.generate`` (``recsys-hdet-generate``): the synthetic generator's command.

``out=DIR [seed=N n_users=N ...]``: a new raw data set (:func:`data_tools.synthetic.generate`:
KuaiRand-schema CSVs with a known ground truth, ``oracle.json``); or ``out=ROOT append=true [days=N]``:
the next N (default 1) days of the processed synthetic data set ROOT (built by ``ensure_dataset``),
from the same ground truth with the drift continued, converted into ROOT in place
(:func:`data_tools.prepare.append_synthetic_days`).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import Optional

from data_tools.cli_args import opt, parse, usage_error
from data_tools.errors import DataError
from data_tools.prepare import append_synthetic_days
from data_tools.synthetic import generate
from data_tools.synthetic_config import GeneratorConfig
from data_tools.exit_status import ExitStatus


def _arguments() -> type:
    """The command's arguments: ``out``, ``append`` and every field of :class:`GeneratorConfig` (None: its
    default)."""
    fields = [("out", str, opt("???", "a new raw data set (CSVs + oracle.json) to write; with append=true, the "
                                      "processed synthetic data set to add days to", "DIR")),
              ("append", bool, opt(False, "true: append out's next days (days=N, default 1) in place"))]
    for f in dataclasses.fields(GeneratorConfig):
        kind = type(f.default)
        fields.append((f.name, Optional[kind], opt(None, "with append=true: days to append (default 1)" if
                                                   f.name == "days" else "", kind.__name__.upper(),
                                                   shown=f"default {f.default}")))
    return dataclasses.make_dataclass("GenerateArgs", fields)


def main(argv=None):
    schema = _arguments()
    args = parse(argv, schema, "python -m data_tools.generate", __doc__,
                 {"--out": "out=DIR", "--append-to": "out=ROOT append=true"})
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(GeneratorConfig)
             if getattr(args, f.name) is not None}
    if args.append:
        other = sorted(k for k in given if k != "days")
        if other:
            usage_error(f"append=true uses the data set's own generator config; {other[0]} cannot be given with it")
        try:
            new = append_synthetic_days(args.out, given.get("days", 1))
        except DataError as e:
            print(f"ERROR: {e}", file=sys.stderr)
            return ExitStatus.USAGE
        print(f"appended {len(new)} day(s) to {args.out}: {', '.join(new)}")
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
