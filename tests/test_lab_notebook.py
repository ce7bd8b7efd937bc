"""The lab without a browser: the notebook's cells run as Python (marimo's ``app.run``), its logic against the
float64 reference, bad input as messages, the experiments' answers, and the server launcher."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import urllib.request

import marimo as mo
import numpy as np
import pytest
from procs import descendants, kill_all, serving, wait_gone, with_default_sigint
from reference import reference_attention

from attnlab import masks
from attnlab.cli import main
from attnlab.lab import NOTEBOOK, logic
from attnlab.lab.logic import LabState, compute
from attnlab.lab.notebook import app
from attnlab.lab.server import HOST, command, free_port, start

Q = np.array([[1.0, 0], [0, 1], [1, 1], [1, -1]])
K = np.array([[1.0, 0], [0, 1], [1, 1], [-1, 1]])
V = np.array([[1.0, 0], [0, 1], [1, 1], [2, 0]])


def controls(**values):
    """Every widget of the controls cell, with ``values`` set (marimo needs all of a cell's definitions)."""
    v = {
        "causal": False,
        "padded": 0,
        "padding_side": "right",
        "masked_rows": "raise",
        "temperature": 1.0,
        "shift": 0,
        "value_row": 0,
        "value_text": "",
    }
    v.update(values)
    return {
        "causal": mo.ui.checkbox(value=v["causal"]),
        "padded": mo.ui.number(start=0, stop=8, value=v["padded"]),
        "padding_side": mo.ui.radio(options=["right", "left"], value=v["padding_side"]),
        "masked_rows": mo.ui.radio(options=["raise", "zero", "nan"], value=v["masked_rows"]),
        "temperature": mo.ui.slider(0.1, 5.0, step=0.1, value=v["temperature"]),
        "shift": mo.ui.slider(-20, 120, step=1, value=v["shift"]),
        "value_row": mo.ui.number(start=0, stop=7, value=v["value_row"]),
        "value_text": mo.ui.text(value=v["value_text"]),
    }


def data_values(html: str, table: str) -> np.ndarray:
    body = html.split(f'id="{table}"', 1)[1].split("</table>", 1)[0]
    rows = body.split("<tr>")[2:]
    return np.array(
        [[np.nan if x == "masked" else float(x) for x in re.findall(r'data-value="([^"]+)"', r)] for r in rows]
    )


def test_notebook_runs_as_python_with_the_articles_example():
    outputs, defs = app.run()
    r = defs["result"]
    assert r.ok
    out, w = reference_attention(Q, K, V)
    np.testing.assert_allclose(r.weights, w, atol=1e-12)
    np.testing.assert_allclose(r.output, out, atol=1e-12)
    assert len(outputs) >= 15


def test_notebook_cells_follow_the_controls():
    _, defs = app.run(defs=controls(causal=True, temperature=2.0, shift=10, value_row=0, value_text="100, 0"))
    r = defs["result"]
    v = V.copy()
    v[0] = [100, 0]
    out, w = reference_attention(Q, K, v, allowed=masks.causal(4), temperature=2.0, bias=10.0)
    np.testing.assert_allclose(r.weights, w, atol=1e-12)
    np.testing.assert_allclose(r.output, out, atol=1e-12)
    _, defs = app.run(defs=controls(causal=True, padded=1, padding_side="left"))
    assert not defs["result"].ok and "fully-masked-row trap" in defs["result"].message


def test_result_html_carries_exact_values_and_settings():
    r = compute(LabState(q="1, 0\n0, 1", k="1, 0\n0, 1", v="10, 0\n0, 20", causal=True, temperature=1.0))
    html = logic.result_html(r)
    _, ref = reference_attention(np.eye(2), np.eye(2), [[10, 0], [0, 20]], allowed=masks.causal(2))
    w = data_values(html, "al-weights")
    assert np.isnan(w[0, 1])  # masked, drawn as "masked", not as 0
    np.testing.assert_allclose(w[~np.isnan(w)], ref[masks.causal(2)], atol=1e-15)
    assert 'data-causal="true"' in html and 'data-temperature="1"' in html
    steps = logic.steps_html(r)
    assert "s[q0,k0] = q0·k0 = 1×1 + 0×0 = 1" in steps and 'id="al-weights"' not in steps
    svg = logic.pictures_html(r)
    assert svg.count('fill="url(#al-hatch)"') == 2  # the one masked heatmap cell and the legend (last row: none)
    assert 'data-testid="al-heatmap"' in svg and "Σ=1" in svg


@pytest.mark.parametrize(
    ("state", "message"),
    [
        (LabState(q="1, x", k="1, 0", v="1"), "Q: 'x' at row 0, column 1 is not a number"),
        (LabState(q="1, 0\n1", k="1, 0", v="1"), "Q: ragged matrix: row 1 has 1 number(s) but row 0 has 2"),
        (LabState(q="", k="1", v="1"), "Q: empty matrix"),
        (LabState(q="\n".join(["1, 0"] * 9), k="1, 0", v="1"), "Q: 9×2 is larger than the lab allows (8 rows × 8"),
        (LabState(q="1, 0", k="1, 0, 0", v="1"), "K: rows have 3 number(s) but Q's have 2"),
        (LabState(q="1, 0", k="1, 0", v="1\n2"), "V: 2 row(s) but K has 1"),
        (LabState(q="1, 0", k="1, 0\n0, 1", v="1\n2", causal=True), "causal: Q has 1 rows and K has 2"),
        (LabState(q="1", k="1", v="1", padded=2), "padding: 2 padded key(s) but there are only 1 keys"),
        (LabState(q="1", k="1", v="1, 2", value_text="1"), "v0: expected one row of 2 number(s), got 1×1"),
        (LabState(q="1", k="1", v="1", value_row=3, value_text="1"), "value row: 3 is not a key position"),
        (LabState(q="1", k="1", v="1", padded=1), "fully-masked-row trap"),
        (LabState(q="1", k="1", v="1", tokens="a b"), "tokens: 2 token(s) for 1 positions"),
        (LabState(q="1, inf", k="1, 0", v="1"), "Q: 'inf' at row 0, column 1 is not a finite number"),
    ],
)
def test_bad_input_is_a_message_not_an_exception(state, message):
    r = compute(state)
    assert not r.ok and message in r.message
    html = logic.result_html(r)
    assert 'data-testid="al-input-error"' in html and "Traceback" not in html
    assert logic.pictures_html(r) == "" and logic.heatmap_png(r) is None


def test_html_is_escaped():
    assert "<script>" not in logic.error_html("<script>alert(1)</script>")
    r = compute(LabState(q="1, 0\n0, 1", k="1, 0\n0, 1", v="1\n2", tokens="<b> x"))
    assert "&lt;b&gt;" in logic.result_html(r)


def test_masked_row_policies_zero_and_nan():
    base = LabState(q="1", k="1", v="5", padded=1)
    zero = compute(logic.with_state(base, masked_rows="zero"))
    assert zero.ok and zero.weights.tolist() == [[0.0]] and zero.output.tolist() == [[0.0]]
    nan = compute(logic.with_state(base, masked_rows="nan"))
    assert nan.ok and np.isnan(nan.weights).all()
    assert "Policy &#x27;nan&#x27;" in logic.result_html(nan)


def test_experiments_reveal_the_right_answers():
    d, html = logic.exp_shift(logic.DEFAULT, 10.0)
    assert d <= 1e-15 and "Largest change of any weight" in html
    d100, _ = logic.exp_shift(logic.with_state(logic.DEFAULT, causal=True), 100.0)  # the self-test
    assert d100 <= 1e-12

    hot, html = logic.exp_temperature(logic.with_state(logic.DEFAULT, causal=True), 3.0)
    _, ref = reference_attention(Q, K, V, allowed=masks.causal(4), temperature=3.0)
    np.testing.assert_allclose(hot, ref, atol=1e-12)
    np.testing.assert_array_equal(hot[0], [1, 0, 0, 0])  # one legal key at any temperature
    assert "Entropy per row" in html

    dw, do, _ = logic.exp_value(logic.DEFAULT, 0, (100.0, 0.0))
    assert dw == 0.0 and do > 10

    for t in (0.1, 1.0, 5.0):
        four, _ = logic.four_pairs(t)
        np.testing.assert_array_equal(four["causal"][0], [1, 0, 0, 0])
        assert (four["full"][0, 1:] > 0).all()  # without the mask the first query reads the future
        _, ref = reference_attention(Q, K, np.eye(4), allowed=masks.causal(4), temperature=t)
        np.testing.assert_allclose(four["causal"], ref, atol=1e-12)

    trap, html = logic.masked_row_trap()
    assert "may attend to no key at all" in trap["raise"]
    assert np.isnan(trap["nan"][0]).all() and (trap["zero"][0] == 0).all()
    np.testing.assert_allclose(trap["zero"][1:].sum(-1), 1.0)

    conv, html = logic.mask_conventions()
    assert np.isnan(conv["inverted"][3]).all() and conv["inverted"][0, 0] == 0
    np.testing.assert_array_equal(conv["right"][0], [1, 0, 0, 0])


def test_experiments_with_bad_inputs_say_so():
    bad = LabState(q="x", k="1", v="1")
    assert "Fix the inputs above first" in logic.exp_shift(bad)[1]
    assert "Fix the inputs above first" in logic.exp_temperature(bad)[1]
    assert "Fix the inputs above first" in logic.exp_value(bad)[2]
    assert "needs V with 2 columns" in logic.exp_value(LabState(q="1", k="1", v="1"))[2]


def test_reveal_needs_a_prediction_first():
    assert "RESULT" not in logic.reveal(None, "a", "RESULT") and "Make a prediction first" in logic.reveal("", "a", "x")
    assert logic.reveal("a", "a", "RESULT").endswith("RESULT")


def test_prediction_feedback():
    assert "Make a prediction first" in logic.prediction_feedback(None, "a")
    assert "right" in logic.prediction_feedback("a", "a")
    assert "Not quite" in logic.prediction_feedback("b", "a")


def test_server_command_is_local_and_headless():
    cmd = command(8123)
    assert cmd[1:4] == ["-m", "marimo", "run"] and str(NOTEBOOK) in cmd
    assert cmd[-5:] == ["--headless", "--host", "127.0.0.1", "--port", "8123"]
    edit = command(1, edit=True)
    assert "--skip-update-check" in edit
    assert edit[edit.index("--token-password-file") + 1] == "-"  # the token comes on stdin, never in argv
    assert 1024 <= free_port() <= 65535


def test_lab_server_starts_answers_on_localhost_and_stops():
    with start() as lab:
        lab.wait_ready(60)
        assert lab.url.startswith(f"http://{HOST}:")
        with urllib.request.urlopen(lab.url, timeout=10) as r:
            page = r.read().decode()
        assert r.status == 200 and "<script" in page
        assert "https://cdn" not in page and "unpkg.com" not in page and "jsdelivr" not in page
        assert lab.process.poll() is None
    assert lab.process.poll() is not None


def test_lab_command_prints_the_url(capsys):
    assert main(["lab", "--exit-when-ready"]) == 0
    out = capsys.readouterr().out
    assert re.match(r"attnlab lab: serving notebook.py at http://127\.0\.0\.1:\d+/ ", out)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--port", "-1"], "--port: expected an int in [0, 65535], got -1"),
        (["--port", "65536"], "--port: expected an int in [0, 65535], got 65536"),
        (["--port", "80.5"], "--port: expected an int in [0, 65535], got '80.5'"),
        (["--timeout", "-1"], "--timeout: expected a finite number > 0, got -1.0"),
        (["--timeout", "0"], "--timeout: expected a finite number > 0, got 0.0"),
        (["--timeout", "nan"], "--timeout: expected a finite number > 0, got nan"),
        (["--timeout", "soon"], "--timeout: expected a finite number > 0, got 'soon'"),
    ],
)
def test_lab_command_checks_its_flags_before_starting(capsys, argv, message):
    assert main(["lab", *argv, "--exit-when-ready"]) == 2
    assert capsys.readouterr().err == f"attnlab lab: error: {message}\n"


