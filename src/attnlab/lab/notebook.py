import marimo

__generated_with = "0.25.2"
app = marimo.App(width="full", app_title="attnlab: attention by hand", css_file="lab.css")


@app.cell
def _():
    import marimo as mo

    from attnlab.lab import experiments as EX
    from attnlab.lab import i18n as I
    from attnlab.lab import live as LV
    from attnlab.lab import logic as L
    from attnlab.lab import predict as PR
    from attnlab.lab import presets as P

    T = I.t
    return EX, I, L, LV, P, PR, T, mo


@app.cell
def _(I, mo):
    lang_pick = mo.ui.dropdown(
        options={name: code for code, name in I.LANGS.items()}, value="English", label="Language / 语言"
    )
    lang_pick  # noqa: B018 (a marimo cell shows its last expression)
    return (lang_pick,)


@app.cell
def _(lang_pick):
    lang = lang_pick.value or "en"
    return (lang,)


@app.cell
def _(I, T, lang, mo):
    # Compute attention by hand: Q, K, V and the causal mask
    # (the page's words, English and Chinese, are in attnlab.lab.i18n: INTRO, PREDICT_INTRO, ...)
    mo.md(T(lang, I.INTRO))
    return


@app.cell
def _(CM, P, T, lang, mo):
    _opts = {T(lang, "(your own inputs: the articles' four positions)"): ""}
    _opts.update({p.label(lang): key for key, p in P.ITEM_PRESETS.items()})
    _asked = CM.item_of_query(mo.query_params())  # ?item=item-03 (attnlab lab --item): open on that item
    preset_pick = mo.ui.dropdown(
        options=_opts,
        value=P.ITEM_PRESETS[_asked].label(lang) if _asked else next(iter(_opts)),
        label=T(lang, "Article item (preset)"),
        full_width=True,
    )
    preset_pick  # noqa: B018 (a marimo cell shows its last expression)
    return (preset_pick,)


@app.cell
def _(L, P, preset_pick):
    item = P.ITEM_PRESETS.get(preset_pick.value or "")
    start = item.state if item is not None and item.state is not None else L.DEFAULT
    return item, start


@app.cell
def _(CM, EX, class_hidden, class_on, class_pred, class_show, exp_out, item, lang, mo, state):
    # the preset's `attnlab explain` output, marked as the preset's original once the inputs or controls moved on
    if item is None:
        _out = None
    elif class_hidden:  # class mode: the answer (and the weights below) hidden until the reveal
        _out = mo.vstack([mo.Html(CM.hidden_html(lang, bool(class_show.value))), class_pred, class_show])
    elif class_on:
        _out = mo.Html(CM.revealed_html(lang, class_pred.value, EX.item_box(item, state, exp_out, lang)))
    else:
        _out = mo.Html(EX.item_box(item, state, exp_out, lang))
    _out  # noqa: B018 (a marimo cell shows its last expression)
    return


@app.cell
def _(EX, T, item, lang, mo):
    experiment = EX.experiment_for(item)

    def _widget(c):
        lab = T(lang, c.label)
        if c.kind == "slider":
            return mo.ui.slider(c.start, c.stop, step=c.step, value=c.value, show_value=True, label=lab, debounce=True)
        if c.kind == "number":
            return mo.ui.number(start=c.start, stop=c.stop, step=c.step, value=c.value, label=lab)
        if c.kind == "dropdown":
            _opts = {T(lang, name): v for name, v in c.options}
            return mo.ui.dropdown(options=_opts, value=next(k for k, v in _opts.items() if v == c.value), label=lab)
        if c.kind == "checkbox":
            return mo.ui.checkbox(value=bool(c.value), label=lab)
        if c.kind == "area":
            return mo.ui.text_area(value=c.value, label=lab, rows=3)
        return mo.ui.text(value=c.value, label=lab)

    exp_ui = mo.ui.dictionary({c.name: _widget(c) for c in experiment.controls}) if experiment else None
    mo.vstack(
        [
            mo.md("### " + T(lang, experiment.title)),
            mo.hstack(
                [mo.Html(f"<div data-testid='al-x-in-{n}'>{w}</div>") for n, w in exp_ui.items()],
                justify="start",
                gap=2,
                wrap=True,
            ),
        ]
    ) if experiment else None
    return exp_ui, experiment


