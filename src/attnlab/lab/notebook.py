import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium", app_title="attnlab: attention by hand")


@app.cell
def _():
    import marimo as mo

    from attnlab.lab import logic as L

    return L, mo


@app.cell
def _(mo):
    mo.md(
        r"""
        # Compute attention by hand: Q, K, V and the causal mask

        Every query scores every key (**S = Q Kᵀ / √d_k**), each row of scores becomes weights with a softmax over
        the keys it may see, and the output is the **weighted sum of the values**, O = A V. Edit the matrices (one row
        per line, numbers separated by commas), switch masks on and off, move the sliders, and watch every step.

        *How to read the tables and the heatmap: rows are queries (the readers), columns are keys (read from). Check
        the axes, the mask and the row sums first. A large weight says where a query reads from; it does not say that
        key caused the answer (that needs replacement, deletion or intervention experiments).*
        """
    )
    return


@app.cell
def _(L, mo):
    q_text = mo.ui.text_area(value=L.DEFAULT.q, placeholder="rows of Q", label="Q (queries, one row each)", rows=5)
    k_text = mo.ui.text_area(value=L.DEFAULT.k, placeholder="rows of K", label="K (keys)", rows=5)
    v_text = mo.ui.text_area(value=L.DEFAULT.v, placeholder="rows of V", label="V (values)", rows=5)
    tokens = mo.ui.text(value="", placeholder="I like green cats", label="token labels (optional)")
    mo.vstack(
        [
            mo.hstack([q_text, k_text, v_text], justify="start"),
            tokens,
            mo.md(f"At most {L.MAX_N} positions and {L.MAX_D} numbers per row, so the page stays responsive."),
        ]
    )
    return k_text, q_text, tokens, v_text


@app.cell
def _(mo):
    causal = mo.ui.checkbox(value=False, label="causal mask (query i sees keys j ≤ i)")
    padded = mo.ui.number(start=0, stop=8, step=1, value=0, label="padded keys")
    padding_side = mo.ui.radio(options=["right", "left"], value="right", inline=True, label="padding on the")
    masked_rows = mo.ui.radio(options=["raise", "zero", "nan"], value="raise", inline=True, label="fully masked rows")
    temperature = mo.ui.slider(0.1, 5.0, step=0.1, value=1.0, show_value=True, label="temperature T")
    shift = mo.ui.slider(-20, 120, step=1, value=0, show_value=True, label="constant added to every score")
    value_row = mo.ui.number(start=0, stop=7, step=1, value=0, label="edit value row")
    value_text = mo.ui.text(value="", placeholder="100, 0", label="new value vector (empty = keep V)")
    mo.vstack(
        [
            mo.hstack([causal, padded, padding_side, masked_rows], justify="start", gap=2),
            mo.hstack([temperature, shift], justify="start", gap=2),
            mo.hstack([value_row, value_text], justify="start", gap=2),
        ]
    )
    return causal, masked_rows, padded, padding_side, shift, temperature, value_row, value_text


@app.cell
def _(
    L,
    causal,
    k_text,
    masked_rows,
    padded,
    padding_side,
    q_text,
    shift,
    temperature,
    tokens,
    v_text,
    value_row,
    value_text,
):
    state = L.LabState(
        q=q_text.value,
        k=k_text.value,
        v=v_text.value,
        causal=causal.value,
        padded=int(padded.value or 0),
        padding_side=padding_side.value,
        temperature=float(temperature.value),
        shift=float(shift.value),
        masked_rows=masked_rows.value,
        value_row=int(value_row.value or 0),
        value_text=value_text.value,
        tokens=tokens.value,
    )
    result = L.compute(state)
    return result, state


@app.cell
def _(L, mo, result):
    mo.vstack([mo.md("## Weights and output"), mo.Html(L.result_html(result))])
    return


@app.cell
def _(L, mo, result):
    mo.Html(L.pictures_html(result)) if result.ok else mo.md("*(no picture until the inputs are fixed)*")
    return


@app.cell
def _(L, mo, result):
    # Built only when the accordion is opened, so moving a slider does not redraw every step table.
    mo.accordion(
        {
            "Every step, by hand (scores, scale, mask, max, exp, sums, weights, output)": mo.lazy(
                lambda: mo.Html(L.steps_html(result))
            )
        }
    )
    return


@app.cell
def _(mo):
    mo.md(
        r"""
        ## Predict, then reveal

        For each experiment write down (pick) what you expect **before** you reveal the result: that is how you find
        out whether you understood the mechanism or only looked at a pretty picture. The experiments use your inputs
        above.
        """
    )
    return


@app.cell
def _(mo):
    pred_shift = mo.ui.radio(
        options=["the weights stay the same", "the weights get sharper", "the weights get flatter"],
        label="**1. Add 10 to every legal score.** What happens to the weights?",
    )
    show_shift = mo.ui.switch(label="reveal")
    mo.vstack([pred_shift, show_shift])
    return pred_shift, show_shift


