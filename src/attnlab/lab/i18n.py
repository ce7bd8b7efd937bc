"""The lab's words in English (the default) and Chinese, with the articles' own terms (查询、键、值、因果遮罩、温度).

Strings are written in English where they are used and looked up here by that English text: :func:`t` returns the
Chinese for ``lang="zh"`` (``{name}`` fields filled in either way). A string missing from :data:`ZH` shows in
English, which the browser test for the Chinese view catches. Explanations computed by ``attnlab explain`` (the
steps, the examples' titles) come from its own catalogue, :mod:`attnlab.explain.i18n`, when it is there.

>>> t("en", "reveal"), t("zh", "reveal")
('reveal', '揭晓')
>>> t("zh", "Score: {right} of {total} committed predictions right", right=2, total=3)
'得分：已锁定的 3 个预测中答对 2 个'
"""

from __future__ import annotations

__all__ = ["LANGS", "ZH", "t"]

#: The languages of the switch: code -> name shown.
LANGS = {"en": "English", "zh": "中文"}

ZH: dict[str, str] = {
    "reveal": "揭晓",
    "Score: {right} of {total} committed predictions right": "得分：已锁定的 {total} 个预测中答对 {right} 个",
}


def t(lang: str, text: str, /, **fields: object) -> str:
    """``text`` in ``lang`` ("en" or "zh"), with ``fields`` filled in (``str.format``)."""
    s = ZH.get(text, text) if lang == "zh" else text
    return s.format(**fields) if fields else s
