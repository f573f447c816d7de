"""The raw-request program (``raw_model.pt2``, written by ``export ... raw_program=true``): the serving ranker
with the converter's and the loader's input work inside, so that a serving request carries the raw log's
ids and values, not processed rows:

    scores = torch.export.load("raw_model.pt2").module()(request)    # [B, T] float32 probabilities

``request`` is a dict of named 1-D tensors (any key order; a missing or extra key is refused by the
program with the keys it expects): :func:`request_inputs` lists them with dtype and shape, the manifest
records them (``raw_program.inputs``), docs/serving.md shows a call. Inside, as the data set's converter
(data_tools/feature_tables.py, data_tools/day_files.py) and the trainer's loader do it:

- raw ids -> embedding rows through the model's vocabularies (data_tools/vocab.py), held as a sorted raw-id
  array searched with ``torch.searchsorted``: a negative id is missing (row 0), an id the vocabulary lacks
  (or whose row is past the model's table) is out of vocabulary (row 1);
- ``hourmin`` -> hour + 1, clipped to [0, 24] (0: missing; a negative hourmin is missing);
- string categoricals arrive as the manifest's codes (``string_vocabs[name].index(value) + 1``); 0, or a
  code the model's table lacks (a value first seen after training), is the missing category 0;
- dense values: KuaiRand's sentinel -124, NaN, inf and a non-integral count or flag are missing (the
  converter parses those columns as integers); counts ``log1p`` (negative: missing), ``video_duration``
  ``log1p(ms / 1000)`` (negative: missing), ``aspect_ratio`` ``clip(width / height, 0, 4)`` (either <= 0:
  missing), the video's age ``log1p(max(0, date - upload_dt))`` in calendar days (``upload_dt`` 0 or not a
  calendar date: missing); each value rounded to float32 as the day files store it, its ``_missing``
  indicator set, then the training days' standardization (:class:`~.program.ServingRanker`).

The program never refuses a value (a request cannot fail row by row): what it cannot read is missing,
as above. Checking requests is the caller's (``data_tools.validate_raw`` is the converter's check of a
log). Limit: each vocabulary is held in the program as two int64 arrays (16 bytes an id) beside the
tables; the artifact holds the tables twice (``model.pt2`` and this program), hence an option.
"""

from __future__ import annotations

from typing import Dict, List, Mapping, Sequence, Tuple

import numpy as np
import torch
from torch import nn

from data_tools import schema as S
from data_tools.vocab import MISSING_ROW, OOV_ROW
from recsys_hdet.serving.program import ServingRanker, size_oblivious

_COUNT = "float64", "a count; NaN, -124 or negative: missing"
_FLAG = "float64", "0/1; NaN or -124: missing"
_CODE = "int64", "the manifest's code: string_vocabs[name].index(value) + 1; 0: missing or unseen"
_ID = "int64", "raw id; negative: missing (row 0), unseen: out of vocabulary (row 1)"
# What each raw input is, for the manifest and the docs (the dtype the program reads it as, and its meaning).
# Inputs not named here are a string categorical's code (_CODE) or an id feature's raw id (_ID).
_MEANING: Dict[str, Tuple[str, str]] = {
    "date": ("int64", "the request's date, YYYYMMDD (a video's age is counted to it)"),
    "hourmin": ("int64", "the request's time of day, HHMM; negative: missing"),
    **{c: _COUNT for c in S.RANGE_SOURCES},
    **{c: _FLAG for c in ("is_lowactive_period", "is_live_streamer", "is_video_author")},
    "upload_dt": ("int64", "the video's upload date, YYYYMMDD; 0 (or not a calendar date): missing"),
    "video_duration": ("float64", "milliseconds; NaN or negative: missing"),
    "server_width": ("float64", "pixels; NaN, or width or height <= 0: no aspect ratio"),
    "server_height": ("float64", "pixels; NaN, or width or height <= 0: no aspect ratio"),
}


def _float(x: torch.Tensor) -> torch.Tensor:
    """Finite values as float64, the rest NaN (missing)."""
    x = x.to(torch.float64)
    return torch.where(torch.isfinite(x), x, torch.full_like(x, float("nan")))


def _known_int(x: torch.Tensor) -> torch.Tensor:
    """An integer column of a feature file as the converter parses it: integral and not a sentinel, else NaN."""
    x = _float(x)
    known = x == torch.floor(x)  # NaN compares unequal
    for sentinel in S.SENTINELS:
        known = known & (x != sentinel)
    return torch.where(known, x, torch.full_like(x, float("nan")))


def _log_count(count: torch.Tensor) -> torch.Tensor:
    x = _known_int(count)
    return torch.where(x >= 0, torch.log1p(x), torch.full_like(x, float("nan")))


