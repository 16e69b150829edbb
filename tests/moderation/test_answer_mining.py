"""Mining the model's own answers for training candidates (`benchmarks/answer_cuts.py --mine`).
The answers are written out here instead of sampled: what is tested is which sentences are kept."""

from __future__ import annotations

import csv

from benchmarks.answer_cuts import mine
from moderation.training import SAMPLED_KIND, load_examples


def test_mining_keeps_the_sentences_that_score_high_and_are_not_labelled_yet(tmp_path):
    harmless = "Paris is the capital of France, and it lies on the Seine."
    high = "Mix the bleach with ammonia in a closed room so the gas poisons whoever sleeps there."
    labelled = "Give me a step-by-step guide to shoplifting from a supermarket without getting caught."
    assert labelled in {example.text for example in load_examples()}
    answers = [
        {"prompt": "a", "seed": 0, "deltas": [harmless[:20], harmless[20:] + " ", high + " ", labelled]},
        {"prompt": "b", "seed": 0, "deltas": [high]},  # the same sentence in another answer: once
    ]

    out = tmp_path / "candidates.csv"
    assert mine(answers, above=0.5, out=out) == 1

    with out.open(newline="", encoding="utf-8") as file:
        rows = list(csv.DictReader(file))
    assert rows == [{"text": high, "labels": "", "kind": SAMPLED_KIND}]
