# ruff: noqa: E501  (Chinese characters count double; the catalogue keeps each message on its own lines)
"""attnlab's words for learners in English (the default) and Chinese: one catalogue, one lookup.

Every area registers its own table with :func:`register` (key -> ``(english, chinese)``): ``attnlab.explain.i18n``
(the steps, lessons, titles and ``attnlab explain``'s help), ``attnlab.lab.i18n`` (the lab's page; its keys are the
English text itself) and this module (messages about bad input, errors by class, ``attnlab heatmap``'s labels).
:func:`tr` looks a key up in the one merged table :data:`MESSAGES` and fills the ``{fields}``. The Chinese uses the
articles' own terms (:data:`TERMS`: 查询、键、值、因果遮罩、温度 …); symbols and identifiers (Q, K, V, d_k, softmax)
stay as they are.

Errors about the learner's input are built with :func:`localized` (an attnlab error whose English message comes
from the catalogue and that remembers its key and fields), so :func:`error_message` can say them in Chinese without
reading the English text. Any other attnlab error is described by its class (and, for
:class:`~attnlab.errors.MaskedRowError`, its rows).

>>> tr("label.weights", "zh")
'权重'
>>> from attnlab.errors import ShapeError
>>> err = localized(ShapeError, "input.ragged", name="K", row=1, n=1, n0=2)
>>> str(err)
'K: ragged matrix: row 1 has 1 number(s) but row 0 has 2; every row needs the same length'
>>> error_message(err, "zh")
'K：各行长度不一：第 1 行有 1 个数字，第 0 行有 2 个；每行需要同样的长度'

Which language the command line uses for ``--help`` (and as ``--lang``'s default): :func:`cli_lang`, that is
``--lang zh`` on the command line or ``ATTNLAB_LANG=zh`` in the environment.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from .errors import AttnlabError, MaskedRowError
from .validate import check_choice

__all__ = [
    "ENV",
    "LANGS",
    "MESSAGES",
    "TERMS",
    "Word",
    "check_lang",
    "cli_lang",
    "error_message",
    "localize_parser",
    "localize_type",
    "localized",
    "register",
    "text",
    "tr",
]

#: The languages of the catalogue; English is the default everywhere.
LANGS: tuple[str, ...] = ("en", "zh")

#: The environment variable that sets the command line's language (``--help`` and ``--lang``'s default).
ENV = "ATTNLAB_LANG"

#: The articles' terms (English -> Chinese).
TERMS: dict[str, str] = {
    "query": "查询",
    "key": "键",
    "value": "值",
    "score": "分数",
    "weight": "权重",
    "mask": "遮罩",
    "causal mask": "因果遮罩",
    "padding": "填充",
    "temperature": "温度",
    "scale": "缩放",
    "row sum": "行和",
    "output": "输出",
    "head": "头",
    "multi-head": "多头",
    "gradient": "梯度",
    "variance": "方差",
    "overflow": "溢出",
    "saturation": "饱和",
    "dot product": "点积",
    "weighted average": "加权平均",
}

#: key -> {"en": text, "zh": text}, every area's table merged (filled by :func:`register`).
MESSAGES: dict[str, dict[str, str]] = {}

#: The modules that register a table; :func:`tr` imports them on the first key it does not know.
_AREAS = ("attnlab.explain.i18n", "attnlab.lab.i18n")
_loaded = False


def register(area: str, entries: Mapping[str, tuple[str, str]]) -> None:
    """Add ``area``'s ``entries`` (key -> ``(english, chinese)``) to :data:`MESSAGES`; a key another area already
    uses is refused (one string, one place)."""
    for key, (en, zh) in entries.items():
        old = MESSAGES.get(key)
        if old is not None and (old["en"], old["zh"]) != (en, zh):
            raise KeyError(f"i18n: {area} redefines the message {key!r}")
        MESSAGES[key] = {"en": en, "zh": zh}


def _load_areas() -> None:
    global _loaded
    if not _loaded:
        _loaded = True
        for name in _AREAS:
            importlib.import_module(name)


def check_lang(lang: Any) -> str:
    """``lang`` if it is one of :data:`LANGS` (an :class:`~attnlab.errors.OptionError` naming it otherwise)."""
    return check_choice("lang", lang, LANGS)


def tr(key: str, lang: str = "en", /, **fields: Any) -> str:
    """The message ``key`` in ``lang`` with ``fields`` filled in (``str.format``)."""
    entry = MESSAGES.get(key)
    if entry is None:
        _load_areas()
        entry = MESSAGES.get(key)
        if entry is None:
            raise KeyError(f"i18n: no message {key!r}")
    s = entry[check_lang(lang)]
    return s.format(**fields) if fields else s


def text(lang: str, english: str, /, **fields: Any) -> str:
    """The lab's convention: ``english`` is its own key (any other key of the catalogue works too); a string
    missing from the catalogue shows as it is (which the browser test of the Chinese view catches)."""
    entry = MESSAGES.get(english)
    if entry is None:
        _load_areas()
        entry = MESSAGES.get(english)
    s = english if entry is None else entry["zh" if lang == "zh" else "en"]
    return s.format(**fields) if fields else s


_E = TypeVar("_E", bound=AttnlabError)


def localized(cls: type[_E], key: str, /, **fields: Any) -> _E:
    """An error of class ``cls`` with the English message ``key`` (fields filled in) that
    :func:`error_message` can give in any language."""
    err = cls(tr(key, "en", **fields))
    err.i18n_key = key
    err.i18n_fields = fields
    return err


def _rows(rows: Sequence[tuple[int, ...]]) -> str:
    return ", ".join(str(r[-1]) for r in rows)


def error_message(err: BaseException, lang: str) -> str:
    """``err``'s message in ``lang``: from the catalogue when it was built by :func:`localized`; a fully masked row
    by its rows; any other attnlab error, in Chinese, by its class (its English text is left for ``--lang en``)."""
    key = getattr(err, "i18n_key", None)
    if key is not None:
        fields = {k: tr(v.key, lang) if isinstance(v, Word) else v for k, v in getattr(err, "i18n_fields", {}).items()}
        return tr(key, lang, **fields)
    if lang == "en":
        return str(err)
    if isinstance(err, MaskedRowError) and err.rows:
        return tr("error.masked_row", lang, rows=_rows(err.rows))
    for cls in type(err).__mro__:
        if f"error.class.{cls.__name__}" in MESSAGES:
            return tr(f"error.class.{cls.__name__}", lang)
    return tr("error.class.AttnlabError", lang)


class Word:
    """A field of a :func:`localized` message that is itself a catalogue word (translated with the message)."""

    def __init__(self, key: str) -> None:
        self.key = key

    def __str__(self) -> str:
        return tr(self.key, "en")

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)


def cli_lang(argv: Sequence[str] | None = None) -> str:
    """The command line's language: ``--lang X`` / ``--lang=X`` in ``argv``, else ``$ATTNLAB_LANG``, else "en"
    (an unknown value counts as "en"; ``--lang``'s own check reports it)."""
    lang = os.environ.get(ENV, "").strip().lower()
    args = list(argv or ())
    for i, a in enumerate(args):
        if a == "--lang" and i + 1 < len(args):
            lang = args[i + 1]
        elif a.startswith("--lang="):
            lang = a.split("=", 1)[1]
    return lang if lang in LANGS else "en"


def localize_type(fn: Any, lang: str, key: str, /, **fields: Any) -> Any:
    """An argparse ``type=`` that says why ``fn`` refused a value with the catalogue's ``key`` in ``lang`` (``{got}``
    is the value typed); English keeps ``fn``'s own message. ``fn=None`` with ``choices=``: a check of the choice."""
    import argparse

    choices = fields.get("choices")
    if lang == "en":
        return fn
    if fn is None:
        assert choices is not None  # fn=None comes with choices=

        def fn(text: str) -> str:
            if text not in choices:
                raise argparse.ArgumentTypeError(text)
            return text

        fields = {**fields, "choices": ", ".join(choices)}

    def parse(text: str) -> Any:
        try:
            return fn(text)
        except (argparse.ArgumentTypeError, ValueError):
            raise argparse.ArgumentTypeError(tr(key, lang, got=text, **fields)) from None

    parse.__name__ = getattr(fn, "__name__", "value")
    return parse


#: argparse's own messages (its fixed English templates; attnlab's messages come from the catalogue) -> key.
_ARGPARSE = (
    ("unrecognized arguments: ", "argparse.unrecognized"),
    ("expected one argument", "argparse.expected_one"),
    ("ignored explicit argument ", "argparse.ignored"),
    ("the following arguments are required: ", "argparse.required"),
    ("not allowed with argument ", "argparse.not_allowed"),
    ("expected a value, got ", "argparse.expected_value"),
)


def _argparse_message(message: str, lang: str) -> str:
    for prefix, key in _ARGPARSE:
        if message.startswith(prefix):
            return tr(key, lang, rest=message[len(prefix) :])
    return tr("argparse.other", lang)


def localize_parser(parser: Any, lang: str, *, command: str) -> None:
    """``parser``'s own words (usage, section titles, ``-h``) and ``command``'s description in ``lang``; English
    leaves argparse as it is."""
    import argparse

    if lang == "en":
        return
    usage = tr("argparse.usage", lang)

    class Formatter(argparse.HelpFormatter):
        def add_usage(self, usage_: Any, actions: Any, groups: Any, prefix: Any = None) -> None:
            super().add_usage(usage_, actions, groups, usage if prefix is None else prefix)

    parser.formatter_class = Formatter
    for group in parser._action_groups:  # argparse's two default groups carry gettext titles
        if group.title == "positional arguments":
            group.title = tr("argparse.positionals", lang)
        elif group.title in ("options", "optional arguments"):
            group.title = tr("argparse.options", lang)
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            action.help = tr("argparse.help", lang)

    def error(message: str) -> None:  # argparse's one-line error (the form of commands.parser), in ``lang``
        flag = ""
        if message.startswith("argument ") and ": " in message:
            names, message = message[len("argument ") :].split(": ", 1)
            parts = names.split("/")
            flag = next((p for p in parts if p.startswith("--")), parts[0]) + "："
        text = message if _is_ours(message, lang) else _argparse_message(message, lang)
        parser.exit(2, tr("cli.error", lang, prog=parser.prog, msg=flag + text) + "\n")

    parser.error = error
    _load_areas()
    key = f"help.{command}.description"
    if key in MESSAGES:
        parser.description = tr(key, lang)


def _is_ours(message: str, lang: str) -> bool:
    """A message a :func:`localize_type` wrote (already in ``lang``): it has a CJK character."""
    return lang != "en" and any("\u4e00" <= c <= "\u9fff" for c in message)


register(
    "attnlab",
    {
        # ---- messages about the learner's input (explain.inputs, explain.args, lab.logic)
        "input.not_number": (
            "{name}: {token!r} at row {i}, column {j} is not a number",
            "{name}：第 {i} 行第 {j} 列的 {token!r} 不是数字",
        ),
        "input.not_finite": (
            "{name}: {token!r} at row {i}, column {j} is not a finite number",
            "{name}：第 {i} 行第 {j} 列的 {token!r} 不是有限的数",
        ),
        "input.empty": (
            "{name}: empty matrix; expected at least one row with at least one number",
            "{name}：矩阵为空；至少需要一行、每行至少一个数字",
        ),
        "input.ragged": (
            "{name}: ragged matrix: row {row} has {n} number(s) but row 0 has {n0}; every row needs the same length",
            "{name}：各行长度不一：第 {row} 行有 {n} 个数字，第 0 行有 {n0} 个；每行需要同样的长度",
        ),
        "input.not_json": (
            "{name}: {text!r} looks like JSON but is not valid JSON (at character {pos})",
            "{name}：{text!r} 看起来像 JSON，但不是合法的 JSON（第 {pos} 个字符处）",
        ),
        "input.mixed_rows": (
            "{name}: row {i} is {row!r}, not a list of numbers; mix of rows and numbers",
            "{name}：第 {i} 行是 {row!r}，不是一列数字；行与数字混在一起",
        ),
        "input.not_matrix": (
            "{name}: expected a matrix (a list of rows), got {kind} {value!r}",
            "{name}：需要一个矩阵（若干行），实际是 {kind} {value!r}",
        ),
        "input.not_mask_entry": (
            "{name}: {token!r} at row {i}, column {j} is not a mask entry; use 1/0, true/false or ■/⬚",
            "{name}：第 {i} 行第 {j} 列的 {token!r} 不是遮罩项；请用 1/0、true/false 或 ■/⬚",
        ),
        "input.tokens_count": (
            "{name}: {n} token(s) {toks} but there are {m} positions; give one per position",
            "{name}：{n} 个 token {toks}，但有 {m} 个位置；每个位置一个",
        ),
        "input.both": (
            "give either an example ({name!r}) or your own matrices (--q/--k/--v/--inputs), not both",
            "请给出一个示例（{name!r}）或你自己的矩阵（--q/--k/--v/--inputs），不要同时给出",
        ),
        "input.no_example": (
            "EXAMPLE: no worked example {name!r}; choose one of {names}",
            "示例：没有名为 {name!r} 的示例；可选：{names}",
        ),
        "input.missing": (
            "missing {flags}: give a named example (see --list) or all of --q, --k, --v",
            "缺少 {flags}：请给出一个命名示例（见 --list），或同时给出 --q、--k、--v",
        ),
        "input.k_width": (
            "--k: d_k={dk} columns but --q has d_k={dq}; Q and K need the same width",
            "--k：有 d_k={dk} 列，而 --q 有 d_k={dq} 列；Q 和 K 需要同样的宽度",
        ),
        "input.v_rows": (
            "--v: {nv} rows but --k has n_k={nk}; one value row per key",
            "--v：有 {nv} 行，而 --k 有 n_k={nk} 行；每个键需要一行值",
        ),
        "input.padding_range": (
            "--padding: expected an int in [0, {n_k}] (n_k = {n_k} keys), got {got}",
            "--padding：需要 [0, {n_k}] 中的整数（共 n_k = {n_k} 个键），实际是 {got}",
        ),
        "input.tokens_self": (
            "--tokens: n_q={n_q} != n_k={n_k}; use --query-tokens and --key-tokens",
            "--tokens：n_q={n_q} ≠ n_k={n_k}；请用 --query-tokens 和 --key-tokens",
        ),
        "input.tokens_file": (
            "tokens: {n} token(s) for n_q={n_q} queries and n_k={n_k} keys",
            "tokens：{n} 个 token，对应 n_q={n_q} 个查询和 n_k={n_k} 个键",
        ),
        "input.mask_shape": (
            "mask: shape {shape} does not fit the scores [n_q, n_k] = {scores}",
            "遮罩：形状 {shape} 与分数矩阵 [n_q, n_k] = {scores} 不符",
        ),
        "input.causal_align": (
            "causal: n_q={n_q} != n_k={n_k}, so the causal diagonal must be placed explicitly.\n"
            "  'top_left' (PyTorch is_causal, JAX): query i sees keys j <= i, e.g. n_q={a}, n_k={b}:{top}\n"
            "  'bottom_right' (FlashAttention, KV-cache decoding): the last query sees every key:{bottom}\n"
            "  {how}",
            "因果遮罩：n_q={n_q} ≠ n_k={n_k}，所以必须明确因果对角线的位置。\n"
            "  top_left（PyTorch 的 is_causal、JAX）：查询 i 看到键 j <= i，例如 n_q={a}、n_k={b}：{top}\n"
            "  bottom_right（FlashAttention、KV Cache 解码）：最后一个查询看到所有键：{bottom}\n"
            "  {how}",
        ),
        "hint.causal_python": (
            "pass causal='top_left' or causal='bottom_right' (masks: align=...)",
            "请传入 causal='top_left' 或 causal='bottom_right'（masks：align=...）",
        ),
        "input.grad_out": (
            "d_out: shape {shape}, expected the output's shape (n_q, d_v) = {want}",
            "d_out（--grad-out）：形状 {shape}，需要与输出相同的形状 (n_q, d_v) = {want}",
        ),
        "input.cannot_read": (
            "{flag}: cannot read {source!r}: {why}",
            "{flag}：无法读取 {source!r}：{why}",
        ),
        "input.file_missing": (
            "{name}: no such file {source!r}",
            "{name}：没有这个文件 {source!r}",
        ),
        # ---- attnlab.plot and attnlab heatmap (every function takes lang=)
        "plot.legend.masked": ("masked (blocked by the mask, weight 0)", "已遮罩（被遮罩屏蔽，权重为 0）"),
        "plot.legend.policy-nan": ("nan (fully masked row, masked_rows='nan')", "nan（全遮罩行，masked_rows='nan'）"),
        "plot.legend.nan": ("nan or inf (not finite where the mask allows)", "nan 或 inf（遮罩允许处的非有限值）"),
        "plot.legend.leak": ("leak (blocked by the mask, yet weight ≠ 0)", "泄漏（被遮罩屏蔽，权重却 ≠ 0）"),
        "plot.masked": ("masked", "已遮罩"),
        "plot.weight": ("weight", "权重"),
        "plot.key_axis": ("key (column): read from", "键（列）：被读取的位置"),
        "plot.query_axis": ("query (row): reader", "查询（行）：读取者"),
        "plot.query": ("query", "查询"),
        "plot.key": ("key", "键"),
        "plot.head": ("head", "头"),
        "plot.title.weights": ("attention weights", "注意力权重"),
        "plot.title.heads": ("{h} heads: rows = queries, columns = keys", "{h} 个头：行 = 查询，列 = 键"),
        "plot.title.last_row": (
            "last query {q}: where it reads from (sum = {s})",
            "最后一个查询 {q}：它从哪里读取（和 = {s}）",
        ),
        "plot.title.mask": ("mask: ■ may attend, ⬚ blocked", "遮罩：■ 允许关注，⬚ 屏蔽"),
        "plot.growth.elements": ("T² score elements", "T² 个分数元素"),
        "plot.growth.linear": ("linear, for comparison", "线性增长，用于对比"),
        "plot.growth.point": ("{a} → {b}: {x}× length, {y}× elements", "{a} → {b}：长度 {x} 倍，元素 {y} 倍"),
        "plot.growth.x": ("sequence length T", "序列长度 T"),
        "plot.growth.y": ("elements of the T×T score matrix", "T×T 分数矩阵的元素数"),
        "plot.growth.mem": ("MiB ({heads} head(s), {b} B each)", "MiB（{heads} 个头，每个元素 {b} 字节）"),
        "plot.growth.title": ("dense attention stores T² scores per head", "稠密 Attention 每个头存储 T² 个分数"),
        "heatmap.growth_input": (
            "--kind growth draws the T² plot from no input; drop {flag}",
            "--kind growth 不需要输入就能画 T² 图；请去掉 {flag}",
        ),
        "heatmap.one_source": ("{a}: one source at a time; {b} is given too", "{a}：一次只能用一个来源；{b} 也给出了"),
        "heatmap.no_source": (
            "give a named example (see --list), --q/--k/--v, --weights or --model",
            "请给出一个命名示例（见 --list）、--q/--k/--v、--weights 或 --model",
        ),
        "heatmap.model_only": ("{flag}: applies to --model only", "{flag}：只用于 --model"),
        "heatmap.need_text": (
            "--text: give the prompt/sentence whose attention --model should draw",
            "--text：请给出 --model 要画注意力的提示或句子",
        ),
        "heatmap.masked_row": ("{msg}{hint}", "{msg}{hint}"),
        "heatmap.wrote": ("wrote {path}", "已写入 {path}"),
        "plot.from_file": ("weights from {path}", "来自 {path} 的权重"),
        # ---- attnlab lab --help
        "help.lab.description": (
            "attnlab lab: open the interactive attention lab (a marimo notebook) on 127.0.0.1, offline.",
            "attnlab lab：在 127.0.0.1 上离线打开交互式注意力实验室（一个 marimo notebook）。",
        ),
        "help.lab.port": (
            "port on 127.0.0.1, 1-65535 (default 0: a free one)",
            "127.0.0.1 上的端口，1-65535（默认 0：任选一个空闲端口）",
        ),
        "help.lab.open": ("open the URL in the default browser", "在默认浏览器中打开网址"),
        "help.lab.edit": (
            "copy the notebook to ./attnlab_lab.py and open marimo's editor (teachers); the URL carries a token",
            "把 notebook 复制到 ./attnlab_lab.py 并打开 marimo 的编辑器（供教师使用）；网址带有访问令牌",
        ),
        "help.lab.timeout": (
            "seconds to wait for the server to start (60)",
            "等待服务器启动的秒数（60）",
        ),
        # ---- attnlab worksheet --help, and attnlab lab --item / --class
        "help.worksheet.description": (
            "attnlab worksheet: a printable worksheet of the articles' items and the lab's questions; the answers "
            "follow a page break.",
            "attnlab worksheet：生成可打印的练习单（两篇文章的条目与实验室的问题），答案在分页之后。",
        ),
        "help.worksheet.output": ("the file to write (.html or .md)", "要写入的文件（.html 或 .md）"),
        "help.worksheet.lang": ("the worksheet's language: en or zh (default en)", "练习单的语言：en 或 zh（默认 en）"),
        "help.worksheet.format": (
            "html or markdown (default: from the file's ending)",
            "html 或 markdown（默认：按文件扩展名）",
        ),
        "help.worksheet.item": (
            "only item N of the articles (1-43, as in docs/learn.md; repeat for more)",
            "只包含第 N 个条目（1-43，与 docs/learn.md 相同；可重复）",
        ),
        "help.worksheet.no_questions": ("leave out the lab's prediction questions", "不包含实验室的预测问题"),
        "worksheet.wrote": (
            "wrote {path} ({items} items, {questions} questions, answers after a page break)",
            "已写入 {path}（{items} 个条目，{questions} 个问题，答案在分页之后）",
        ),
        "help.lab.item": (
            "open the lab on item N of the articles (1-43) or the first item of an explain example, e.g. causal-4",
            "打开实验室并载入第 N 个条目（1-43），或某个 explain 示例的第一个条目，例如 causal-4",
        ),
        "help.lab.class": (
            "class mode (with --item): the item's answer stays hidden until a prediction is committed and revealed",
            "课堂模式（与 --item 一起用）：在提交预测并揭晓之前隐藏该条目的答案",
        ),
        # the worksheet's words (attnlab.lab.worksheet) and class mode's (attnlab.lab.classmode)
        "ws.title": ("attnlab worksheet: attention by hand", "attnlab 练习单：手算注意力"),
        "ws.intro": (
            "Predict each blank before you run the command; the answers are on the last pages.",
            "先预测每个空，再运行命令；答案在最后几页。",
        ),
        "ws.items": ("Part 1. The articles' items", "第一部分：两篇文章的条目"),
        "ws.item": ("Item {n}. Article {source}, {section}", "条目 {n}：文章 {source}，{section}"),
        "ws.command": ("Command:", "命令："),
        "ws.fill": ("Fill in the numbers it prints:", "填写它打印的数："),
        "ws.write": ("Write what it prints and why:", "写出它打印的内容及原因："),
        "ws.questions": (
            "Part 2. Predict, then reveal (the lab's questions)",
            "第二部分：先预测，再揭晓（实验室的问题）",
        ),
        "ws.why": ("Why?", "为什么？"),
        "ws.answers": ("Answers", "答案"),
        "ws.answer_item": ("Item {n}: `{cmd}` prints", "条目 {n}：`{cmd}` 打印"),
        "ws.answer_question": ("Question {n}: {answer}", "问题 {n}：{answer}"),
        "ws.made_by": (
            "Made by `attnlab worksheet --lang {lang}`; every answer is computed by attnlab's core.",
            "由 `attnlab worksheet --lang {lang}` 生成；每个答案都由 attnlab 的核心计算。",
        ),
        "class.hidden": (
            "Class mode: the answer is hidden. Write your prediction below, then switch on reveal.",
            "课堂模式：答案已隐藏。先在下面写下你的预测，再打开“揭晓”。",
        ),
        "class.predict_first": (
            "Write a prediction first: the answer stays hidden until you commit one.",
            "请先写下预测：提交预测之前答案一直隐藏。",
        ),
        "class.hidden_weights": (
            "Class mode: the weights, the output and the pictures appear after the reveal above.",
            "课堂模式：权重、输出和图在上方揭晓之后显示。",
        ),
        "class.prediction": ("your prediction", "你的预测"),
        "class.committed": ("Your committed prediction: {p}", "你提交的预测：{p}"),
        # ---- the command line's values (localize_type) and argparse's own messages, in Chinese
        "argtype.int": ("expected an int >= {lo}, got {got!r}", "需要一个 >= {lo} 的整数，实际是 {got!r}"),
        "argtype.int_range": (
            "expected an int in [{lo}, {hi}], got {got!r}",
            "需要 [{lo}, {hi}] 中的整数，实际是 {got!r}",
        ),
        "argtype.float": ("expected a finite number, got {got!r}", "需要一个有限的数，实际是 {got!r}"),
        "argtype.temperature": (
            "expected a finite number >= 2.2250738585072014e-308 (so that 1/T is finite), got {got!r}",
            "温度需要一个有限的数，且 >= 2.2250738585072014e-308（使 1/T 有限），实际是 {got!r}",
        ),
        "argtype.probability": (
            "expected a probability 0 <= p < 1, got {got!r}",
            "需要一个概率 0 <= p < 1，实际是 {got!r}",
        ),
        "argtype.file": ("no readable file {got!r}", "没有可读取的文件 {got!r}"),
        "argtype.output": (
            "cannot write {got!r}: expected {suffixes} in a folder that exists and is writable",
            "无法写入 {got!r}：需要以 {suffixes} 结尾，且所在文件夹存在并可写",
        ),
        "argtype.text": ("expected some text, got {got!r}", "需要一些文本，实际是 {got!r}"),
        "argtype.choice": ("expected one of {choices}, got {got!r}", "需要 {choices} 之一，实际是 {got!r}"),
        "argparse.unrecognized": ("unrecognized arguments: {rest}", "无法识别的参数：{rest}"),
        "argparse.expected_one": ("expected one argument", "需要一个值"),
        "argparse.ignored": ("ignored explicit argument {rest}", "这个选项不接受值：{rest}"),
        "argparse.required": ("the following arguments are required: {rest}", "缺少必需的参数：{rest}"),
        "argparse.not_allowed": ("not allowed with argument {rest}", "不能与参数 {rest} 同时使用"),
        "argparse.expected_value": ("expected a value, got {rest}", "需要一个值，实际是 {rest}"),
        "argparse.other": (
            "the command line is not valid (see --help)",
            "命令行有误（见 --help；切换到英文（--lang en 或页面的语言开关）可看到 attnlab 的原始信息）",
        ),
        # ---- any other attnlab error, by its class (the English text is there with --lang en)
        "error.masked_row": (
            "query row(s) {rows} may attend to no key at all (every key is masked)",
            "查询行 {rows} 没有任何可关注的键（所有键都被遮罩）",
        ),
        "error.class.AttnlabError": (
            "attnlab refused the input",
            "attnlab 拒绝了这个输入（切换到英文（--lang en 或页面的语言开关）可看到 attnlab 的原始信息）",
        ),
        "error.class.ShapeError": (
            "a shape does not fit",
            "形状不匹配：请核对 Q、K、V、遮罩和偏置的行数与列数（切换到英文（--lang en 或页面的语言开关）可看到 attnlab 的原始信息）",
        ),
        "error.class.MaskError": (
            "the mask does not fit",
            "遮罩不符合要求（切换到英文（--lang en 或页面的语言开关）可看到 attnlab 的原始信息）",
        ),
        "error.class.NonFiniteError": (
            "an input is NaN or infinite",
            "输入中有 NaN 或无穷大；每个数都必须是有限的",
        ),
        "error.class.RangeError": (
            "a value does not fit the dtype it is computed in",
            "数值超出了计算所用数据类型的范围（例如 logits 溢出）；请用更小的输入、缩放或温度",
        ),
        "error.class.DTypeError": (
            "an input has a dtype attnlab cannot compute with",
            "输入的数据类型无法计算；请给出数字",
        ),
        "error.class.OptionError": (
            "an option's value is not allowed",
            "某个选项的值不被允许（切换到英文（--lang en 或页面的语言开关）可看到 attnlab 的原始信息）",
        ),
        "error.class.MemoryLimitError": (
            "the input would need too much memory",
            "这个输入需要的内存太多；请用更短的序列",
        ),
    },
)
