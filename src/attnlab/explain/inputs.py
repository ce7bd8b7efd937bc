"""Reading small matrices the way people type them: inline text, JSON, CSV or ``.npy`` files.

Every error names the argument and says what was expected, so the CLI and the lab can show it as it is:

>>> parse_matrix("1, 0; 0, 1", "q").tolist()
[[1.0, 0.0], [0.0, 1.0]]
>>> parse_matrix("[[1, 2], [3, 4]]", "k").tolist()
[[1.0, 2.0], [3.0, 4.0]]
>>> parse_matrix("1 2\\n3", "v")
Traceback (most recent call last):
...
attnlab.errors.ShapeError: v: ragged matrix: row 1 has 1 number(s) but row 0 has 2; every row needs the same length
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import AttnlabError, DTypeError, MaskError, NonFiniteError, ShapeError
from ..i18n import Word, localized
from ..validate import check_choice

__all__ = [
    "load_inputs",
    "load_mask",
    "load_matrix",
    "matrix_from_value",
    "parse_mask",
    "parse_matrix",
    "parse_tokens",
]

_FILE_SUFFIXES = (".json", ".csv", ".tsv", ".txt", ".npy")
_TRUE = {"1", "true", "t", "yes", "y", "■", "x"}
_FALSE = {"0", "false", "f", "no", "n", "⬚", ".", "-"}


def _number(token: str, name: str | Word, i: int, j: int) -> float:
    try:
        x = float(token)
    except ValueError:
        raise localized(DTypeError, "input.not_number", name=name, token=token, i=i, j=j) from None
    if not math.isfinite(x):
        raise localized(NonFiniteError, "input.not_finite", name=name, token=token, i=i, j=j)
    return x


def _check_rows(rows: list[list[Any]], name: str | Word) -> None:
    if not rows or not rows[0]:
        raise localized(ShapeError, "input.empty", name=name)
    for i, r in enumerate(rows):
        if len(r) != len(rows[0]):
            raise localized(ShapeError, "input.ragged", name=name, row=i, n=len(r), n0=len(rows[0]))


def matrix_from_value(value: Any, name: str | Word) -> np.ndarray:
    """A float64 matrix ``[rows, cols]`` from nested lists (as JSON gives them) or an array; a flat list is one row."""
    if isinstance(value, np.ndarray):
        a = value
        if a.ndim == 1:
            a = a[None, :]
        if a.ndim != 2:
            raise ShapeError(f"{name}: expected a matrix [rows, cols], got an array of shape {a.shape}")
        if a.dtype == np.bool_ or not (np.issubdtype(a.dtype, np.number)):
            raise DTypeError(f"{name}: expected numbers, got dtype {a.dtype}")
        rows = a.astype(np.float64).tolist()
    else:
        if not isinstance(value, (list, tuple)):
            raise localized(ShapeError, "input.not_matrix", name=name, kind=type(value).__name__, value=value)
        rows = [list(r) if isinstance(r, (list, tuple)) else r for r in value]
        if rows and not any(isinstance(r, list) for r in rows):
            rows = [rows]
        for i, r in enumerate(rows):
            if not isinstance(r, list):
                raise localized(ShapeError, "input.mixed_rows", name=name, i=i, row=r)
    _check_rows(rows, name)
    out = np.empty((len(rows), len(rows[0])), dtype=np.float64)
    for i, r in enumerate(rows):
        for j, x in enumerate(r):
            if isinstance(x, bool) or not isinstance(x, (int, float, str)):
                raise localized(DTypeError, "input.not_number", name=name, token=x, i=i, j=j)
            out[i, j] = _number(str(x), name, i, j)
    return out


def parse_matrix(text: str, name: str | Word) -> np.ndarray:
    """A matrix from text: JSON (``[[1, 0], [0, 1]]``) or rows split by ``;`` or newlines, numbers by commas/spaces.

    Returns float64 ``[rows, cols]``; raises :class:`~attnlab.errors.ShapeError` (ragged, empty) or
    :class:`~attnlab.errors.DTypeError` (not a number) naming ``name``, the row and the column.
    """
    if not isinstance(text, str):
        raise DTypeError(f"{name}: expected text, got {type(text).__name__}")
    s = text.strip()
    if s.startswith("["):
        return matrix_from_value(_inline_json(s, name, ShapeError), name)
    lines = [ln for ln in re.split(r"[;\n]", s) if ln.strip()]
    rows = [[t for t in re.split(r"[,\s\t]+", ln.strip()) if t] for ln in lines]
    _check_rows(rows, name)
    return np.array([[_number(t, name, i, j) for j, t in enumerate(r)] for i, r in enumerate(rows)], dtype=np.float64)


def _inline_json(s: str, name: str | Word, error: type[AttnlabError]) -> Any:
    """``s`` (text that starts with ``[``) read as JSON; invalid JSON is an ``error`` naming ``name`` and where."""
    try:
        return json.loads(s)
    except json.JSONDecodeError as err:
        raise localized(error, "input.not_json", name=name, text=s[:40], pos=err.pos) from None


def _is_path(source: str) -> bool:
    return source.lower().endswith(_FILE_SUFFIXES) or (os.sep in source and Path(source).exists())


def load_matrix(source: str, name: str) -> np.ndarray:
    """A matrix from inline text (see :func:`parse_matrix`) or a file: .json, .csv/.tsv/.txt or .npy."""
    if not _is_path(source):
        return parse_matrix(source, name)
    path = Path(source)
    if not path.is_file():
        raise FileNotFoundError(f"{name}: no such file {source!r} (expected .json, .csv, .tsv, .txt or .npy)")
    if path.suffix.lower() == ".npy":
        try:
            arr = np.load(path, allow_pickle=False)
        except ValueError as err:
            raise DTypeError(f"{name}: {source!r} is not a plain .npy array ({err})") from None
        return matrix_from_value(arr, name)
    text = path.read_text(encoding="utf-8")
    if path.suffix.lower() == ".json":
        try:
            value = json.loads(text)
        except json.JSONDecodeError as err:
            raise ShapeError(f"{name}: {source!r} is not valid JSON ({err.msg}, line {err.lineno})") from None
        return matrix_from_value(value, name)
    return parse_matrix(text, name)


def parse_mask(text: str, name: str | Word = "mask", *, convention: str = "allow") -> np.ndarray:
    """A boolean mask ``[n_q, n_k]`` from text (``"1 0; 1 1"``, ``■``/``⬚``, true/false, JSON), True = may attend.

    ``convention="block"`` reads a mask where 1/True means *blocked* (``nn.MultiheadAttention``, ``masked_fill``)
    and converts it with :func:`attnlab.masks.from_blocked`.

    >>> parse_mask("1 0; 1 1").tolist()
    [[True, False], [True, True]]
    >>> parse_mask("0 1; 0 0", convention="block").tolist()
    [[True, False], [True, True]]
    """
    from .. import masks

    check_choice("convention", convention, ("allow", "block"))  # allow: True = may attend
    s = text.strip()
    if s.startswith("["):
        value = _inline_json(s, name, MaskError)
        if value and not isinstance(value[0], list):
            value = [value]
        rows = [[str(x).lower() for x in r] if isinstance(r, list) else [str(r)] for r in value]
    else:
        lines = [ln for ln in re.split(r"[;\n]", s) if ln.strip()]
        rows = [[t.lower() for t in re.split(r"[,\s]+", ln.strip()) if t] for ln in lines]
    _check_rows(rows, name)
    out = np.zeros((len(rows), len(rows[0])), dtype=bool)
    for i, r in enumerate(rows):
        for j, t in enumerate(r):
            if t in _TRUE:
                out[i, j] = True
            elif t not in _FALSE:
                raise localized(MaskError, "input.not_mask_entry", name=name, token=t, i=i, j=j)
    return masks.from_blocked(out) if convention == "block" else out


def load_mask(source: str, name: str = "mask", *, convention: str = "allow") -> np.ndarray:
    """:func:`parse_mask` from inline text or a file (.json, .csv, .txt, .npy of bools or 0/1)."""
    from .. import masks

    if not _is_path(source):
        return parse_mask(source, name, convention=convention)
    path = Path(source)
    if not path.is_file():
        raise FileNotFoundError(f"{name}: no such file {source!r}")
    if path.suffix.lower() == ".npy":
        arr = np.load(path, allow_pickle=False)
        m = arr if arr.dtype == np.bool_ else masks.from_keep(arr)
        if m.ndim == 1:
            m = m[None, :]
        return masks.from_blocked(m) if convention == "block" else m
    return parse_mask(path.read_text(encoding="utf-8"), name, convention=convention)


def parse_tokens(text: str | None, n: int, name: str) -> tuple[str, ...] | None:
    """Token labels from ``"the cat sat"`` (spaces) or ``"the,cat,sat"``; there must be exactly ``n``."""
    if text is None:
        return None
    sep = "," if "," in text else None
    toks = tuple(t.strip() for t in text.split(sep) if t.strip())
    if len(toks) != n:
        raise localized(ShapeError, "input.tokens_count", name=name, n=len(toks), toks=list(toks), m=n)
    return toks


def load_inputs(source: str) -> dict[str, Any]:
    """q, k, v (and optionally mask, tokens) from one ``.json`` object or ``.npz`` archive.

    JSON: ``{"q": [[...]], "k": [[...]], "v": [[...]], "mask": [[1, 0], ...], "tokens": ["a", "b"]}``.
    """
    path = Path(source)
    if not path.is_file():
        raise FileNotFoundError(f"inputs: no such file {source!r} (expected a .json object or an .npz archive)")
    out: dict[str, Any] = {}
    if path.suffix.lower() == ".npz":
        with np.load(path, allow_pickle=False) as z:
            data = {key: z[key] for key in z.files}
    else:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as err:
            raise ShapeError(f"inputs: {source!r} is not valid JSON ({err.msg}, line {err.lineno})") from None
        if not isinstance(data, dict):
            raise ShapeError(f"inputs: {source!r} must hold a JSON object with keys q, k, v; got {type(data).__name__}")
    missing = [key for key in ("q", "k", "v") if key not in data]
    if missing:
        raise ShapeError(f"inputs: {source!r} lacks {', '.join(missing)}; expected keys q, k, v (and mask, tokens)")
    for key in ("q", "k", "v"):
        out[key] = matrix_from_value(data[key], key)
    if data.get("mask") is not None:
        m = np.asarray(data["mask"])
        if m.dtype != np.bool_:
            from .. import masks

            m = masks.from_keep(m)
        out["mask"] = m if m.ndim == 2 else m.reshape(1, -1)
    if data.get("tokens") is not None:
        out["tokens"] = tuple(str(t) for t in np.asarray(data["tokens"]).tolist())
    return out
