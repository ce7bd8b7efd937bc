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

__all__ = ["BIGGER", "INTRO", "LANGS", "LIVE_INTRO", "PREDICT_INTRO", "SELF_TEST_ANSWER", "ZH", "t"]

#: The languages of the switch: code -> name shown.
LANGS = {"en": "English", "zh": "中文"}

INTRO = r"""
# Compute attention by hand: Q, K, V and the causal mask

Every query scores every key (**S = Q Kᵀ / √d_k**), each row of scores becomes weights with a softmax over the
keys it may see, and the output is the **weighted sum of the values**, O = A V. Pick an item of the articles below
(or edit the matrices), switch masks on and off, move the sliders, and watch every step.

*How to read the tables and the heatmap: rows are queries (the readers), columns are keys (read from). Check the
axes, the mask and the row sums first. A large weight says where a query reads from; it does not say that key
caused the answer (that needs replacement, deletion or intervention experiments: see the live model below).*
"""

PREDICT_INTRO = r"""
## Predict, commit, then reveal

For each experiment pick what you expect **before** you reveal the result: the prediction you had picked is
**locked** the moment you reveal, and the score counts it. Changing your answer afterwards is shown as a change,
never as a right prediction. The experiments use your inputs above (they open on the articles' four positions with
the causal mask).
"""

SELF_TEST_ANSWER = (
    "Mathematically softmax is unchanged by the same shift on a whole row; implementations subtract the row maximum "
    "first so exp never overflows. Adding different amounts to different columns would change the weights: that is "
    "part 2."
)

BIGGER = r"""
## Bigger pictures

**Multi-head.** With d_model = 512 and 8 heads, each head works in d_head = 64 dimensions and scales by 1/√64,
not 1/√512; each head has its own projections and its own weights matrix, and the outputs are concatenated and
projected back (the live model below shows every head of every layer).

**T² growth.** The score matrix has T × T entries: from 1,024 to 4,096 tokens the length grows 4× and the matrix
16×. (End-to-end latency depends on batch, memory traffic and kernels; FlashAttention computes the same exact
attention tile by tile without storing the matrix.)
"""

LIVE_INTRO = r"""
## A live model: real attention weights

Type a sentence and press **run**: SmolLM2-135M (a causal language model, 30 layers × 9 heads) runs it on attnlab's
own NumPy Llama, from the installed GGUF file, offline; all-MiniLM-L6-v2 is a bidirectional encoder (every token
reads every real token), run with two [PAD] positions so you can see the padding mask. Pick a layer and a head; the
model view shows every head of every layer at once. The model loads once (about 5-10 s), then each sentence takes
a second or two and is remembered.

*Then test what the weights mean: delete each token and measure how much the prediction changes. A token can get
much weight and matter little, and the other way round.*
"""

ZH: dict[str, str] = {
    "reveal": "揭晓",
    "Score: {right} of {total} committed predictions right": "得分：已锁定的 {total} 个预测中答对 {right} 个",
}


def t(lang: str, text: str, /, **fields: object) -> str:
    """``text`` in ``lang`` ("en" or "zh"), with ``fields`` filled in (``str.format``)."""
    s = ZH.get(text, text) if lang == "zh" else text
    return s.format(**fields) if fields else s
