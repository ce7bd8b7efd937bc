"""Plots: what is drawn is the data (image arrays, bar heights, labels), masked cells are distinct from small
weights, files are real PNG/SVG/PDF, matplotlib is imported only when a plot is made; ``attnlab heatmap`` CLI."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from matplotlib.patches import Rectangle
from reference import reference_attention

from attnlab import masks, plot
from attnlab.cli import main
from attnlab.errors import DTypeError, ShapeError

W = np.array([[1.0, 0.0, 0.0], [0.3, 0.7, 0.0], [0.001, 0.499, 0.5]])
ALLOWED = masks.causal(3)
MAGIC = {"png": b"\x89PNG", "svg": b"<?xml", "pdf": b"%PDF"}


def texts(ax) -> list[str]:
    return [t.get_text() for t in ax.texts]


def test_import_attnlab_and_its_presentation_modules_stays_light():
    code = (
        "import sys, attnlab, attnlab.plot, attnlab.explain, attnlab.lab, attnlab.lab.logic, attnlab.lab.server;"
        "heavy = [m for m in ('matplotlib', 'marimo', 'rich', 'torch') if m in sys.modules];"
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_heatmap_draws_weights_masked_cells_distinctly_and_row_sums():
    fig = plot.heatmap(W, ALLOWED, query_labels=["I", "like", "cats"], key_labels=["I", "like", "cats"], title="t")
    ax = fig.axes[0]
    img = ax.images[0]
    data = img.get_array()
    np.testing.assert_array_equal(np.ma.getmaskarray(data), ~ALLOWED)
    np.testing.assert_array_equal(data.data[ALLOWED], W[ALLOWED])
    assert img.get_clim() == (0.0, 1.0)
    # masked cells: a hatched grey patch and the word "masked"; the tiny weight 0.001 is an ordinary cell
    hatched = [p for p in ax.patches if isinstance(p, Rectangle) and p.get_hatch() == "///"]
    assert len(hatched) == int((~ALLOWED).sum()) == 3
    assert texts(ax).count("masked") == 3
    assert "0.001" in texts(ax) and "0.5" in texts(ax)  # a tiny weight keeps its digit; never "masked"
    assert [t.get_text() for t in ax.get_xticklabels()] == ["I", "like", "cats"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["I", "like", "cats"]
    assert ax.get_xlabel().startswith("key") and ax.get_ylabel().startswith("query")
    right = ax.child_axes[0]
    assert [t.get_text() for t in right.get_yticklabels()] == ["Σ=1.00", "Σ=1.00", "Σ=1.00"]
    assert len(fig.axes) == 2 and fig.axes[1].get_ylabel() == "weight"  # the colour bar


def test_heatmap_of_a_real_trace_and_nan_rows():
    q = np.array([[1.0, 0], [0, 1], [1, 1], [1, -1]])
    _, ref = reference_attention(q, q, q, allowed=masks.causal(4))
    fig = plot.heatmap(ref, masks.causal(4), values=False)
    assert len(fig.axes[0].texts) == 0
    nan = W.copy()
    nan[1] = np.nan
    ax = plot.heatmap(nan, ALLOWED).axes[0]
    red = [
        p for p in ax.patches if isinstance(p, Rectangle) and p.get_hatch() in (None, "") and p.get_facecolor()[0] > 0.8
    ]
    assert len(red) == 2 and texts(ax).count("nan") == 2


def test_head_grid_last_row_mask_and_growth():
    rng = np.random.default_rng(0)
    w = rng.random((5, 3, 3)) * ALLOWED
    w /= w.sum(-1, keepdims=True)
    fig = plot.head_grid(w, ALLOWED, head_names=[f"h{i}" for i in range(5)], columns=3)
    assert len([ax for ax in fig.axes if ax.images]) == 5
    heads = [ax for ax in fig.axes if ax.get_title().startswith("h")]
    assert [ax.get_title() for ax in heads] == ["h0", "h1", "h2", "h3", "h4"]
    for i, ax in enumerate(heads):
        np.testing.assert_array_equal(ax.images[0].get_array().data[ALLOWED], w[i][ALLOWED])

    bar = plot.last_row_bar(W, ALLOWED, key_labels=["a", "b", "c"]).axes[0]
    heights = [p.get_height() for p in bar.patches[:3]]
    np.testing.assert_allclose(heights, W[-1])
    assert "sum = 1.000" in bar.get_title()
    masked_bar = plot.last_row_bar(W[:2], ALLOWED[:2]).axes[0]
    assert "masked" in texts(masked_bar)

    pic = plot.mask_picture(ALLOWED).axes[0]
    np.testing.assert_array_equal(pic.images[0].get_array(), ALLOWED.astype(float))
    assert texts(pic).count("■") == 6 and texts(pic).count("⬚") == 3

    g = plot.growth_plot().axes[0]
    x, y = g.lines[0].get_data()
    np.testing.assert_array_equal(y, x**2)
    assert any("1,024 → 4,096: 4× length, 16× elements" in t.get_text() for t in g.texts)


@pytest.mark.parametrize("fmt", ["png", "svg", "pdf"])
def test_save_writes_real_files(tmp_path, fmt):
    path = plot.save(plot.heatmap(W, ALLOWED), tmp_path / f"h.{fmt}")
    assert path.read_bytes().startswith(MAGIC[fmt])
    assert plot.to_bytes(plot.mask_picture(ALLOWED), fmt).startswith(MAGIC[fmt])


def test_plot_errors_name_the_argument(tmp_path):
    with pytest.raises(ShapeError, match=r"weights: expected \[n_q, n_k\], got shape \(2, 3, 3\)"):
        plot.heatmap(np.ones((2, 3, 3)))
    with pytest.raises(DTypeError, match="weights: expected numbers, got dtype bool"):
        plot.heatmap(ALLOWED)
    with pytest.raises(DTypeError, match="allowed: expected a bool mask"):
        plot.heatmap(W, ALLOWED.astype(int))
    with pytest.raises(ShapeError, match=r"allowed: shape \(2,\) does not fit weights \(3, 3\)"):
        plot.heatmap(W, np.array([True, False]))
    with pytest.raises(ShapeError, match="key_labels: 2 label"):
        plot.heatmap(W, key_labels=["a", "b"])
    with pytest.raises(ValueError, match=r"must end in .png, .svg or .pdf \(got '.gif'\)"):
        plot.save(plot.heatmap(W), tmp_path / "h.gif")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        plot.save(plot.heatmap(W), tmp_path / "no" / "h.png")


def test_inputs_are_not_modified():
    w = W.copy()
    w.setflags(write=False)
    plot.heatmap(w, ALLOWED)
    np.testing.assert_array_equal(w, W)


# ---------------------------------------------------------------------------------------------------------------
# attnlab heatmap


def test_heatmap_cli_every_kind_and_source(tmp_path, capsys):
    out = tmp_path / "c4.png"
    assert main(["heatmap", "causal-4", "--tokens", "I like green cats", "-o", str(out)]) == 0
    assert out.read_bytes().startswith(MAGIC["png"])
    assert capsys.readouterr().out == f"wrote {out}\n"
    for kind, ext in (("last-row", "svg"), ("mask", "pdf"), ("growth", "png")):
        p = tmp_path / f"{kind}.{ext}"
        source = [] if kind == "growth" else ["2x2-causal"]  # growth draws from no input
        assert main(["heatmap", *source, "--kind", kind, "-o", str(p)]) == 0
        assert p.read_bytes().startswith(MAGIC[ext])
    assert main(["heatmap", "saturation", "-o", str(tmp_path / "s.png")]) == 0
    w = np.random.default_rng(0).random((4, 3, 3))
    np.save(tmp_path / "w.npy", w / w.sum(-1, keepdims=True))
    assert main(["heatmap", "--weights", str(tmp_path / "w.npy"), "-o", str(tmp_path / "grid.png")]) == 0
    assert (tmp_path / "grid.png").exists()
    assert (
        main(["heatmap", "--q", "1,0;0,1", "--k", "1,0;0,1", "--v", "1;2", "--causal", "-o", str(tmp_path / "own.svg")])
        == 0
    )


def test_heatmap_cli_errors(tmp_path, capsys):
    assert main(["heatmap", "causal-4", "-o", str(tmp_path / "x.gif")]) == 2
    assert "--output: " in (err := capsys.readouterr().err) and "must end in .png, .svg or .pdf" in err
    assert main(["heatmap", "-o", str(tmp_path / "x.png")]) == 2
    assert "give a named example" in capsys.readouterr().err
    assert main(["heatmap", "--q", "1,a", "--k", "1,0", "--v", "1", "-o", str(tmp_path / "x.png")]) == 2
    assert "--q: 'a' at row 0, column 1 is not a number" in capsys.readouterr().err


def test_heatmap_sources_are_pluggable():
    from attnlab.commands import heatmap

    assert set(heatmap.SOURCES) == {"inputs", "weights", "model"}
    fields = heatmap.HeatmapData.__dataclass_fields__
    assert {"weights", "allowed", "query_labels", "key_labels", "title"} <= set(fields)


@pytest.mark.parametrize(
    ("blocked", "call", "hint"),
    [
        ("matplotlib", "from attnlab import plot; plot.heatmap([[1.0]])", "pip install 'attnlab[plot]'"),
        (
            "rich",
            "from attnlab.explain import print_rich, explain_example; print_rich(explain_example('2x2'))",
            "pip install 'attnlab[explain]'",
        ),
        ("marimo", "from attnlab.lab.server import start; start()", "pip install 'attnlab[lab]'"),
    ],
)
def test_a_missing_extra_is_a_one_line_install_hint(blocked, call, hint):
    code = (
        f"import sys; sys.modules[{blocked!r}] = None\n"
        "from attnlab.errors import MissingExtraError\n"
        f"try:\n    {call}\nexcept MissingExtraError as e:\n    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == f"{blocked} is not installed; it comes with: {hint}"


def test_svg_keeps_real_text():
    svg = plot.to_bytes(plot.heatmap(W, ALLOWED, key_labels=["I", "like", "cats"]), "svg").decode()
    assert "<text" in svg and ">like<" in svg and ">masked<" in svg
