"""Every ``# type: ignore`` and ``# noqa`` in src/ names what it silences and says why (issue 21, "Typed").

mypy itself (``python -m mypy`` in scripts/test.sh, configured in pyproject.toml) refuses an ignore without an
error code (``ignore-without-code``) and one that silences nothing (``warn_unused_ignores``); this test adds the
reason, which no tool checks: ``# type: ignore[attr-defined]  # numpy's stubs lack X``, ``# noqa: E501  # a URL``.
"""

from __future__ import annotations

import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "attnlab"

# the codes, then at least two spaces (or a space and an opening parenthesis) and some text
_IGNORE = re.compile(r"#\s*type:\s*ignore(?P<codes>\[[a-z0-9-]+(?:,\s*[a-z0-9-]+)*\])?(?P<rest>.*)$")
_NOQA = re.compile(r"#\s*(?:ruff:\s*)?noqa(?P<codes>:\s*[A-Z]+[0-9]+(?:,\s*[A-Z]+[0-9]+)*)?(?P<rest>.*)$")
_REASON = re.compile(r"^\s+(?:#\s*|\()\S")


def _comments() -> list[tuple[str, int, str, re.Match[str]]]:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for pattern in (_IGNORE, _NOQA):
                m = pattern.search(line)
                if m is not None:
                    found.append((str(path.relative_to(SRC.parent)), n, line.strip(), m))
    return found


def test_the_scan_finds_the_comments_it_checks() -> None:
    # a scan that matched nothing would pass vacuously: the noqa of the i18n catalogues are always there
    assert any("i18n.py" in where for where, _, _, _ in _comments())


def test_every_type_ignore_and_noqa_in_src_has_codes_and_a_reason() -> None:
    bad = [
        f"{where}:{n}: {line}"
        for where, n, line, m in _comments()
        if m.group("codes") is None or not _REASON.match(m.group("rest"))
    ]
    assert not bad, "a type: ignore / noqa without its error codes or its reason:\n" + "\n".join(bad)


def test_the_rule_itself() -> None:
    ok = ["x = 1  # type: ignore[attr-defined]  # numpy's stubs lack it", "import a  # noqa: F401  # only whether"]
    ok += ["# ruff: noqa: E501  (Chinese characters count double)"]
    bad = ["x = 1  # type: ignore", "x = 1  # type: ignore[attr-defined]", "import a  # noqa", "import a  # noqa: F401"]
    for line in ok + bad:
        m = _IGNORE.search(line) or _NOQA.search(line)
        assert m is not None, line
        verdict = m.group("codes") is not None and bool(_REASON.match(m.group("rest")))
        assert verdict is (line in ok), line
