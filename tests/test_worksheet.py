"""``attnlab worksheet`` and :mod:`attnlab.lab.worksheet`: every item and question present, the answers only after
the page break, and every answer a line that ``attnlab explain`` itself prints (computed here again, independently
of the worksheet), in English and in Chinese."""

from __future__ import annotations

import html
import re

import pytest

from attnlab.articles import ITEMS
from attnlab.cli import main
from attnlab.explain.request import explain_argv
from attnlab.lab.predict import QUESTIONS
from attnlab.lab.worksheet import PAGE_BREAK, to_html, to_markdown, worksheet

pytestmark = pytest.mark.xdist_group("test_worksheet")

NUMBER = re.compile(r"\d+(?:\.\d+)?")


@pytest.fixture(scope="module", params=["en", "zh"])
def sheet(request):
    return worksheet(request.param)


def test_every_item_and_question_is_there_questions_before_answers(sheet):
    assert [s.number for s in sheet.items] == list(range(1, len(ITEMS) + 1))
    assert len(sheet.questions) == len(QUESTIONS)
    for text in (to_html(sheet), to_markdown(sheet)):
        assert text.count(PAGE_BREAK) == 1
        before, after = text.split(PAGE_BREAK)
        for s in sheet.items:
            assert html.escape(s.heading) in before or s.heading in before
            assert html.escape(s.command) in after or s.command in after
        for q in sheet.questions:
            assert html.escape(q.text) in before or q.text in before
            assert all(html.escape(o) in before or o in before for o in q.options)
    h = to_html(sheet)
    assert "<script" not in h and "http" not in h.split("</style>")[0]  # self-contained, nothing fetched
    before, after = h.split(PAGE_BREAK)
    assert [int(n) for n in re.findall(r'data-item="(\d+)"', before)] == list(range(1, len(ITEMS) + 1))
    assert [int(n) for n in re.findall(r'data-answer="(\d+)"', after)] == list(range(1, len(ITEMS) + 1))
    assert "data-answer" not in before


def test_answers_are_attnlab_explains_lines_and_appear_only_after_the_break(sheet):
    before = to_html(sheet).split(PAGE_BREAK)[0] + to_markdown(sheet).split(PAGE_BREAK)[0]
    for s in sheet.items:
        it = ITEMS[s.number - 1]
        _, out = explain_argv(tuple(it.argv), sheet.lang)
        printed = {ln.strip() for ln in out.splitlines()}
        assert s.answers and all(a in printed for a in s.answers), (s.number, s.answers)
        if sheet.lang == "en":  # the article's numbers, as attnlab writes them, are in the answers
            assert all(any(e in a for a in s.answers) for e in it.expect), (s.number, it.expect, s.answers)
        for a, b in zip(s.answers, s.blanks, strict=False):
            assert not [n for n in re.findall(r"\d+\.\d+", a) if n in b], (a, b)  # the question: numbers blanked
            if b != a:  # a line with numbers to find
                assert a not in before and html.escape(a) not in before, (s.number, a)
    for q, ref in zip(sheet.questions, QUESTIONS.values(), strict=True):
        assert q.answer == ref.label(ref.correct, sheet.lang)


def test_the_chinese_worksheet_has_no_english_words_of_its_own():
    zh = to_html(worksheet("zh", items=(1, 21)))
    for word in ("Item", "Article", "Command", "Fill in", "Answers", "Predict", "Part ", "Why?"):
        assert word not in zh, word
    assert "条目 21：文章 001" in zh and "答案" in zh and "attnlab explain 2x2 --lang zh" in zh


def test_the_command_writes_the_file_and_names_a_bad_argument(tmp_path, capsys):
    out = tmp_path / "ws.md"
    assert main(["worksheet", "-o", str(out), "--item", "21", "--lang", "zh"]) == 0
    text = out.read_text(encoding="utf-8")
    assert "条目 21" in text and PAGE_BREAK in text and "q0  0.6698  0.3302" in text.split(PAGE_BREAK)[1]
    assert "已写入" in capsys.readouterr().out
    assert main(["worksheet", "-o", str(tmp_path / "ws.txt")]) == 2
    assert "-o/--output: " in capsys.readouterr().err
    assert main(["worksheet", "-o", str(out), "--item", "99"]) == 2
    assert "--item: expected an int in [1, 43], got 99" in capsys.readouterr().err
    assert main(["worksheet", "-o", str(tmp_path / "no" / "ws.html")]) == 1
    assert "-o/--output: cannot write" in capsys.readouterr().err