@app.cell
def _(EX, class_hidden, exp_ui, experiment, lang, mo, state):
    exp_out = EX.run(experiment, exp_ui.value, state, lang) if experiment else None
    mo.Html(exp_out.html) if exp_out is not None and not class_hidden else None  # class mode: after the reveal
    return (exp_out,)


@app.cell
def _(EX, L, T, item, lang, mo, start):
    q_text = mo.ui.text_area(
        value=start.q, placeholder=T(lang, "rows of Q"), label=T(lang, "Q (queries)"), rows=4, full_width=True
    )
    k_text = mo.ui.text_area(
        value=start.k, placeholder=T(lang, "rows of K"), label=T(lang, "K (keys)"), rows=4, full_width=True
    )
    v_text = mo.ui.text_area(
        value=start.v, placeholder=T(lang, "rows of V"), label=T(lang, "V (values)"), rows=4, full_width=True
    )
    tokens = mo.ui.text(value=start.tokens, placeholder=T(lang, "I like green cats"), label=T(lang, "token labels"))
    mo.vstack(
        [
            # one above the other, full width: a row of 16 numbers fits on one line; data-testid for the tests
            mo.Html(f"<div data-testid='al-input-q'>{q_text}</div>"),
            mo.Html(f"<div data-testid='al-input-k'>{k_text}</div>"),
            mo.Html(f"<div data-testid='al-input-v'>{v_text}</div>"),
            tokens,
            mo.md(
                T(
                    lang,
                    "One row per line, numbers separated by commas. At most {n} positions and {d} numbers per row.",
                    n=L.MAX_N,
                    d=L.MAX_D,
                )
            ),
        ]
    ) if EX.uses_qkv(item) else mo.md(T(lang, "*This lesson does not use Q, K and V: its experiment is above.*"))
    return k_text, q_text, tokens, v_text


@app.cell
def _(EX, T, item, lang, mo, start):
    causal = mo.ui.checkbox(value=start.causal, label=T(lang, "causal mask"))
    padded = mo.ui.number(start=0, stop=32, step=1, value=start.padded, label=T(lang, "padded keys"))
    padding_side = mo.ui.radio(
        options={T(lang, "side.right"): "right", T(lang, "side.left"): "left"},
        value=T(lang, "side.right") if start.padding_side == "right" else T(lang, "side.left"),
        inline=True,
        label=T(lang, "padding side"),
    )
    masked_rows = mo.ui.radio(
        options=["raise", "zero", "nan"], value=start.masked_rows, inline=True, label=T(lang, "fully masked rows")
    )
    temperature = mo.ui.slider(
        0.1, 5.0, step=0.1, value=start.temperature, show_value=True, label=T(lang, "temperature T")
    )
    shift = mo.ui.slider(-20, 120, step=1, value=start.shift, show_value=True, label=T(lang, "add to every score"))
    value_row = mo.ui.number(start=0, stop=31, step=1, value=start.value_row, label=T(lang, "value row"))
    value_text = mo.ui.text(value=start.value_text, placeholder="100, 0", label=T(lang, "new value vector"))
    _value_box = mo.Html(f"<div data-testid='al-input-value'>{value_text}</div>")
    bias = mo.ui.text(value=start.bias, placeholder="0, 1, 2, 3", label=T(lang, "bias per key"))
    mask_text = mo.ui.text_area(
        value=start.mask, placeholder="1 0\n1 1", label=T(lang, "mask (1 = may attend)"), rows=2
    )
    scale = mo.ui.text(value=start.scale, placeholder="1/√d_k", label=T(lang, "scale"))
    mo.vstack(
        [
            mo.hstack([causal, padded, padding_side, masked_rows], justify="start", gap=2, wrap=True),
            mo.hstack([temperature, shift], justify="start", gap=2, wrap=True),
            mo.hstack([value_row, _value_box, bias, scale], justify="start", gap=2, wrap=True),
            mask_text,
            mo.md(
                T(
                    lang,
                    "*Empty boxes keep the default: no bias, no extra mask, scale 1/√d_k. With fewer queries than "
                    "keys the causal mask is a decoding query's: the last query sees every key.*",
                )
            ),
        ]
    ) if EX.uses_qkv(item) else None
    return (
        bias,
        causal,
        mask_text,
        masked_rows,
        padded,
        padding_side,
        scale,
        shift,
        temperature,
        value_row,
        value_text,
    )


