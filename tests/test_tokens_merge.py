"""attnlab.models.tokens.merge_bytes: byte-level tokens grouped into the characters they form, attention merged.

Pure: random texts cut into byte pieces at random places (as a byte-level BPE may cut them), random causal
weights; no model is loaded.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab import masks
from attnlab.errors import DTypeError, ShapeError
from attnlab.models.tokens import merge_bytes, readable

#: ASCII, Chinese (3 bytes each in UTF-8), Greek (2), an emoji (4): every UTF-8 length.
ALPHABET = "ab .,我喜欢猫的注意力αβ😀\n"


@st.composite
def pieces_and_weights(draw):
    text = draw(st.text(alphabet=ALPHABET, min_size=1, max_size=12))
    data = text.encode("utf-8")
    cuts = sorted(draw(st.sets(st.integers(1, len(data) - 1), max_size=len(data) - 1)) if len(data) > 1 else [])
    bounds = [0, *cuts, len(data)]
    pieces = [data[a:b] for a, b in itertools.pairwise(bounds)]
    n = len(pieces)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    allowed = masks.causal(n)
    w = np.where(allowed, rng.random((2, 3, n, n)) + 1e-3, 0.0)  # [L, h, n, n]
    w /= w.sum(-1, keepdims=True)
    return text, pieces, w, allowed


@settings(max_examples=60, deadline=None)
@given(pieces_and_weights())
def test_groups_are_whole_characters_rows_stay_distributions_masked_stays_zero(case):
    text, pieces, w, allowed = case
    m = merge_bytes(pieces, w, allowed)
    assert [i for g in m.groups for i in g] == list(range(len(pieces)))  # a partition, in order
    assert all(m.complete)
    assert "".join(m.labels) == readable(text)
    for g in m.groups:  # each group's bytes are whole characters, and no shorter prefix of it is
        b = b"".join(pieces[i] for i in g)
        b.decode("utf-8")
        for j in range(1, len(g)):
            with pytest.raises(UnicodeDecodeError):
                b"".join(pieces[i] for i in g[:j]).decode("utf-8")
    np.testing.assert_allclose(m.weights.sum(-1), 1.0, rtol=0, atol=1e-12)
    assert (m.weights[..., ~m.allowed] == 0.0).all()
    assert not m.allowed[np.triu_indices(len(m.groups), 1)].any()  # still causal over the characters
    # the definition, in float64 with plain loops: keys summed over a group, queries from the group's last token
    ref = np.array([[[w[..., g_q[-1], list(g_k)].sum(-1) for g_k in m.groups] for g_q in m.groups]])  # [1, g, g, L, h]
    np.testing.assert_allclose(np.moveaxis(ref[0], (0, 1), (-2, -1)), m.weights, rtol=0, atol=1e-15)


@settings(max_examples=30, deadline=None)
@given(st.text(alphabet="abcxyz .,!?\n", min_size=1, max_size=16), st.integers(0, 2**32 - 1))
def test_ascii_text_is_unchanged(text, seed):
    pieces = [ch.encode() for ch in text]
    n = len(pieces)
    rng = np.random.default_rng(seed)
    w = rng.random((3, n, n))
    m = merge_bytes(pieces, w, masks.causal(n))
    assert m.groups == tuple((i,) for i in range(n)) and not m.merged
    assert m.labels == tuple(readable(ch) for ch in text)
    np.testing.assert_array_equal(m.weights, w)  # the same numbers, copied
    np.testing.assert_array_equal(m.allowed, masks.causal(n))


def test_a_text_cut_inside_a_character_shows_the_bytes_of_its_last_group():
    m = merge_bytes([b"a", "猫".encode()[:2]])  # the text was cut after 2 of the 3 bytes
    assert m.labels == ("a", "\\xe7\\x8c") and m.complete == (True, False)
    assert m.weights is None and m.allowed is None


def test_bad_input_is_refused_with_the_argument_named():
    with pytest.raises(ShapeError, match=r"weights: expected \[\.\.\., 2, 2\]"):
        merge_bytes([b"a", b"b"], np.ones((3, 3)))
    with pytest.raises(DTypeError, match=r"pieces\[1\]"):
        merge_bytes([b"a", "b"])  # type: ignore[list-item]
    with pytest.raises(ShapeError, match=r"allowed: expected a boolean \[2, 2\]"):
        merge_bytes([b"a", b"b"], None, np.ones((2, 2)))
    with pytest.raises(ShapeError, match="at least one token"):
        merge_bytes([])
