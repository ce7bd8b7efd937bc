"""Every example and lesson that ``attnlab heatmap --help`` names draws a picture (issue 22 §5: ``attnlab heatmap
growth`` failed with "weights: expected [n_q, n_k], got shape ()"). matplotlib's Agg backend, a small --dpi."""

from __future__ import annotations

import warnings

import pytest

from attnlab.articles import LESSONS
from attnlab.cli import main
from attnlab.explain.args import EXAMPLE_NAMES


def test_the_help_names_the_examples_drawn_here(capsys):
    try:
        main(["heatmap", "--help"])
    except SystemExit:
        pass
    shown = "".join(capsys.readouterr().out.split())  # argparse wraps the list
    assert all(name in shown for name in EXAMPLE_NAMES) and set(LESSONS) <= set(EXAMPLE_NAMES)


#: The lessons (no Q, K, V of their own: drawn by LESSON_PICTURES or their weights) and the one example with
#: Chinese token labels; the other examples are plain Q, K, V, drawn by tests/test_plot.py's paths.
DRAWN = (*LESSONS, "padding")


@pytest.mark.parametrize("name", DRAWN)
def test_every_named_example_and_lesson_draws_a_png(tmp_path, capsys, name):
    out = tmp_path / f"{name}.png"
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # a missing glyph (Chinese token labels) is a failure
        assert main(["heatmap", name, "-o", str(out), "--dpi", "30"]) == 0, capsys.readouterr().err
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 1000
