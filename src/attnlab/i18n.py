"""attnlab's words for learners in English (the default) and Chinese: one catalogue, one lookup.

Every area registers its own table with :func:`register` (key -> ``(english, chinese)``): ``attnlab.explain.i18n``
(the steps, lessons, titles and ``attnlab explain``'s help), ``attnlab.lab.i18n`` (the lab's page; its keys are the
English text itself) and this module (messages about bad input, errors by class, ``attnlab heatmap``'s labels).
The tables of messages are data for translators, ``attnlab/catalogues/*.toml``, read by :func:`read_catalogue`.
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
from collections.abc import Callable, Mapping, Sequence
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
    "help_for",
    "localize_parser",
    "localize_type",
    "localized",
    "read_catalogue",
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


def read_catalogue(area: str) -> dict[str, tuple[str, str]]:
    """The table ``attnlab/catalogues/{area}.toml`` shipped with attnlab, key -> ``(english, chinese)``, in file order.

    The file is data for translators: one TOML table per key (``["label.weights"]``) holding ``en`` and ``zh``
    and nothing else (a :class:`KeyError` naming the key and the file otherwise).

    >>> read_catalogue("attnlab")["plot.weight"]
    ('weight', '权重')
    """
    import tomllib
    from importlib.resources import files

    name = f"catalogues/{area}.toml"
    data = tomllib.loads(files(__package__).joinpath(name).read_text(encoding="utf-8"))
    table = {}
    for key, entry in data.items():
        if not isinstance(entry, dict) or sorted(entry) != ["en", "zh"]:
            raise KeyError(f"i18n: {name}: [{key!r}] must hold exactly en and zh, got {entry!r}")
        table[key] = (entry["en"], entry["zh"])
    return table


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


def help_for(prefix: str, lang: str) -> Callable[..., str]:
    """A command's help lookup: ``h(key, **fields)`` is ``tr(f"{prefix}.{key}", lang, **fields)``."""

    def h(key: str, **fields: Any) -> str:
        return tr(f"{prefix}.{key}", lang, **fields)

    return h


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


register("attnlab", read_catalogue("attnlab"))