@app.cell
def _(
    L,
    bias,
    causal,
    k_text,
    lang,
    mask_text,
    masked_rows,
    padded,
    padding_side,
    q_text,
    scale,
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
        bias=bias.value,
        mask=mask_text.value,
        scale=scale.value,
    )
    result = L.compute(state, lang)
    return result, state


@app.cell
def _(CM, EX, L, T, class_hidden, item, lang, mo, result):
    # One cell for the numbers and the pictures, so both arrive with the same update (none for a lesson without Q/K/V).
    if class_hidden:  # class mode (attnlab.lab.classmode): shown after the item's reveal
        _shown = [mo.Html(CM.hidden_weights_html(lang))]
    elif result.ok:
        _shown = [mo.Html(L.result_html(result, lang)), mo.Html(L.pictures_html(result, lang))]
    else:
        _shown = [mo.Html(L.result_html(result, lang)), mo.md(T(lang, "*(no picture until the inputs are fixed)*"))]
    mo.vstack([mo.md("## " + T(lang, "Weights and output")), *_shown]) if EX.uses_qkv(item) else None
    return


@app.cell
def _(EX, L, T, class_hidden, item, lang, mo, result):
    # Built only when the accordion is opened, so moving a slider does not redraw every step table.
    None if class_hidden or not EX.uses_qkv(item) else mo.accordion(
        {
            T(lang, "Every step, by hand (scores, scale, mask, max, exp, sums, weights, output)"): mo.lazy(
                lambda: mo.Html(L.steps_html(result, lang))
            )
        }
    )
    return


@app.cell
def _(I, T, lang, mo):
    mo.md(T(lang, I.PREDICT_INTRO))
    return


@app.cell
def _(PR, mo):
    get_book, set_book = mo.state(PR.Book())
    get_results, set_results = mo.state({})  # the revealed questions' results, {question: html} (below)
    return get_book, get_results, set_book, set_results


@app.cell
def _(PR, get_book, lang, mo):
    mo.Html(PR.score_html(get_book(), lang))
    return


@app.cell
def _(PR, T, lang, mo):
    # every question's prediction and reveal switch, in the page's order (the experiment with four pairs has a slider)
    asks = mo.ui.dictionary(
        {
            qid: mo.ui.dictionary(
                {
                    "pred": mo.ui.radio(
                        options=PR.options(PR.QUESTIONS[qid], lang), label=T(lang, PR.QUESTIONS[qid].text)
                    ),
                    "show": mo.ui.switch(label=T(lang, "reveal")),
                }
            )
            for qid in ("shift", "temperature", "value", "four", "self100", "selfbias")
        }
    )
    four_t = mo.ui.slider(0.1, 5.0, step=0.1, value=1.0, show_value=True, label=T(lang, "temperature"))
    return asks, four_t


@app.cell
def _(I, L, T, asks, four_t, get_results, lang, set_results, state):
    # The revealed questions' results on your inputs, made only for a revealed question and handed to the cell
    # below only when they change: a slider move with no question revealed re-runs (and redraws) nothing there
    _bodies = {
        "shift": lambda: L.exp_shift(state, 10.0, lang)[1],
        "temperature": lambda: L.exp_temperature(state, 3.0, lang)[1],
        "value": lambda: L.exp_value(state, 0, (100.0, 0.0), lang)[2],
        "four": lambda: L.four_pairs(float(four_t.value), lang)[1],
        "self100": lambda: "<p>" + T(lang, I.SELF_TEST_ANSWER) + "</p>" + L.exp_shift(state, 100.0, lang)[1],
        "selfbias": lambda: L.exp_bias(state, None, lang)[1],
    }
    _results = {_qid: _body() for _qid, _body in _bodies.items() if asks.value[_qid]["show"]}
    if _results != get_results():
        set_results(_results)
    return