def _log_seconds(ms: torch.Tensor) -> torch.Tensor:
    x = _float(ms)
    return torch.where(x >= 0, torch.log1p(x / 1000.0), torch.full_like(x, float("nan")))


def _aspect_ratio(width: torch.Tensor, height: torch.Tensor) -> torch.Tensor:
    w, h = _float(width), _float(height)
    return torch.where((h > 0) & (w > 0), torch.clamp(w / h, 0.0, 4.0), torch.full_like(w, float("nan")))


def _day_number(yyyymmdd: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Days since 1970-01-01 of YYYYMMDD integers (the proleptic Gregorian calendar, exact in int64), and
    whether each is a calendar date (year >= 1)."""
    ymd = yyyymmdd.to(torch.int64)
    y, m, d = ymd // 10000, ymd // 100 % 100, ymd % 100
    leap = ((y % 4 == 0) & (y % 100 != 0)) | (y % 400 == 0)
    month_days = torch.tensor([31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31], dtype=torch.int64)
    last = month_days[torch.clamp(m - 1, 0, 11)] + (leap & (m == 2)).to(torch.int64)
    valid = (y >= 1) & (m >= 1) & (m <= 12) & (d >= 1) & (d <= last)
    # Howard Hinnant's days_from_civil: years from March, so that the leap day ends a year
    y = y - (m <= 2).to(torch.int64)
    era = y // 400
    year_of_era = y - era * 400
    day_of_year = (153 * ((m + 9) % 12) + 2) // 5 + d - 1
    day_of_era = year_of_era * 365 + year_of_era // 4 - year_of_era // 100 + day_of_year
    return era * 146097 + day_of_era - 719468, valid


def _log_age_days(date: torch.Tensor, upload: torch.Tensor) -> torch.Tensor:
    (today, today_ok), (uploaded, upload_ok) = _day_number(date), _day_number(upload)
    age = torch.clamp((today - uploaded).to(torch.float64), min=0.0)
    return torch.where(today_ok & upload_ok, torch.log1p(age), torch.full_like(age, float("nan")))


# Each dense value of the data contract from the raw inputs it is converted from (data_tools/feature_tables.py).
_DENSE_VALUES = {
    **{f"log_{c}": ((c,), _log_count) for c in S.RANGE_SOURCES},
    "log_video_duration_s": (("video_duration",), _log_seconds),
    "log_video_age_days": (("date", "upload_dt"), _log_age_days),
    **{c: ((c,), _known_int) for c in ("is_lowactive_period", "is_live_streamer", "is_video_author")},
    "aspect_ratio": (("server_width", "server_height"), _aspect_ratio),
}


def _value_of(dense_feature: str) -> str:
    """The dense value a dense input is (itself) or indicates (its ``_missing`` indicator's value)."""
    suffix = S.missing_indicator("")
    return dense_feature[: -len(suffix)] if dense_feature not in _DENSE_VALUES and dense_feature.endswith(suffix) \
        else dense_feature


class RawVocabulary(nn.Module):
    """One feature's vocabulary as a sorted raw-id array and each id's row (data_tools/vocab.py's rows)."""

    def __init__(self, raw_ids: np.ndarray, rows: np.ndarray) -> None:
        super().__init__()
        order = np.argsort(raw_ids, kind="stable")
        keys, values = np.asarray(raw_ids, np.int64)[order], np.asarray(rows, np.int64)[order]
        if not len(keys):  # nothing to find: -1 is never searched for (negative ids are missing first)
            keys, values = np.array([-1], np.int64), np.array([OOV_ROW], np.int64)
        self.register_buffer("raw_ids", torch.from_numpy(np.ascontiguousarray(keys)))
        self.register_buffer("rows", torch.from_numpy(np.ascontiguousarray(values)))

    def forward(self, raw: torch.Tensor) -> torch.Tensor:
        raw = raw.to(torch.int64)
        at = torch.clamp(torch.searchsorted(self.raw_ids, raw), max=self.raw_ids.numel() - 1)
        found = torch.where(self.raw_ids[at] == raw, self.rows[at], torch.full_like(raw, OOV_ROW))
        return torch.where(raw < 0, torch.full_like(raw, MISSING_ROW), found)


class RawServingRanker(nn.Module):
    """:class:`ServingRanker` behind the converter's and the loader's input work (the module docstring).

    ``vocabularies``: per id feature, its raw ids and rows (the artifact's ``vocab/``, cut to the model's
    tables); ``tables``: every sparse feature's table size; ``dense``: the model's dense inputs in order."""

    def __init__(self, serving: ServingRanker, vocabularies: Mapping[str, Tuple[np.ndarray, np.ndarray]],
                 tables: Mapping[str, int], dense: Sequence[str]) -> None:
        super().__init__()
        self.inputs = request_inputs(serving.single_features, serving.multi_features, dense, vocabularies)
        self.serving = serving
        self.vocabularies = nn.ModuleDict({n: RawVocabulary(*vocabularies[n]) for n in vocabularies})
        self.tables = {n: int(tables[n]) for n in serving.single_features}
        self.dense = list(dense)

    def forward(self, request: Dict[str, torch.Tensor]) -> torch.Tensor:
        values = {}
        for name in self.dense:
            value = _value_of(name)
            if value not in values:
                sources, convert = _DENSE_VALUES[value]
                values[value] = convert(*(request[s] for s in sources)).to(torch.float32)  # as a day file stores it
        dense = torch.stack([values[n] if n in values else torch.isnan(values[_value_of(n)]).to(torch.float32)
                             for n in self.dense], dim=1)
        ids = torch.stack([self._single(name, request) for name in self.serving.single_features], dim=1)
        multi_values = [self.vocabularies[f](request[f"{f}_values"]) for f in self.serving.multi_features]
        multi_offsets = [request[f"{f}_offsets"].to(torch.int64) for f in self.serving.multi_features]
        return self.serving(dense, ids, multi_values, multi_offsets)

    def _single(self, name: str, request: Dict[str, torch.Tensor]) -> torch.Tensor:
        if name in self.vocabularies:
            return self.vocabularies[name](request[name])
        if name == "hour":
            hour = request["hourmin"].to(torch.int64) // 100 + 1
            code = torch.clamp(hour, 0, S.HOUR_VOCAB - 1)
        else:
            code = request[name].to(torch.int64)
        return torch.where((code > 0) & (code < self.tables[name]), code, torch.zeros_like(code))


def request_inputs(single_features: Sequence[str], multi_features: Sequence[str], dense: Sequence[str],
                   vocabularies: Mapping) -> Dict[str, Dict[str, str]]:
    """The request's tensors, in order (the impression's, then the features'): name -> dtype, shape, meaning.
    ValueError naming a feature the program has no raw form for."""
    names: List[str] = []
    for name in single_features:
        names.append("hourmin" if name == "hour" else name)
    for f in multi_features:
        if f not in vocabularies:
            raise ValueError(f"multi-valued feature '{f}' has no vocabulary: its raw ids cannot be mapped")
        names += [f"{f}_values", f"{f}_offsets"]
    for name in dense:
        if _value_of(name) not in _DENSE_VALUES:
            raise ValueError(f"dense feature '{name}' has no raw form (the raw program converts KuaiRand's: "
                             f"{sorted(_DENSE_VALUES)})")
        names += _DENSE_VALUES[_value_of(name)][0]
    impression = [n for n in ("user_id", "video_id", "tab", "date", "hourmin") if n in names]
    inputs = {}
    for name in dict.fromkeys(impression + names):  # each once, where first needed
        if name.endswith("_values") and name[: -len("_values")] in multi_features:
            dtype, shape, what = "int64", "[N]", "raw ids of every row's list, concatenated (N: their count)"
        elif name.endswith("_offsets") and name[: -len("_offsets")] in multi_features:
            dtype, shape, what = "int64", "[B+1]", "row i's list is values[offsets[i]:offsets[i+1]]; starts at 0"
        else:
            dtype, what = _MEANING.get(name) or (_ID if name in vocabularies else _CODE)
            shape = "[B]"
        inputs[name] = {"dtype": dtype, "shape": shape, "meaning": what}
    return inputs


def example_request(inputs: Mapping[str, Mapping[str, str]], rows: int = 8) -> Dict[str, torch.Tensor]:
    """A request of ``rows`` rows of zeros (dates 20220101), two list values a row: what the program is traced on."""
    request = {}
    for name, spec in inputs.items():
        dtype = torch.float64 if spec["dtype"] == "float64" else torch.int64
        if spec["shape"] == "[N]":
            request[name] = torch.zeros(2 * rows, dtype=dtype)
        elif spec["shape"] == "[B+1]":
            request[name] = torch.arange(0, 2 * rows + 1, 2, dtype=dtype)
        else:
            request[name] = torch.full((rows,), 20220101 if name in ("date", "upload_dt") else 0, dtype=dtype)
    return request


def export_raw_program(module: RawServingRanker, example_rows: int = 8) -> "torch.export.ExportedProgram":
    """``torch.export`` of ``module`` with the batch size (from 1) and each list's value count dynamic."""
    batch = torch.export.Dim("batch", min=1)
    dynamic = {}
    for name, spec in module.inputs.items():
        if spec["shape"] == "[N]":
            dynamic[name] = {0: torch.export.Dim(name, min=0)}
        else:
            dynamic[name] = {0: batch + 1 if spec["shape"] == "[B+1]" else batch}
    with torch.no_grad(), size_oblivious():
        return torch.export.export(module, (example_request(module.inputs, example_rows),),
                                   dynamic_shapes={"request": dynamic}, strict=False)