@app.cell
def _(L, mo, pred_shift, show_shift, state):
    if show_shift.value:
        _, _html = L.exp_shift(state, 10.0)
        _out = mo.Html(L.reveal(pred_shift.value, "the weights stay the same", _html))
    else:
        _out = mo.md("*(hidden until you reveal)*")
    _out  # noqa: B018 (a marimo cell shows its last expression)
    return


@app.cell
def _(mo):
    pred_temp = mo.ui.radio(
        options=[
            "each row gets flatter over its legal keys",
            "each row gets sharper",
            "masked keys start to get weight",
        ],
        label="**2. Raise the temperature to 3.** What happens?",
    )
    show_temp = mo.ui.switch(label="reveal")
    mo.vstack([pred_temp, show_temp])
    return pred_temp, show_temp


@app.cell
def _(L, mo, pred_temp, show_temp, state):
    if show_temp.value:
        _, _html = L.exp_temperature(state, 3.0)
        _out = mo.Html(L.reveal(pred_temp.value, "each row gets flatter over its legal keys", _html))
    else:
        _out = mo.md("*(hidden until you reveal)*")
    _out  # noqa: B018 (a marimo cell shows its last expression)
    return


@app.cell
def _(mo):
    pred_value = mo.ui.radio(
        options=["weights change, output changes", "weights stay, output changes", "nothing changes"],
        label="**3. Change v₀ to [100, 0]** (first value vector; V needs 2 columns). What changes?",
    )
    show_value = mo.ui.switch(label="reveal")
    mo.vstack([pred_value, show_value])
    return pred_value, show_value


@app.cell
def _(L, mo, pred_value, show_value, state):
    if show_value.value:
        _, _, _html = L.exp_value(state, 0, (100.0, 0.0))
        _out = mo.Html(L.reveal(pred_value.value, "weights stay, output changes", _html))
    else:
        _out = mo.md("*(hidden until you reveal)*")
    _out  # noqa: B018 (a marimo cell shows its last expression)
    return


@app.cell
def _(mo):
    pred_four = mo.ui.radio(
        options=["[1, 0, 0, 0]", "[0.25, 0.25, 0.25, 0.25]", "it depends on the temperature"],
        label="**4. Four 2-D Q/K pairs, causal mask on.** What is the first row of the weights?",
    )
    four_t = mo.ui.slider(0.1, 5.0, step=0.1, value=1.0, show_value=True, label="temperature for this experiment")
    show_four = mo.ui.switch(label="reveal")
    mo.vstack([pred_four, four_t, show_four])
    return four_t, pred_four, show_four


@app.cell
def _(L, four_t, mo, pred_four, show_four):
    if show_four.value:
        _, _html = L.four_pairs(float(four_t.value))
        _out = mo.Html(L.reveal(pred_four.value, "[1, 0, 0, 0]", _html))
    else:
        _out = mo.md("*(hidden until you reveal)*")
    _out  # noqa: B018 (a marimo cell shows its last expression)
    return


@app.cell
def _(mo):
    pred_self = mo.ui.radio(
        options=["no, the output stays the same", "yes, the output changes", "it overflows"],
        label="**Self-test: add 100 to every legal score of every row.** Does the output change?",
    )
    show_self = mo.ui.switch(label="reveal the answer")
    mo.vstack([pred_self, show_self])
    return pred_self, show_self


@app.cell
def _(L, mo, pred_self, show_self, state):
    if show_self.value:
        _, _html = L.exp_shift(state, 100.0)
        _out = mo.Html(
            L.reveal(
                pred_self.value,
                "no, the output stays the same",
                "<p>Mathematically softmax is unchanged by the same shift on a whole row; implementations subtract "
                "the row maximum first so exp never overflows. Adding different amounts to different columns would "
                "change the weights.</p>" + _html,
            )
        )
    else:
        _out = mo.md("*(hidden until you reveal)*")
    _out  # noqa: B018 (a marimo cell shows its last expression)
    return


@app.cell
def _(L, mo):
    _, _trap = L.masked_row_trap()
    _, _conv = L.mask_conventions()
    mo.vstack(
        [
            mo.md("## Two traps\n### 1. A row with every key masked"),
            mo.Html(_trap),
            mo.md("### 2. True means *allow* here, *block* there"),
            mo.Html(_conv),
        ]
    )
    return


@app.cell
def _(mo):
    mo.md(
        r"""
        ## Bigger pictures

        **Multi-head.** With d_model = 512 and 8 heads, each head works in d_head = 64 dimensions and scales by
        1/√64, not 1/√512; each head has its own projections and its own weights matrix, and the outputs are
        concatenated and projected back (`attnlab.plot.head_grid` draws one heatmap per head).

        **T² growth.** The score matrix has T × T entries: from 1,024 to 4,096 tokens the length grows 4× and the
        matrix 16×. (End-to-end latency depends on batch, memory traffic and kernels; FlashAttention computes the
        same exact attention tile by tile without storing the matrix.)
        """
    )
    return


@app.cell
def _(mo):
    from attnlab import plot as _plot

    mo.image(_plot.to_bytes(_plot.growth_plot(), "png", dpi=80), alt="T squared growth")
    return


if __name__ == "__main__":
    app.run()
