"""Errors raised by data_tools."""


class DataError(ValueError):
    """Bad input or output data.

    Every message names the file, the field/column and the problem, e.g.
    ``"/x/day=20220408.parquet: column 'user_id': 3 negative ids (min -5)"``.
    """


def data_error(path, column, problem) -> DataError:
    """Build a DataError with the standard ``file: column 'c': problem`` layout."""
    if column is None:
        return DataError(f"{path}: {problem}")
    return DataError(f"{path}: column '{column}': {problem}")
