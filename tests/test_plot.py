"""Plots: what is drawn is the data (image arrays, bar heights, labels), masked cells are distinct from small
weights, files are real PNG/SVG/PDF, matplotlib is imported only when a plot is made; ``attnlab heatmap`` CLI."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from matplotlib.text import Text
from reference import reference_attention

import attnlab
from attnlab import masks, plot
from attnlab.cli import main
from attnlab.errors import DTypeError, ShapeError
from attnlab.plot.layout import MIN_FONT_PT

W = np.array([[1.0, 0.0, 0.0], [0.3, 0.7, 0.0], [0.001, 0.499, 0.5]])
ALLOWED = masks.causal(3)
MAGIC = {"png": b"\x89PNG", "svg": b"<?xml", "pdf": b"%PDF"}


def texts(ax) -> list[str]:
    return [t.get_text() for t in ax.texts]


def cells_of(ax, label: str) -> int:
    """How many cells of the heatmap on ``ax`` are drawn in the style ``label`` (masked, policy-nan, nan)."""
    return sum(len(c.get_paths()) for c in ax.collections if c.get_label() == label)


# ---------------------------------------------------------------------------------------------------------------
# Pictures that read well: measured on the Agg renderer, not trusted from the layout code. Everything here is an
# independent check: text extents from matplotlib itself, colours from the rendered pixels, WCAG 2 formulas below.


def luminance(rgb) -> float:
    c = np.asarray(rgb[:3], dtype=np.float64)
    c = np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)
    return float(c @ [0.2126, 0.7152, 0.0722])


def wcag(a, b) -> float:
    la, lb = sorted((luminance(a), luminance(b)))
    return (lb + 0.05) / (la + 0.05)


def drawn_texts(fig) -> list[Text]:
    """Every non-empty visible text of ``fig``: titles, axis labels, tick labels (colour bar and row sums too), cell
    texts and legends."""
    out = [c for c in fig.get_children() if isinstance(c, Text)]  # suptitle, figure texts
    for leg in fig.legends:
        out += leg.get_texts()
    todo = list(fig.axes)
    while todo:
        ax = todo.pop()
        todo += ax.child_axes
        out += [ax.title, ax.xaxis.label, ax.yaxis.label, *ax.texts]
        for axis in (ax.xaxis, ax.yaxis):  # tick labels drawn: those whose tick lies in the view
            lo, hi = sorted(axis.get_view_interval())
            out += [t for x, t in zip(axis.get_ticklocs(), axis.get_ticklabels(), strict=True) if lo <= x <= hi]
    return [t for t in out if t.get_visible() and t.get_text().strip()]


def check_reads_well(fig, path) -> dict:
    """Draw ``fig`` and save it to ``path`` (as it is: attnlab sizes the figure, nothing is cropped); check, at its
    dpi: every text inside the figure, at least MIN_FONT_PT, no two texts overlapping, each cell text (and its
    background box) inside its cell, every text >= 4.5:1 against the pixels under it."""
    from matplotlib.image import imsave

    fig.canvas.draw()
    imsave(path, np.asarray(fig.canvas.buffer_rgba()))  # what was measured is what is saved
    r = fig.canvas.get_renderer()
    ts = drawn_texts(fig)
    assert ts
    boxes = np.array([t.get_window_extent(r).extents for t in ts])  # x0, y0, x1, y1 in pixels
    W, H = fig.bbox.width, fig.bbox.height
    tol = 0.5
    outside = [
        (t.get_text(), b.round(1))
        for t, b in zip(ts, boxes, strict=True)
        if b[0] < -tol or b[1] < -tol or b[2] > W + tol or b[3] > H + tol
    ]
    assert not outside, f"clipped: {outside[:5]} (figure {W}x{H})"
    small = [(t.get_text(), t.get_fontsize()) for t in ts if t.get_fontsize() < MIN_FONT_PT]
    assert not small, small
    # pairwise overlap, more than 1 pixel in both directions
    ox = np.minimum(boxes[:, None, 2], boxes[None, :, 2]) - np.maximum(boxes[:, None, 0], boxes[None, :, 0])
    oy = np.minimum(boxes[:, None, 3], boxes[None, :, 3]) - np.maximum(boxes[:, None, 1], boxes[None, :, 1])
    hit = np.triu((ox > 1) & (oy > 1), 1)
    pairs = [(ts[i].get_text(), ts[j].get_text()) for i, j in zip(*np.nonzero(hit), strict=True)]
    assert not pairs, f"overlapping texts: {pairs[:5]}"
    # cell texts inside their cells
    n_cell_texts = 0
    for ax in fig.axes:
        if not ax.images:
            continue
        for t in ax.texts:
            j, i = t.get_position()
            (x0, y0), (x1, y1) = ax.transData.transform([(j - 0.5, i + 0.5), (j + 0.5, i - 0.5)])
            for e in (
                t.get_window_extent(r),
                *([t.get_bbox_patch().get_window_extent(r)] if t.get_bbox_patch() else []),
            ):
                assert x0 - tol <= e.x0 and e.x1 <= x1 + tol and y0 - tol <= e.y0 and e.y1 <= y1 + tol, (
                    f"{t.get_text()!r} at cell ({i}, {j}) is {e.extents.round(1)}, the cell {[x0, y0, x1, y1]}"
                )
            n_cell_texts += 1
    # contrast against what is under each text: the picture drawn with transparent text (boxes stay)
    colours = [t.get_color() for t in ts]
    for t in ts:
        t.set_color("none")
    fig.canvas.draw()
    under = np.asarray(fig.canvas.buffer_rgba())[..., :3] / 255.0
    for t, c in zip(ts, colours, strict=True):
        t.set_color(c)
    from matplotlib.colors import to_rgb

    worst = 21.0
    for t, b in zip(ts, boxes, strict=True):
        x0, y0, x1, y1 = b
        xs = slice(int(np.ceil(x0)) + 1, max(int(np.floor(x1)) - 1, int(np.ceil(x0)) + 2))
        ys = slice(int(np.ceil(H - y1)) + 1, max(int(np.floor(H - y0)) - 1, int(np.ceil(H - y1)) + 2))
        region = under[ys, xs].reshape(-1, 3)
        cx, cy = int((x0 + x1) / 2), int(H - (y0 + y1) / 2)
        fg = to_rgb(t.get_color())
        ratio = min(wcag(fg, under[cy, cx]), min(wcag(fg, px) for px in np.unique(region, axis=0)))
        assert ratio >= 4.5, f"{t.get_text()!r}: contrast {ratio:.2f} of {t.get_color()} on {under[cy, cx]}"
        worst = min(worst, ratio)
    return {"texts": len(ts), "cell_texts": n_cell_texts, "worst_contrast": worst, "size": (W, H)}


def softmax_rows(n_q: int, n_k: int, allowed, seed: int = 0, spread: float = 3.0) -> np.ndarray:
    s = np.random.default_rng(seed).normal(size=(n_q, n_k)) * spread
    s = np.where(allowed, s, -np.inf)
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@pytest.mark.parametrize(
    ("n_q", "n_k", "values"),
    [(1, 1, None), (2, 2, None), (24, 24, True), (32, 32, None), (1, 20, True)],  # 3-12: grid and nan tests
)
def test_heatmap_reads_well_at_every_size(tmp_path, n_q, n_k, values):
    allowed = masks.causal(n_q, n_k, align="bottom_right")
    w = softmax_rows(n_q, n_k, allowed)
    fig = plot.heatmap(w, allowed, values=values, title=f"{n_q}x{n_k} causal, a title long enough to need wrapping")
    check_reads_well(fig, tmp_path / f"heatmap-{n_q}x{n_k}.png")
    ax = fig.axes[0]
    if values or max(n_q, n_k) <= 12:
        numbers = [t for t in ax.texts if t.get_text() != "masked"]
        assert len(numbers) == int(allowed.sum())
        assert min(t.get_fontsize() for t in ax.texts) >= MIN_FONT_PT
    else:
        assert not ax.texts
    sums = [t.get_text() for t in ax.child_axes[0].get_yticklabels()]
    assert sums == ["Σ=1"] * n_q
    assert cells_of(ax, "masked") == int((~allowed).sum())


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
    # masked cells: hatched grey and the word "masked"; the tiny weight 0.001 is an ordinary cell
    assert cells_of(ax, "masked") == int((~ALLOWED).sum()) == 3
    (coll,) = [c for c in ax.collections if c.get_label() == "masked"]
    assert coll.get_hatch() == "///"
    assert texts(ax).count("masked") == 3
    assert "0.001" in texts(ax) and "0.5" in texts(ax)  # a tiny weight keeps its digit; never "masked"
    assert [t.get_text() for t in ax.get_xticklabels()] == ["I", "like", "cats"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["I", "like", "cats"]
    assert ax.get_xlabel().startswith("key") and ax.get_ylabel().startswith("query")
    right = ax.child_axes[0]
    assert [t.get_text() for t in right.get_yticklabels()] == ["Σ=1", "Σ=1", "Σ=1"]
    assert len(fig.axes) == 2 and fig.axes[1].get_ylabel() == "weight"  # the colour bar
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["masked (blocked by the mask, weight 0)"]


def test_the_reading_checks_can_fail(tmp_path):
    w = softmax_rows(5, 5, masks.causal(5))
    with pytest.raises(AssertionError, match=r"clipped|overlapping texts|the cell"):  # a cramped fixed size
        check_reads_well(plot.heatmap(w, masks.causal(5), figsize=(2.0, 2.0)), tmp_path / "cramped.png")
    fig = plot.heatmap(w, masks.causal(5))
    fig.axes[0].texts[0].set_color("#bbbbbb")  # light grey on a dark cell... or on a light one: both fail 4.5:1
    fig.axes[0].texts[-1].set_color("#bbbbbb")
    with pytest.raises(AssertionError, match="contrast"):
        check_reads_well(fig, tmp_path / "grey.png")


def test_cell_text_colour_is_the_better_contrast_of_black_and_white():
    w = np.array([[0.0, 0.2, 0.4, 0.6, 0.8, 1.0]])
    ax = plot.heatmap(w, values=True).axes[0]
    from matplotlib import colormaps

    for t, x in zip(ax.texts, w[0], strict=True):
        bg = colormaps["Blues"](x)
        best = max(wcag((0, 0, 0), bg), wcag((1, 1, 1), bg))
        assert wcag(plt_rgb(t.get_color()), bg) == best >= 4.5


def plt_rgb(c):
    from matplotlib.colors import to_rgb

    return to_rgb(c)


def test_nan_policy_rows_are_drawn_as_nan_and_zero_policy_rows_as_masked_with_sum_0(tmp_path):
    allowed = masks.causal(4).copy()
    allowed[2] = False  # query 2 may attend to nothing
    q = np.array([[1.0, 0, 0], [0, 1, 0], [0, 0, 1], [1, 1, 1]])
    nan = attnlab.attention_trace(q, q, q, allowed, masked_rows="nan")
    zero = attnlab.attention_trace(q, q, q, allowed, masked_rows="zero")
    fig = plot.heatmap(nan.weights, nan.allowed, key_labels=list("abcd"))
    ax = fig.axes[0]
    assert cells_of(ax, "policy-nan") == 4 and cells_of(ax, "masked") == 3 + 2 and cells_of(ax, "nan") == 0
    assert texts(ax).count("nan") == 4 and texts(ax).count("masked") == 5
    sums = [t.get_text() for t in ax.child_axes[0].get_yticklabels()]
    assert sums == ["Σ=1", "Σ=1", "Σ=nan", "Σ=1"]
    assert [t.get_text() for t in fig.legends[0].get_texts()] == [
        "masked (blocked by the mask, weight 0)",
        "nan (fully masked row, masked_rows='nan')",
    ]
    (pn,) = [c for c in ax.collections if c.get_label() == "policy-nan"]
    (mk,) = [c for c in ax.collections if c.get_label() == "masked"]
    assert pn.get_hatch() != mk.get_hatch() and tuple(pn.get_facecolor()[0]) != tuple(mk.get_facecolor()[0])
    check_reads_well(fig, tmp_path / "nan-policy.png")

    ax = plot.heatmap(zero.weights, zero.allowed).axes[0]
    assert cells_of(ax, "masked") == 3 + 2 + 4 and cells_of(ax, "policy-nan") == 0
    assert [t.get_text() for t in ax.child_axes[0].get_yticklabels()][2] == "Σ=0"  # honest: the row is 0

    # NaN where the mask allows (a broken computation) is red, and its row sums to nan
    broken = W.copy()
    broken[1, 0] = np.nan
    ax = plot.heatmap(broken, ALLOWED).axes[0]
    assert cells_of(ax, "nan") == 1 and cells_of(ax, "policy-nan") == 0 and cells_of(ax, "masked") == 3
    assert [t.get_text() for t in ax.child_axes[0].get_yticklabels()] == ["Σ=1", "Σ=nan", "Σ=1"]
    # a blocked key with a weight that is not 0 (a leak) keeps its colour, is not called masked, counts in Σ
    leak = W.copy()
    leak[0, 2] = 0.5
    fig = plot.heatmap(leak, ALLOWED)
    ax = fig.axes[0]
    assert cells_of(ax, "masked") == 2 and ax.images[0].get_array()[0, 2] == 0.5
    assert ax.child_axes[0].get_yticklabels()[0].get_text() == "Σ=1.5"
    assert "leak (blocked by the mask, yet weight ≠ 0)" in [t.get_text() for t in fig.legends[0].get_texts()]


def test_heatmap_of_a_real_trace():
    q = np.array([[1.0, 0], [0, 1], [1, 1], [1, -1]])
    _, ref = reference_attention(q, q, q, allowed=masks.causal(4))
    fig = plot.heatmap(ref, masks.causal(4), values=False)
    assert len(fig.axes[0].texts) == 0
    np.testing.assert_array_equal(fig.axes[0].images[0].get_array().data[masks.causal(4)], ref[masks.causal(4)])


@pytest.mark.parametrize(("h", "n"), [(1, 5), (5, 4), (8, 3)])
def test_head_grid_reads_well_with_row_sums(tmp_path, h, n):
    allowed = masks.causal(n)
    w = np.stack([softmax_rows(n, n, allowed, seed=i) for i in range(h)])
    labels = ["The", "·quick", "·brown", "·fox", "·jumps"][:n]
    fig = plot.head_grid(w, allowed, key_labels=labels, query_labels=labels, values=True)
    check_reads_well(fig, tmp_path / f"grid-{h}.png")
    heads = [ax for ax in fig.axes if ax.images]
    assert [ax.get_title() for ax in heads] == [f"head {i}" for i in range(h)]
    for i, ax in enumerate(heads):
        np.testing.assert_array_equal(ax.images[0].get_array().data[allowed], w[i][allowed])
        assert [t.get_text() for t in ax.child_axes[0].get_yticklabels()] == ["Σ=1"] * n
        assert cells_of(ax, "masked") == texts(ax).count("masked") == n * (n - 1) // 2


def test_head_grid_last_row_mask_and_growth(tmp_path):
    rng = np.random.default_rng(0)
    w = rng.random((5, 3, 3)) * ALLOWED
    w /= w.sum(-1, keepdims=True)
    fig = plot.head_grid(w, ALLOWED, head_names=[f"h{i}" for i in range(5)], columns=3)
    assert len([ax for ax in fig.axes if ax.images]) == 5
    heads = [ax for ax in fig.axes if ax.get_title().startswith("h")]
    assert [ax.get_title() for ax in heads] == ["h0", "h1", "h2", "h3", "h4"]
    for i, ax in enumerate(heads):
        np.testing.assert_array_equal(ax.images[0].get_array().data[ALLOWED], w[i][ALLOWED])

    fig = plot.last_row_bar(W, ALLOWED, key_labels=["a", "b", "c"])
    bar = fig.axes[0]
    heights = [p.get_height() for p in bar.patches[:3]]
    np.testing.assert_allclose(heights, W[-1])
    assert "sum = 1" in fig.get_suptitle()
    check_reads_well(fig, tmp_path / "bar.png")

    fig = plot.mask_picture(ALLOWED, key_labels=["I", "like", "green"])
    pic = fig.axes[0]
    np.testing.assert_array_equal(pic.images[0].get_array(), ALLOWED.astype(float))
    assert texts(pic).count("■") == 6 and texts(pic).count("⬚") == 3
    check_reads_well(fig, tmp_path / "mask.png")
    check_reads_well(plot.last_row_bar([[1.0]]), tmp_path / "bar-1.png")  # one key: the title is not cut off

    g = plot.growth_plot().axes[0]
    x, y = g.lines[0].get_data()
    np.testing.assert_array_equal(y, x**2)
    assert any("1,024 → 4,096: 4× length, 16× elements" in t.get_text() for t in g.texts)


def test_last_row_bar_masked_keys_have_no_bar(tmp_path):
    # the second query of the causal mask: key 2 is masked; it must have no bar, and say so
    fig = plot.last_row_bar(W[:2], ALLOWED[:2], key_labels=["a", "b", "c"])
    ax = fig.axes[0]
    np.testing.assert_allclose([p.get_height() for p in ax.patches], [0.3, 0.7, 0.0])
    assert max(p.get_height() for p in ax.patches) <= 0.7  # nothing drawn full height
    masked = [t for t in ax.texts if t.get_text() == "masked"]
    assert len(masked) == 1 and masked[0].get_position()[0] == 2
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["masked (blocked by the mask, weight 0)"]
    check_reads_well(fig, tmp_path / "bar-masked.png")
    # a fully masked last row under masked_rows='nan': no bar at all, "nan" on each key, the sum is nan
    allowed = masks.causal(3).copy()
    allowed[2] = False
    q = np.eye(3)
    t = attnlab.attention_trace(q, q, q, allowed, masked_rows="nan")
    fig = plot.last_row_bar(t.weights, t.allowed)
    ax = fig.axes[0]
    assert all(p.get_height() == 0 for p in ax.patches) and texts(ax) == ["nan"] * 3
    assert "sum = nan" in fig.get_suptitle()
    assert "nan (fully masked row, masked_rows='nan')" in [t.get_text() for t in fig.legends[0].get_texts()]


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


def test_a_real_smollm2_heatmap_reads_well(tmp_path, smollm2):
    from attnlab.models.interventions import attention_maps

    text = "The quick brown fox jumps over the lazy dog because it wanted to see what the cat was doing"
    m = attention_maps("smollm2", text, layer=3, head=0, model_obj=smollm2)
    n = m.weights.shape[-1]
    assert 18 <= n <= 24
    fig = plot.heatmap(m.weights, m.allowed, query_labels=m.labels, key_labels=m.labels, title=m.title)
    got = check_reads_well(fig, tmp_path / "smollm2.png")
    assert got["texts"] >= 3 * n  # every token on both axes and every row sum
    ax = fig.axes[0]
    sums = np.array([float(t.get_text().removeprefix("Σ=")) for t in ax.child_axes[0].get_yticklabels()])
    np.testing.assert_allclose(sums, m.weights.sum(-1), atol=0.005)
    assert [t.get_text() for t in ax.get_xticklabels()] == list(m.labels)


# ---------------------------------------------------------------------------------------------------------------
# 中文: every word of every picture in Chinese (lang="zh" and `attnlab heatmap --lang zh`), drawn in a CJK font


def all_texts(fig) -> list[Text]:
    return [t for t in fig.findobj(Text) if t.get_text().strip() and t.get_visible()]


ZH_ALLOWED = {"softmax", "nan", "inf", "masked_rows", "MiB", "NaN", "Attention"}


def zh_english(fig) -> list[str]:
    import re

    words = []
    for t in all_texts(fig):
        s = re.sub(r"\b[qkT]\d*\b|Σ=\S+|'[^']*'|\$[^$]*\$", " ", t.get_text())  # labels, sums, values, math
        words += [w for w in re.findall(r"[A-Za-z][A-Za-z_]+", s) if w not in ZH_ALLOWED]
    return words


@pytest.mark.parametrize(
    "draw",
    [
        lambda: plot.heatmap(np.array([[np.nan, np.nan], [0.3, 0.7]]), np.array([[0, 0], [1, 1]], bool), lang="zh"),
        lambda: plot.heatmap(W, ALLOWED, lang="zh"),
        lambda: plot.head_grid(np.stack([W, W]), ALLOWED, lang="zh"),
        lambda: plot.last_row_bar(W, ALLOWED, lang="zh"),
        lambda: plot.mask_picture(ALLOWED, lang="zh"),
        lambda: plot.growth_plot(lang="zh"),
    ],
    ids=["nan-row", "heatmap", "head-grid", "last-row", "mask", "growth"],
)
def test_chinese_pictures_leave_no_english_and_use_a_cjk_font(draw):
    import re

    fig = draw()
    fig.canvas.draw()
    assert zh_english(fig) == []
    words = [t for t in all_texts(fig) if re.search(r"[\u4e00-\u9fff]", t.get_text())]
    assert words, "no Chinese words in the picture"
    for t in words:
        assert "WenQuanYi Micro Hei" in t.get_fontfamily(), t.get_text()
    svg = plot.to_bytes(fig, "svg").decode()
    assert "<text" in svg and re.search(r">[^<]*[\u4e00-\u9fff][^<]*<", svg)  # real text, not glyph paths


def test_english_stays_the_default_and_lang_is_checked():
    fig = plot.heatmap(W, ALLOWED)
    assert fig.axes[0].get_xlabel() == "key (column): read from"
    from attnlab.errors import OptionError

    with pytest.raises(OptionError, match="lang"):
        plot.heatmap(W, ALLOWED, lang="fr")


def test_heatmap_cli_lang_zh(tmp_path, capsys):
    out = tmp_path / "zh.svg"
    assert main(["heatmap", "causal-4", "--lang", "zh", "-o", str(out)]) == 0
    assert capsys.readouterr().out == f"已写入 {out}\n"
    svg = out.read_text()
    for word in ("键（列）：被读取的位置", "查询（行）：读取者", "权重", "已遮罩"):
        assert word in svg, word
    assert main(["heatmap", "--lang", "zh"]) == 2
    assert capsys.readouterr().err.startswith("attnlab heatmap：错误：请给出一个命名示例")
