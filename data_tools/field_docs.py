"""What each field of a config dataclass means, read from where the project writes it: the field's
``help`` metadata (:func:`data_tools.cli_args.opt`), else the comments in the class's source (the comment
after the field, with the comment lines under it that continue it, and the comment block above it). One
source for every command's ``--help`` (:mod:`data_tools.cli_help`) and the docs' key tables.

Design: the config classes keep their comments as they are written (``# ...`` beside or above a field,
reviewed with the code); this module makes them documented metadata without a second copy. A field without a
comment of its own that follows one documented by a block above it with no line between (``aimd_up`` then
``aimd_down``) shares that block. Limits: a class whose source Python cannot find (a zip import) has no docs
from comments ("" for each field); reStructuredText markup in a comment (````x````, ``:mod:`x```) is shown bare.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import io
import re
import textwrap
import tokenize
from typing import Dict, List

ROLE = re.compile(r":[a-z]+:`~?([^`]+)`")  # :mod:`x`, :func:`~a.b` -> x, a.b


def plain(text: str) -> str:
    """``text`` without reStructuredText markup (roles, double backquotes) and with its spaces collapsed."""
    return " ".join(ROLE.sub(r"\1", text).replace("``", "").split())


@functools.lru_cache(maxsize=None)
def field_docs(cls: type) -> Dict[str, str]:
    """Field name -> its meaning (plain text, one line) for the dataclass ``cls`` (a field with none is absent)."""
    docs: Dict[str, str] = {}
    for klass in reversed(cls.__mro__):  # a subclass's own comments win over its base's
        if dataclasses.is_dataclass(klass):
            docs.update(_from_source(klass))
    for f in dataclasses.fields(cls):
        if f.metadata.get("help"):
            docs[f.name] = plain(f.metadata["help"])
    return docs


def _from_source(cls: type) -> Dict[str, str]:
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    names = set(cls.__dict__.get("__annotations__", {}))
    lines = source.splitlines()
    comments: Dict[int, str] = {}  # line number (0-based) -> its comment's text
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0] - 1] = tok.string.lstrip("#").strip()
    docs: Dict[str, str] = {}
    above: List[str] = []  # the comment block being read, for the next field
    chain = ""  # a block above a field with no comment of its own, shared by the bare fields right under it
    i = 0
    while i < len(lines):
        line, stripped = lines[i], lines[i].strip()
        match = re.match(r"\s*(\w+)\s*:", line)
        if stripped.startswith("#"):
            above.append(comments.get(i, ""))
            chain = ""
        elif match and match.group(1) in names:
            name, indent = match.group(1), len(line) - len(line.lstrip())
            own = [comments[i]] if i in comments else []
            # the comment lines under it, indented past the field, continue its trailing comment
            while own and i + 1 < len(lines) and lines[i + 1].strip().startswith("#") \
                    and len(lines[i + 1]) - len(lines[i + 1].lstrip()) > indent:
                i += 1
                own.append(comments.get(i, ""))
            text = plain(" ".join(above + own)) or chain
            if text:
                docs[name] = text
            chain = plain(" ".join(above)) if above and not own else (chain if not (above or own) else "")
            above = []
        else:
            above, chain = [], ""
        i += 1
    return docs