@app.cell
def _(PR, T, asks, four_t, get_book, get_results, lang, mo, set_book):
    # One cell shows every question with its result: hidden until its reveal switch is on; then the prediction is
    # locked and the feedback and the result (or the request to predict) shown (the result from the cell above).
    _results = get_results()
    _book = get_book()
    _blocks = []
    for _qid in ("shift", "temperature", "value", "four", "self100", "selfbias"):
        _pred, _show = asks[_qid]["pred"], asks[_qid]["show"]
        _value = asks.value[_qid]
        _shown = [_pred, four_t, _show] if _qid == "four" else [_pred, _show]
        if not _value["show"]:
            _shown.append(mo.md(T(lang, "*(hidden until you reveal)*")))
        else:
            _book = PR.commit(_book, _qid, _value["pred"], True)
            _fb = PR.feedback_html(_book, _qid, _value["pred"], lang)
            _shown.append(mo.Html(_fb + (_results.get(_qid, "") if _qid in _book.entries else "")))
        _blocks.append(mo.vstack(_shown))
    if _book is not get_book():
        set_book(_book)
    mo.vstack(_blocks, gap=1.5)
    return


@app.cell
def _(L, T, lang, mo):
    _, _trap = L.masked_row_trap(lang)
    _, _conv = L.mask_conventions(lang)
    mo.vstack(
        [
            mo.md("## " + T(lang, "Two traps") + "\n### " + T(lang, "1. A row with every key masked")),
            mo.Html(_trap),
            mo.md("### " + T(lang, "2. True means *allow* here, *block* there")),
            mo.Html(_conv),
        ]
    )
    return


@app.cell
def _(I, T, lang, mo):
    mo.md(T(lang, I.BIGGER))
    return


@app.cell
def _(T, lang, mo):
    from attnlab.lab.svg import growth_svg as _growth

    mo.Html(
        _growth(
            title=T(lang, "T² score elements against the length T"),
            caption=T(lang, "{a:,} -> {b:,} tokens: {x:g}x the length, {y:g}x the elements"),
        )
    )
    return


@app.cell
def _(I, T, lang, mo):
    mo.md(T(lang, I.LIVE_INTRO))
    return


@app.cell
def _(T, lang, mo):
    live_model = mo.ui.radio(
        options={
            T(lang, "SmolLM2-135M (causal language model)"): "smollm2",
            T(lang, "all-MiniLM-L6-v2 (bidirectional encoder, with padding)"): "minilm",
        },
        value=T(lang, "SmolLM2-135M (causal language model)"),
        inline=True,
        label=T(lang, "model"),
    )
    live_text = mo.ui.text(
        value="The cat sat on the mat because it was tired",
        placeholder=T(lang, "a sentence"),
        label=T(lang, "sentence"),
        full_width=True,
    ).form(submit_button_label=T(lang, "run"), bordered=False)
    mo.vstack([live_model, mo.Html(f"<div data-testid='al-input-sentence'>{live_text}</div>")])
    return live_model, live_text


@app.cell
def _(LV, T, get_live_pick, lang, live_model, mo):
    _info = LV.MODELS[live_model.value]
    _pick = get_live_pick()  # the head a click in the model view opened (below)
    _at = _pick[1:] if _pick is not None and _pick[0] == live_model.value else (min(3, _info.layers - 1), 0)
    live_layer = mo.ui.slider(0, _info.layers - 1, value=_at[0], show_value=True, label=T(lang, "layer"))
    live_head = mo.ui.slider(0, _info.heads - 1, value=_at[1], show_value=True, label=T(lang, "plot.head"))
    mo.hstack([live_layer, live_head], justify="start", gap=2)
    return live_head, live_layer


