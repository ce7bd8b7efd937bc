"""The end-to-end example: a one-layer attention model trained with attnlab's own forward and backward."""

from __future__ import annotations

import math

import numpy as np

from attnlab.cli import main
from attnlab.commands.train import make_batch, train_retrieval


def test_short_training_beats_chance_by_far():
    r = train_retrieval(steps=150, seed=3)
    assert r.chance == math.log(16)
    assert abs(r.losses[0] - r.chance) < 0.5  # starts at chance
    assert np.mean(r.losses[-20:]) < 0.1 * r.chance  # training loss (with dropout) fell
    # held-out, dropout off: chance would be loss 2.77 and accuracy 1/16
    assert r.eval_loss < 0.05 * r.chance
    assert r.eval_accuracy > 0.95
    assert r.eval_attention_on_target > 0.6  # the learned pattern: attend to the queried key
    w = r.sample_weights[0, :, 0]  # [h, n_pairs]
    assert (w[:, r.sample.lengths[0] :] == 0).all()  # padding gets exactly zero weight
    assert (w.argmax(axis=-1) == r.sample.where[0]).all()


def test_batches_are_well_formed():
    b = make_batch(np.random.default_rng(0), 32, 5, 7, 4)
    assert b.x_q.shape == (32, 1, 11) and b.x_kv.shape == (32, 5, 11) and b.mask.shape == (32, 1, 1, 5)
    assert all(len(set(row)) == 5 for row in b.keys.tolist())  # distinct keys per example
    assert (b.where < b.lengths).all()
    np.testing.assert_array_equal(b.x_q[:, 0, :7].argmax(-1), b.keys[np.arange(32), b.where])
    np.testing.assert_array_equal(b.target, b.values[np.arange(32), b.where])


def test_cli_prints_falling_loss_and_pattern(capsys):
    assert main(["train", "--steps", "120", "--every", "40", "--seed", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("chance loss ln(n_values) = 2.773; loss at step 1: ")
    means = [float(line.split()[-1]) for line in out if line.startswith("steps ")]
    assert len(means) == 3 and means[0] > means[-1] and means[-1] < 0.3
    assert any("◀ queried" in line for line in out)
    assert any(line.startswith("held-out (dropout off): loss ") for line in out)


def test_cli_rejects_bad_options(capsys):
    assert main(["train", "--pairs", "9", "--keys", "8"]) == 2
    assert "--keys: expected an int >= --pairs=9 (each example's keys differ), got 8" in capsys.readouterr().err
    assert main(["train", "--steps", "0"]) == 2