def test_lab_command_refuses_a_port_in_use(capsys):
    with socket.socket() as taken:
        taken.bind((HOST, 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["lab", "--port", str(port), "--exit-when-ready"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"attnlab lab: error: port {port} on 127.0.0.1 is in use (") and err.count("\n") == 1, err


# (SIGINT and SIGHUP end in the same KeyboardInterrupt handler; the ring's test sends SIGINT to a whole group)
@pytest.mark.parametrize("sig", [signal.SIGTERM], ids=lambda s: s.name)
def test_a_signal_stops_attnlab_lab_and_its_server(sig):
    proc = subprocess.Popen(
        with_default_sigint([sys.executable, "-m", "attnlab", "lab"]),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    children: set[int] = set()
    try:
        line = proc.stdout.readline()  # printed once the server answers (attnlab lab waits up to --timeout 60 s)
        port = int(re.match(r"attnlab lab: serving notebook.py at http://127\.0\.0\.1:(\d+)/ ", line).group(1))
        children = descendants(proc.pid)
        assert children and serving(port)
        if sig == signal.SIGINT:
            os.killpg(proc.pid, sig)  # Ctrl-C in a terminal: the whole foreground group
        else:
            proc.send_signal(sig)
        assert proc.wait(15) == 0
        tail = proc.stdout.read()
        assert tail == ("\nattnlab lab: stopped\n" if sig == signal.SIGINT else "\nattnlab lab: stopped by SIGTERM\n")
        assert wait_gone(children, 5) == set(), "the marimo server outlived attnlab lab"
        assert not serving(port)
    finally:
        kill_all(children | {proc.pid})
        proc.wait(10)
        proc.stdout.close()
