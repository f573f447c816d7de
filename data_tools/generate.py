"""``python -m data_tools.generate`` (``recsys-hdet-generate``): the synthetic generator's command.

``out=DIR [seed=N n_users=N ...]``: a new raw data set (:func:`data_tools.synthetic.generate`:
KuaiRand-schema CSVs with a known ground truth, ``oracle.json``); or ``append=true data.root=DIR [days=N]``:
the next N (default 1) days of the processed synthetic data set DIR (built by ``ensure_dataset``),
from the same ground truth with the drift continued, converted into DIR in place
(:func:`data_tools.prepare.append_synthetic_days`). As in every command, a data set read or changed is
``data.root=``, what the command writes new is ``out=`` (``out=`` with ``append=true`` is refused naming it).
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
from data_tools.field_docs import field_docs


@dataclasses.dataclass
class AppendTo:
    """``data.root=DIR``: the processed synthetic data set that ``append=true`` adds days to."""
    root: Optional[str] = opt(None, metavar="DIR")


def _arguments() -> type:
    """The command's arguments: ``out``, ``append``, ``data.root`` and every field of :class:`GeneratorConfig`
    (None: its default)."""
    fields = [("out", Optional[str], opt(None, "the new raw data set (CSVs + oracle.json) to write", "DIR",
                                         shown="required unless append=true")),
              ("append", bool, opt(False, "true: append the next days (days=N, default 1) to data.root in place")),
              ("data", AppendTo, opt(factory=AppendTo, help="with append=true: the processed synthetic data set "
                                                             "to add days to"))]
    docs = field_docs(GeneratorConfig)
    for f in dataclasses.fields(GeneratorConfig):
        kind = type(f.default)
        fields.append((f.name, Optional[kind], opt(None, docs.get(f.name, ""), kind.__name__.upper(),
                                                   shown=f"default {f.default}" + ("; 1 with append=true"
                                                                                   if f.name == "days" else ""))))
    return dataclasses.make_dataclass("GenerateArgs", fields)


def main(argv=None):
    schema = _arguments()
    args = parse(argv, schema, "python -m data_tools.generate", __doc__,
                 {"--out": "out=DIR", "--append-to": "data.root=DIR append=true"})
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(GeneratorConfig)
             if getattr(args, f.name) is not None}
    if args.append:
        if args.out is not None:
            usage_error(f"out={args.out} with append=true is no longer accepted: the data set days are added to is "
                        "read and changed, not written new; use data.root=DIR")
        if args.data.root is None:
            usage_error("config data.root: missing (pass data.root=DIR with append=true)")
        other = sorted(k for k in given if k != "days")
        if other:
            usage_error(f"append=true uses the data set's own generator config; {other[0]} cannot be given with it")
        try:
            new = append_synthetic_days(args.data.root, given.get("days", 1))
        except DataError as e:
            print(f"error: {e}", file=sys.stderr)
            return ExitStatus.USAGE
        print(f"appended {len(new)} day(s) to {args.data.root}: {', '.join(new)}")
        return 0
    if args.data.root is not None:
        usage_error(f"data.root={args.data.root}: only with append=true; a new raw data set is out=DIR")
    if args.out is None:
        usage_error("config out: missing (pass out=DIR, or append=true data.root=DIR)")
    try:
        cfg = GeneratorConfig(**given)  # its checks name the field and the value
        oracle = generate(cfg, args.out, verbose=True)
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return ExitStatus.USAGE
    print(json.dumps(oracle, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
