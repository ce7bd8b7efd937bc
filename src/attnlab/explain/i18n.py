# ruff: noqa: E501  (Chinese characters count double; the catalogue keeps each message on its own lines)
"""``attnlab explain``'s table of the one catalogue (:mod:`attnlab.i18n`): every string it shows, in English and Chinese.

Key -> ``(english, chinese)``, kept as data in ``attnlab/catalogues/explain.toml`` (one TOML table per key, with
``en`` and ``zh``) and registered into :data:`attnlab.i18n.MESSAGES`; :func:`tr` picks a language and fills
the ``{fields}`` (the lab reuses these keys for what explain computes). The Chinese uses the articles' own terms (查询、键、值、分数、权重、因果遮罩、温度、缩放、行和 …);
symbols and identifiers (Q, K, V, W_O, d_k, softmax, exp, nan) stay as they are.

>>> tr("label.weights", "zh")
'权重'
>>> tr("cli.error", "en", prog="attnlab explain", msg="bad")
'attnlab explain: error: bad'
"""

from __future__ import annotations

from ..i18n import LANGS, MESSAGES, TERMS, check_lang, read_catalogue, register, tr

__all__ = ["LANGS", "MESSAGES", "TERMS", "check_lang", "tr"]

#: Chinese titles and sources of every named example and lesson (English ones come from attnlab.articles).
_ZH_TITLES: dict[str, tuple[str, str]] = {
    "weighted-average": ("Attention 是加权平均：0.6 v1 + 0.3 v2 + 0.1 v3", "001 §1"),
    "one-query": ("一个查询 [1, 0] 对两个键 [1, 0] 与 [0, 1]", "000，「把一行注意力完整算出来」"),
    "2x2": ("2×2 算例：Q = K = I，V = [[10, 0], [0, 20]]", "001 §5"),
    "2x2-causal": ("加上因果遮罩的 2×2 算例", "001 §7.3"),
    "causal-4": ("四个位置的因果遮罩：第 i 行有 i + 1 个合法键", "000，「因果性是一条信息边界」"),
    "saturation": ("为什么要缩放：softmax([1, 2]) 与 softmax([10, 20])", "001 §4.2"),
    "mask-order": ("先遮罩再 softmax：分数 [1, 2]，屏蔽第二个键", "001 §7.4"),
    "one-query-v100": ("把 v0 改成 [100, 0]：权重不变，输出改变", "000，Notebook"),
    "dot-product": ("点积是匹配分数，不是概率：同向、反向、正交", "001 §3、§3.1"),
    "cross": ("Cross-Attention：2 个查询读取 3 个源位置；A 是 [2, 3]，不是方阵", "001 §2.2、§8"),
    "padding": ("填充遮罩屏蔽 PAD 键所在的列；PAD 查询仍有输出", "001 §7.1、§17.4"),
    "all-masked": ("某个查询的所有键都被屏蔽：对空集合做 softmax 是 0/0 = NaN", "001 §7.5；000，工程陷阱"),
    "column-bias": ("自测后半部分：给不同列加不同偏置会改变权重", "000，自测"),
    "variance": ("为什么除以 sqrt(d_k)：q·k 的方差随 d_k 增长，缩放使其恢复", "001 §4.1"),
    "overflow": ("稳定 softmax：不先减去行最大值，e^1000 会溢出", "001 §6"),
    "fp16-mask": ("加性遮罩与数据类型：-1e9 在 float32 中可用，在 float16 中变成 -inf", "001 §7"),
    "self-test": ("自测：给每个合法分数加 100；再给不同列加不同偏置", "000，自测"),
    "multi-head": ("多头：拆分 -> 每头 Attention -> 拼接 -> W_O，写出每一步的形状", "001 §10-§11；000"),
    "dropout": ("权重上的 Dropout：inverted dropout 之后行和不再为 1", "001 §18"),
    "growth": ("T² 增长：1,024 -> 4,096 个 token，长度 4 倍，分数矩阵元素 16 倍", "000；001 §13、§19"),
    "complexity": ("复杂度：投影 O(B n d²)、分数 O(B n² d)、内存 O(B h n²)、KV Cache", "001 §13-§15"),
    "leak-test": ("泄漏测试：修改一个未来 token，因果输出不应变化", "001 §17.3、§20"),
    "mask-not-access": ("Mask 不是权限控制：b 从不关注秘密，却在第二层经由 a 读到它", "001 §17.5、§21"),
    "long-context": ("长上下文：n 翻倍时分数矩阵元素变为 4 倍；窗口、MQA/GQA 与 KV Cache 的增长不同", "001 §19"),
    "invariants": ("每个 Attention 实现都要保持的六个不变量，各附其数值", "001 §21"),
}


def _titles() -> dict[str, tuple[str, str]]:
    from ..articles import EXAMPLES, EXTRA_EXAMPLES, LESSONS

    out = {}
    for table in (EXAMPLES, EXTRA_EXAMPLES, LESSONS):
        for name, ex in table.items():
            zh_title, zh_source = _ZH_TITLES[name]
            out[f"title.{name}"] = (ex.title, zh_title)
            out[f"source.{name}"] = (ex.source, zh_source)
    return out


#: Keys are grouped by where they are shown (``cli.``, ``help.``, ``render.``, ``step.``, ``mistake.``, ``online.``,
#: ``lesson.``, ``title.``, ``source.`` ...): the messages are data, ``attnlab/catalogues/explain.toml``, read once
#: here, and the examples' titles come from :mod:`attnlab.articles` with the Chinese above; the one merged table is
#: :data:`attnlab.i18n.MESSAGES`.
register("explain", {**read_catalogue("explain"), **_titles()})
