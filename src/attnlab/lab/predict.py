"""Predict, commit, then run: a prediction is locked the moment its result is revealed, and the lab keeps score.

The notebook keeps one :class:`Book` per open page (a marimo state). :func:`commit` locks the prediction the
learner had picked when they first revealed an experiment; picking another option afterwards is shown as a change
("you committed X, now you say Y"), never as a right prediction. :func:`score` counts the committed ones.

Each question (:data:`QUESTIONS`) has option *keys*; the page shows their words in the chosen language, so a
committed prediction stays the same when the language is switched.

>>> b = commit(Book(), "shift", "sharper", True)
>>> b = commit(b, "shift", "same", True)         # changed after the reveal: still the first answer
>>> b.entries["shift"].prediction, score(b)
('sharper', (0, 1))
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field, replace

from .i18n import t

__all__ = ["QUESTIONS", "Book", "Entry", "Question", "commit", "feedback_html", "options", "score", "score_html"]


@dataclass(frozen=True)
class Question:
    """One predict-then-reveal question: its text, ``options`` as (key, English words), the ``correct`` key."""

    id: str
    text: str
    options: tuple[tuple[str, str], ...]
    correct: str

    def label(self, key: str, lang: str = "en") -> str:
        """The text of option ``key`` in ``lang``."""
        return t(lang, dict(self.options)[key])


#: The lab's questions, in page order (article 000's experiments and both halves of its self-test).
QUESTIONS: dict[str, Question] = {
    q.id: q
    for q in (
        Question(
            "shift",
            "**1. Add 10 to every legal score.** What happens to the weights?",
            (
                ("same", "the weights stay the same"),
                ("sharper", "the weights get sharper"),
                ("flatter", "the weights get flatter"),
            ),
            "same",
        ),
        Question(
            "temperature",
            "**2. Raise the temperature to 3.** What happens?",
            (
                ("flatter", "each row gets flatter over its legal keys"),
                ("sharper", "each row gets sharper"),
                ("leak", "masked keys start to get weight"),
            ),
            "flatter",
        ),
        Question(
            "value",
            "**3. Change v₀ to [100, 0]** (first value vector; V needs 2 columns). What changes?",
            (
                ("both", "weights change, output changes"),
                ("output", "weights stay, output changes"),
                ("nothing", "nothing changes"),
            ),
            "output",
        ),
        Question(
            "four",
            "**4. Four 2-D Q/K pairs, causal mask on.** What is the first row of the weights?",
            (
                ("one", "[1, 0, 0, 0]"),
                ("uniform", "[0.25, 0.25, 0.25, 0.25]"),
                ("depends", "it depends on the temperature"),
            ),
            "one",
        ),
        Question(
            "self100",
            "**Self-test, part 1: add 100 to every legal score of every row.** Does the output change?",
            (("no", "no, the output stays the same"), ("yes", "yes, the output changes"), ("overflow", "it overflows")),
            "no",
        ),
        Question(
            "selfbias",
            "**Self-test, part 2: add a different bias to each key's column** (the bias box above, or 0, 1, 2, … "
            "here). Do the weights change?",
            (
                ("yes", "yes, keys with a larger bias gain weight"),
                ("no", "no, softmax ignores any added constant"),
                ("masked", "only the masked keys change"),
            ),
            "yes",
        ),
    )
}


def options(question: Question, lang: str = "en") -> dict[str, str]:
    """The radio's options: the words shown in ``lang`` -> the option's key."""
    return {t(lang, words): key for key, words in question.options}


@dataclass(frozen=True)
class Entry:
    """One committed prediction: the option key picked at the reveal, and the right key."""

    prediction: str
    correct: str

    @property
    def right(self) -> bool:
        """Whether the committed prediction is the correct answer."""
        return self.prediction == self.correct


@dataclass(frozen=True)
class Book:
    """Every committed prediction of this page, by experiment id (immutable: :func:`commit` returns a new one)."""

    entries: dict[str, Entry] = field(default_factory=dict)


def commit(book: Book, exp: str, prediction: str | None, revealed: bool) -> Book:
    """``book`` with ``exp``'s prediction locked if it is revealed now, has a prediction and was not locked yet."""
    if not revealed or not prediction or exp in book.entries:
        return book
    return replace(book, entries={**book.entries, exp: Entry(prediction, QUESTIONS[exp].correct)})


def score(book: Book) -> tuple[int, int]:
    """(right, committed) over every experiment of the page."""
    return sum(e.right for e in book.entries.values()), len(book.entries)


def score_html(book: Book, lang: str = "en") -> str:
    """The running score for the page (``data-right``/``data-total`` for tests)."""
    right, total = score(book)
    if total == 0:
        text = t(lang, "Score: no prediction committed yet (predict, then reveal)")
    else:
        text = t(lang, "Score: {right} of {total} committed predictions right", right=right, total=total)
    return (
        f'<div data-testid="al-score" data-right="{right}" data-total="{total}" '
        f'style="font-weight:bold;padding:6px 10px;border:1px solid #9ecae1;background:#f7fbff;color:#08306b">'
        f"{html.escape(text)}</div>"
    )


def feedback_html(book: Book, exp: str, current: str | None, lang: str = "en") -> str:
    """What the page says under a revealed experiment: predict first, right, wrong, or changed after the reveal."""
    e = book.entries.get(exp)
    if e is None:
        return (
            f'<p data-testid="al-feedback" data-verdict="none"><b>{html.escape(t(lang, "Make a prediction first"))}'
            f"</b> {html.escape(t(lang, '(pick one above), then reveal: the result stays hidden until then.'))}</p>"
        )
    esc = html.escape
    q = QUESTIONS[exp]
    p, c = q.label(e.prediction, lang), q.label(e.correct, lang)
    if e.right:
        msg = (
            f"<b style='color:#006d2c'>{esc(t(lang, 'Your prediction was right:'))}</b> "
            f"{esc(t(lang, 'you committed “{p}”.', p=p))}"
        )
        verdict = "right"
    else:
        msg = (
            f"<b style='color:#a50f15'>{esc(t(lang, 'Not quite.'))}</b> "
            f"{esc(t(lang, 'You committed “{p}”; the answer is “{c}”.', p=p, c=c))}"
        )
        verdict = "wrong"
    if current and current != e.prediction:
        msg += " " + esc(
            t(
                lang,
                "You changed your answer to “{now}” after the reveal; the score keeps “{p}”.",
                now=q.label(current, lang),
                p=p,
            )
        )
        verdict += "-changed"
    return f'<p data-testid="al-feedback" data-verdict="{verdict}">{msg}</p>'
