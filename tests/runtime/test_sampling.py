"""The sampler's filters against Hugging Face's own warpers (temperature, top-k, top-p in
transformers' order), a hand-worked top-p case, and its argument checks."""

import numpy as np
import pytest
import torch
from transformers.generation.logits_process import (
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from trt_kv.errors import ArgumentError
from trt_kv.runtime.sampling import Sampler


def hugging_face_filtered(logits, temperature, top_k, top_p):
    """What ``generate(do_sample=True, ...)`` samples from: the warpers in its order."""
    scores = torch.from_numpy(logits.astype(np.float64))
    warpers = [TemperatureLogitsWarper(temperature)]
    if top_k is not None:
        warpers.append(TopKLogitsWarper(top_k))
    if top_p < 1.0:
        warpers.append(TopPLogitsWarper(top_p))
    for warp in warpers:
        scores = warp(None, scores)
    return scores.numpy()


@pytest.mark.parametrize("top_p", [0.0, 0.3, 0.9, 0.999, 1.0])
@pytest.mark.parametrize("top_k", [None, 1, 7])
@pytest.mark.parametrize("temperature", [0.6, 1.0, 1.7])
def test_filters_keep_the_tokens_hugging_face_keeps(temperature, top_k, top_p):
    logits = np.random.default_rng(11).normal(0, 3, (6, 50)).astype(np.float32)  # [B, V]
    ours = Sampler(temperature, top_k, top_p=top_p).filtered(logits)
    theirs = hugging_face_filtered(logits, temperature, top_k, top_p)
    np.testing.assert_array_equal(np.isneginf(ours), np.isneginf(theirs))
    np.testing.assert_allclose(ours[np.isfinite(ours)], theirs[np.isfinite(theirs)], rtol=1e-15)


def test_top_p_drops_the_tail_whose_probabilities_sum_to_at_most_one_minus_p():
    # probabilities 0.5, 0.3, 0.15, 0.05: least likely first the sums are 0.05, 0.2, 0.5, 1.0;
    # with top_p 0.75 the tokens whose sum is <= 0.25 go: tokens 3 and 2
    logits = np.log(np.array([[0.5, 0.3, 0.15, 0.05]], np.float32))
    kept = np.isfinite(Sampler(1.0, top_p=0.75).filtered(logits))
    assert kept.tolist() == [[True, True, False, False]]
    draws = Sampler(1.0, top_p=0.75, seed=5)
    assert {int(draws(logits)[0]) for _ in range(200)} == {0, 1}
    assert Sampler(1.0, top_p=0.0, seed=5)(logits).tolist() == [0]  # only the most likely


@pytest.mark.parametrize(
    ("top_p", "message"),
    [
        (1.5, "top_p: expected a finite number in [0.0, 1.0], got 1.5"),
        (-0.1, "top_p: expected a finite number in [0.0, 1.0], got -0.1"),
        (float("nan"), "top_p: expected a finite number in [0.0, 1.0], got nan"),
        ("0.9", "top_p: expected a real number, got '0.9'"),
    ],
)
def test_top_p_outside_zero_one_is_refused_by_name(top_p, message):
    with pytest.raises(ArgumentError) as err:
        Sampler(1.0, top_p=top_p)
    assert str(err.value) == message