@app.cell
def _(LV, T, lang, live_head, live_layer, live_model, live_text, mo):
    _key, _text, _layer, _head = live_model.value, live_text.value, live_layer.value, live_head.value
    if not _text:
        # the model starts loading as the page opens (once per server): its status, every second until it is loaded
        _note = "<p>" + T(lang, "Type a sentence and press run.") + "</p>"
        LV.loader(_key).start()
        mo.output.replace(mo.Html(LV.status_html(_key, lang) + _note))

        def _wait_load():
            me = mo.current_thread()
            LV.show_status(_key, lang, _note, lambda h: mo.output.replace(mo.Html(h)), lambda: me.should_exit)

        mo.Thread(target=_wait_load, daemon=True).start()
    elif LV.cached("forward", _key, _text) is not None:
        mo.output.replace(mo.Html(LV.live_html(LV.cached("forward", _key, _text), _layer, _head, lang)))
    else:
        # the thread runs attnlab.lab.live.show_live, tested there: a helper defined in this cell and called from the
        # thread (marimo renames a cell's _names) raised NameError in the thread, so a load error never showed
        def _work():
            me = mo.current_thread()
            LV.show_live(
                _key, _text, _layer, _head, lang, lambda h: mo.output.replace(mo.Html(h)), lambda: me.should_exit
            )

        mo.output.replace(mo.Html(LV.status_html(_key, lang)))
        mo.Thread(target=_work, daemon=True).start()
    return


@app.cell
def _(mo):
    # The live model's views (attnlab.lab.views): the (model, sentence) they show, set by the cell below once its
    # forward pass is done, and the head a click in the model view opened
    get_views_ready, set_views_ready = mo.state(None)
    get_live_pick, set_live_pick = mo.state(None)
    return get_live_pick, get_views_ready, set_live_pick, set_views_ready


@app.cell
def _(LV, live_model, live_text, mo, set_views_ready):
    # Which sentence the views show: set at once when its forward pass is cached (or there is no sentence), else by
    # a thread when the pass is done and its heatmap shown. The views read only this state, so they keep the last
    # sentence's pictures while the next one runs (the model view is not torn down at every press, which held the
    # next heatmap back), and no pass can end unseen between a view's look and this cell's
    _sentence = (live_model.value, live_text.value)
    if not _sentence[1] or LV.cached("forward", *_sentence) is not None:
        set_views_ready(_sentence)
    else:

        def _wait_views():
            me = mo.current_thread()
            try:
                LV.run(*_sentence)  # the live cell's forward pass (one cached Future): waits for it
            except Exception:  # the live cell shows the error; the views their placeholder
                pass
            else:
                LV.after_heatmap(*_sentence)  # the heatmap goes to the page first, then the views
            if not me.should_exit:
                set_views_ready(_sentence)

        mo.Thread(target=_wait_views, daemon=True).start()
    return


@app.cell
def _(LV, get_views_ready, lang, live_head, live_layer, mo, set_live_pick):
    _key, _text = get_views_ready() or ("", "")
    _r = LV.cached("forward", _key, _text) if _text else None
    live_pick = None
    _out = None
    if _r is not None:
        # one table (a click on a head selects its cell), not a button per head: 270 buttons took seconds of the
        # browser's time per sentence and slowed every control of the page
        live_pick = mo.ui.table(
            [
                {c: mo.Html(x) for c, x in row.items()}
                for row in LV.model_view_rows(_r, live_layer.value, live_head.value, lang)
            ],
            selection="single-cell",
            pagination=False,
            show_column_summaries=False,
            show_data_types=False,
            show_download=False,
            show_search=False,
            on_change=lambda v, key=_key, h=LV.MODELS[_key].heads: (
                None if LV.picked_head(v, h) is None else set_live_pick((key, *LV.picked_head(v, h)))
            ),
        )
        _out = mo.Html(LV.model_view(_r, f"{live_pick}", lang))
    _out  # noqa: B018 (a marimo cell shows its last expression)
    return (live_pick,)


