"""Rewrite a processed data set's day files in layout 2: the same rows in the same order, cut into
row groups of ``row_group_rows`` rows, the unit ``data.read=own_row_groups`` deals to the ranks.

    python -m data_tools.relayout data.root=DIR [row_group_rows=N]

Each day file is written beside itself and moved into place (``os.replace``) once its rows and
columns are checked against the original; the meta file's ``layout`` is replaced last. A run that is
killed half way leaves every day file whole (some rewritten, which reads the same under
``whole_day``) and the meta file at layout 1; run it again to finish. It holds the data set's lock
(``DIR.lock``, the one appends and ``ensure_dataset`` take). Exit status 2 on a bad data set.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys

import polars as pl

from data_tools import contract as C
from data_tools.cli_args import DataSet, opt, parse
from data_tools.errors import DataError, data_error
from data_tools.exit_status import ExitStatus
from data_tools.fileio import file_lock, write_json_atomic
from data_tools.validate import _load_meta, miscut_row_group, row_group_sizes, validate_day_file


def relayout(root: str, row_group_rows: int = C.ROW_GROUP_ROWS, verbose: bool = False) -> dict:
    """Rewrite ``root`` in layout 2 (see the module docstring); returns the new meta. A data set
    already in layout 2 with the same ``row_group_rows`` is left as it is."""
    if isinstance(row_group_rows, bool) or not isinstance(row_group_rows, int) or row_group_rows < 1:
        raise DataError(f"row_group_rows: must be an int >= 1, got {row_group_rows!r}")
    root = os.path.abspath(root)
    with file_lock(root + ".lock"):
        meta = _load_meta(root)
        target = {"version": C.LAYOUT_VERSION, "row_group_rows": row_group_rows}
        if meta.get("layout") == target:
            return meta
        for day, spec in meta["days"].items():
            path = os.path.join(root, spec["file"])
            validate_day_file(path, meta, day, spec.get("rows"))
            if miscut_row_group(row_group_sizes(path), row_group_rows) is None:
                continue  # already cut this way (a run killed after it)
            df = pl.read_parquet(path)
            tmp = path + ".relayout"
            df.write_parquet(tmp, row_group_size=row_group_rows)
            if not pl.read_parquet(tmp).equals(df):  # nothing replaced unless it reads back the same
                os.remove(tmp)
                raise data_error(tmp, None, "rewritten day file does not read back as the original")
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
            os.replace(tmp, path)
            if verbose:
                print(f"{spec['file']}: {df.height} rows in {-(-df.height // row_group_rows)} row groups")
        meta["layout"] = target
        write_json_atomic(C.meta_path(root), meta)  # in place, atomically (indent 2: as relayout always wrote it)
        return meta


@dataclasses.dataclass
class RelayoutArgs:
    """The command's arguments (``key=value``, :mod:`data_tools.cli_args`)."""
    data: DataSet = opt(factory=DataSet, help=f"the processed data set to rewrite (a directory with {C.META_FILE})")
    row_group_rows: int = opt(C.ROW_GROUP_ROWS, "rows per row group", "N")


def main(argv=None) -> int:
    args = parse(argv, RelayoutArgs, "python -m data_tools.relayout", __doc__, positional="data.root=DIR")
    try:
        meta = relayout(args.data.root, args.row_group_rows, verbose=True)
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return ExitStatus.USAGE
    print(f"{args.data.root}: layout {json.dumps(meta['layout'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
