"""Data tools for recsys-hdet: generate, convert and validate KuaiRand-schema data.

Public entry points:
- ``data_tools.synthetic.generate(config, out_dir)`` synthetic raw KuaiRand CSVs + oracle.json
- ``data_tools.convert.convert(log, users, videos, out, vocab=...)`` raw -> processed (DATA_CONTRACT.md)
- ``data_tools.validate_raw.validate_raw(...)`` / ``data_tools.validate.validate_processed(dir)``
- ``data_tools.prepare.ensure_dataset(root, generator, vocab)``
- ``data_tools.append.append_days(log, users, videos, root)`` / ``data_tools.prepare.append_synthetic_days(root, days)``
  new days added to a processed data set in place (DATA_CONTRACT.md, "Appending days")
"""

from data_tools.errors import DataError

__all__ = ["DataError"]