@app.cell
def _(LV, T, lang, live_model, mo):
    _h = LV.MODELS[live_model.value].heads
    live_heads = mo.ui.multiselect(
        options={f"h{j}": j for j in range(_h)},
        value=[f"h{j}" for j in range(_h)],
        label=T(lang, "heads in the head view"),
    )
    live_query = mo.ui.number(
        start=-1, stop=LV.MAX_TOKENS - 1, step=1, value=-1, label=T(lang, "neuron view: query position (-1 = the last)")
    )
    live_key = mo.ui.number(start=0, stop=LV.MAX_TOKENS - 1, step=1, value=0, label=T(lang, "key position"))
    live_temp = mo.ui.slider(0.1, 3.0, step=0.1, value=1.0, show_value=True, label=T(lang, "block view: temperature T"))
    live_top = mo.ui.slider(1, 20, step=1, value=10, show_value=True, label=T(lang, "top tokens"))
    mo.hstack([live_heads, live_query, live_key, live_temp, live_top], justify="start", gap=2, wrap=True)
    return live_heads, live_key, live_query, live_temp, live_top


@app.cell
def _(
    LV,
    T,
    get_views_ready,
    lang,
    live_head,
    live_heads,
    live_key,
    live_layer,
    live_query,
    live_temp,
    live_top,
    mo,
):
    _key, _text = get_views_ready() or ("", "")
    _r = LV.cached("forward", _key, _text) if _text else None
    if _r is None:
        _out = mo.md(T(lang, "*The model, head, neuron and block views appear when the sentence has run.*"))
    else:
        _out = mo.Html(
            LV.views_html(
                _r,
                live_layer.value,
                live_head.value,
                lang,
                heads=live_heads.value,
                query=int(live_query.value if live_query.value is not None else -1),
                key=int(live_key.value or 0),
                temperature=float(live_temp.value),
                top_k=int(live_top.value),
            )
        )
    _out  # noqa: B018 (a marimo cell shows its last expression)
    return


@app.cell
def _(T, lang, mo):
    live_intervene = mo.ui.run_button(label=T(lang, "run the intervention (delete each token)"))
    live_intervene  # noqa: B018 (a marimo cell shows its last expression)
    return (live_intervene,)


@app.cell
def _(LV, T, lang, live_head, live_intervene, live_layer, live_model, live_text, mo):
    _key, _text = live_model.value, live_text.value
    _done = LV.cached("intervene", _key, _text) if _text else None
    if _done is not None:
        mo.output.replace(mo.Html(LV.intervention_html(_done, lang, live_layer.value, live_head.value)))
    elif live_intervene.value and _text:

        def _work_iv():
            me = mo.current_thread()
            try:
                res = LV.run_intervention(_key, _text)
            except Exception as err:  # shown in the page, never a traceback
                from attnlab.lab.logic import error_html

                if not me.should_exit:
                    mo.output.replace(mo.Html(error_html(str(err), "al-live-error")))
                return
            if not me.should_exit:
                mo.output.replace(mo.Html(LV.intervention_html(res, lang, live_layer.value, live_head.value)))

        mo.output.replace(mo.md(T(lang, "*Deleting each token and running the model again…*")))
        mo.Thread(target=_work_iv, daemon=True).start()
    else:
        mo.output.replace(
            mo.md(
                T(lang, "*Press the button to compare the weight each token receives with the effect of deleting it.*")
            )
        )
    return


# ---- class mode (attnlab lab --item N --class, attnlab.lab.classmode)
@app.cell
def _(T, lang, mo):
    from attnlab.lab import classmode as CM

    # ?item=...&class=1: the item's answer stays hidden until a prediction is written and revealed
    class_on = CM.is_class(mo.query_params())
    class_pred = mo.ui.text_area(placeholder="…", label=T(lang, "class.prediction"), rows=2, full_width=True)
    class_show = mo.ui.switch(label=T(lang, "reveal"))
    return CM, class_on, class_pred, class_show


@app.cell
def _(class_on, class_pred, class_show):
    class_hidden = class_on and not (class_show.value and class_pred.value.strip())
    return (class_hidden,)


if __name__ == "__main__":
    app.run()
