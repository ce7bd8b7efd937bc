"""Class mode: a link that opens the lab on one article item with its answer hidden until the learner commits a
prediction and reveals it (``attnlab lab --item causal-4 --class``).

The link carries two query parameters, ``?item=item-03&class=1``; the notebook reads them with marimo's
``mo.query_params()``: ``item`` picks the preset (:data:`attnlab.lab.presets.ITEM_PRESETS`), ``class=1`` hides the
item's ``attnlab explain`` output (the article's numbers) behind a prediction box and a reveal switch.

>>> item_key("4"), item_key("causal-4"), item_key("item-03")
('item-03', 'item-03', 'item-03')
>>> class_query("item-03")
'?item=item-03&class=1'
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from typing import Any

from ..articles import ITEMS
from ..errors import OptionError
from .i18n import t

__all__ = [
    "class_query",
    "hidden_html",
    "hidden_weights_html",
    "is_class",
    "item_key",
    "item_of_query",
    "revealed_html",
]


def _key(index: int) -> str:
    return f"item-{index:02d}"


def item_key(text: str) -> str:
    """The lab preset key of an item given as its number (1-43, docs/learn.md's order), its key (``item-03``) or an
    ``attnlab explain`` example or lesson name (the first item whose command is exactly that name, e.g.
    ``causal-4``). Raises :class:`~attnlab.errors.OptionError` naming ``--item`` otherwise."""
    s = str(text).strip()
    if s.isdigit() and 1 <= int(s) <= len(ITEMS):
        return _key(int(s) - 1)
    if s.startswith("item-") and s[5:].isdigit() and int(s[5:]) < len(ITEMS):
        return _key(int(s[5:]))
    for i, it in enumerate(ITEMS):
        if tuple(it.argv) == (s,):
            return _key(i)
    for i, it in enumerate(ITEMS):
        if it.lab == s:
            return _key(i)
    names = sorted({it.lab for it in ITEMS if it.lab})
    raise OptionError(f"--item: expected an item number 1-{len(ITEMS)} or one of {', '.join(names)}, got {s!r}")


def class_query(key: str, *, hidden: bool = True) -> str:
    """The query string of a link that opens the lab on preset ``key`` (in class mode with ``hidden``)."""
    return f"?item={key}&class=1" if hidden else f"?item={key}"


def item_of_query(params: Mapping[str, Any] | Any) -> str:
    """The preset key named by the page's ``item`` query parameter ("" when absent or not a known item)."""
    try:
        raw = params.get("item")
    except AttributeError:
        return ""
    if not raw:
        return ""
    try:
        return item_key(str(raw))
    except OptionError:
        return ""


def is_class(params: Mapping[str, Any] | Any) -> bool:
    """Whether the page's query parameters ask for class mode (``class=1``, with an item)."""
    try:
        return str(params.get("class") or "") in ("1", "true", "yes") and bool(item_of_query(params))
    except AttributeError:
        return False


def hidden_html(lang: str, asked: bool, testid: str = "al-class-hidden", words: str = "") -> str:
    """What stands where the answer will be: the class-mode note, or (``asked``: reveal was pressed without a
    prediction) the request to predict first; ``words`` instead of either (``data-testid`` is ``testid``)."""
    words = words or t(lang, "class.predict_first" if asked else "class.hidden")
    return (
        f'<div data-testid="{testid}" data-asked="{str(asked).lower()}" style="padding:8px 12px;'
        f'border:1px dashed #6a51a3;background:#f2f0f7;color:#3f007d"><b>{html.escape(words)}</b></div>'
    )


def hidden_weights_html(lang: str) -> str:
    """What stands where the weights table and the pictures will be until the item's reveal."""
    return hidden_html(lang, False, "al-class-hidden-weights", t(lang, "class.hidden_weights"))


def revealed_html(lang: str, prediction: str, answer: str) -> str:
    """The committed prediction above the answer (``answer``: the item's HTML)."""
    p = html.escape(t(lang, "class.committed", p=prediction.strip()))
    return f'<div data-testid="al-class-revealed"><p><b>{p}</b></p>{answer}</div>'
