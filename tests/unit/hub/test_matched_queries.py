"""A detector's queries compared as a set (recipes/pipeline_task.py: `matched_queries`)."""

from __future__ import annotations

import numpy as np

from fx2onnx.hub.recipes.pipeline_task import matched_queries


def _outputs(seed: int) -> dict[str, np.ndarray]:
    generator = np.random.default_rng(seed)
    return {"logits": generator.normal(size=(2, 6, 3)), "pred_boxes": generator.uniform(size=(2, 6, 4))}


def test_queries_in_another_order_are_paired_with_their_own():
    expected = _outputs(0)
    order = np.array([[1, 0, 2, 3, 5, 4], [0, 1, 2, 3, 4, 5]])  # two near-equal scores swapped in the first image
    actual = {name: value[np.arange(2)[:, None], order] + 1e-4 for name, value in expected.items()}
    matched = matched_queries(actual, expected)
    for name in expected:
        assert np.abs(matched[name] - expected[name]).max() < 2e-4
        assert np.abs(actual[name] - expected[name]).max() > 0.1  # unmatched, the swap is a large difference


def test_a_query_only_one_side_picked_still_differs():
    expected, actual = _outputs(0), _outputs(0)
    actual["logits"][0, 5], actual["pred_boxes"][0, 5] = 9.0, 0.5  # another query than transformers' last
    matched = matched_queries(actual, expected)
    assert np.abs(matched["logits"] - expected["logits"]).max() > 1.0


def test_outputs_that_are_not_per_query_are_left_as_they_are():
    actual = {"logits": np.zeros((2, 3))}
    assert matched_queries(actual, {"logits": np.ones((2, 3))}) is actual
