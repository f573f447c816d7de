"""Data tools for recsys-hdet: generate, convert and validate KuaiRand-schema data.

Public entry points:
- ``data_tools.generate.generate(config, out_dir)`` synthetic raw KuaiRand CSVs + oracle.json
- ``data_tools.convert.convert(log, users, videos, out, vocab=...)`` raw -> processed (DATA_CONTRACT.md)
- ``data_tools.validate.validate_raw(...)`` / ``validate_processed(dir)``
- ``data_tools.prepare.ensure_dataset(root, generator, vocab)``
"""

from data_tools.errors import DataError

__all__ = ["DataError"]
