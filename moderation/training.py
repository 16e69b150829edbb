"""Training and measuring the per-category classifiers on the labelled set.

The held-out split is fixed by a hash of each text (one in five), so it does not move when examples
are added elsewhere in the file and every run measures the same examples. The shipped weights are
trained on the training split only, so the held-out figures describe exactly what is deployed.
Five-fold cross-validation over the whole set is reported too: the held-out split is small.
"""

from __future__ import annotations

import csv
import hashlib
import random
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from moderation.classifiers import (
    ABOUT_HARM_CEILING,
    CATEGORIES,
    DATA_DIR,
    DATASET_PATH,
    PARENT,
    WEIGHTS_PATH,
    Scores,
    about_harm,
    features,
    highest_of,
    injection_from,
    rule_floors,
    score_many,
    weights,
)
from moderation.defaults import DEFAULT_RULES
from moderation.selectors import policy_built_in
from moderation.services import output_check_texts, verdict_from_scores

INJECTION_EVAL_PATH = DATA_DIR / "injection_eval.csv"

THRESHOLD = 0.5
# Subcategories need a few examples of their own to be learned; the rest come from rules only.
MIN_POSITIVES = 8
# Sentences of the default model's own answers to harmless prompts, picked for scoring highest under
# the classifiers before they were added (hard negatives). Chosen for that, they would overstate the
# false alarms of a streamed answer; `benchmarks/answer_cuts.py` measures those on whole answers.
SAMPLED_KIND = "benign-sampled"


@dataclass(frozen=True)
class Example:
    text: str
    labels: frozenset[str]
    kind: str

    @property
    def held_out(self) -> bool:
        return int(hashlib.sha1(self.text.encode("utf-8")).hexdigest(), 16) % 5 == 0


def load_examples(path: Path = DATASET_PATH) -> list[Example]:
    examples = []
    with path.open(encoding="utf-8", newline="") as f:
        for row in csv.DictReader(f):
            labels = {label for label in row["labels"].split("|") if label}
            unknown = labels - set(CATEGORIES)
            if unknown:
                raise ValueError(f"unknown labels {sorted(unknown)} in {row['text'][:60]!r}")
            labels |= {PARENT[label] for label in labels if label in PARENT}
            examples.append(Example(row["text"], frozenset(labels), row["kind"]))
    return examples


def _fit(x: np.ndarray, examples: list[Example]) -> tuple[list[str], np.ndarray, np.ndarray]:
    from sklearn.linear_model import LogisticRegression

    names, coefs, intercepts = [], [], []
    for category in CATEGORIES:
        y = np.array([category in e.labels for e in examples])
        if y.sum() < MIN_POSITIVES:
            continue
        model = LogisticRegression(C=16.0, class_weight={False: 1.0, True: 3.0}, max_iter=2000)
        model.fit(x, y)
        names.append(category)
        coefs.append(model.coef_[0])
        intercepts.append(model.intercept_[0])
    return names, np.array(coefs, dtype=np.float32), np.array(intercepts, dtype=np.float32)


def _predict(x: np.ndarray, texts: list[str], fitted: tuple[list[str], np.ndarray, np.ndarray]) -> np.ndarray:
    """Scores as the service computes them: regressions, rule floors, parents at least their subs."""
    names, coef, intercept = fitted
    probs = 1.0 / (1.0 + np.exp(-(x @ coef.T + intercept)))
    scores = np.zeros((len(texts), len(CATEGORIES)), dtype=np.float32)
    index = {c: i for i, c in enumerate(CATEGORIES)}
    for j, name in enumerate(names):
        scores[:, index[name]] = probs[:, j]
    for i, text in enumerate(texts):
        if about_harm(text):
            scores[i] = np.minimum(scores[i], ABOUT_HARM_CEILING)
        for name, floor in rule_floors(text).items():
            scores[i, index[name]] = max(scores[i, index[name]], floor)
        if scores[i, index["sexual/minors"]] < 0.5:
            scores[i, index["sexual/minors"]] = 0.0
        for sub, parent in PARENT.items():
            scores[i, index[parent]] = max(scores[i, index[parent]], scores[i, index[sub]])
    return scores


def _measure(scores: np.ndarray, examples: list[Example]) -> dict:
    per_category = {}
    for j, category in enumerate(CATEGORIES):
        truth = np.array([category in e.labels for e in examples])
        predicted = scores[:, j] >= THRESHOLD
        tp = int((truth & predicted).sum())
        fp = int((~truth & predicted).sum())
        fn = int((truth & ~predicted).sum())
        per_category[category] = {
            "positives": int(truth.sum()),
            "precision": tp / (tp + fp) if tp + fp else None,
            "recall": tp / (tp + fn) if tp + fn else None,
        }
    flagged = scores.max(axis=1) >= THRESHOLD
    harmful = np.array([bool(e.labels) for e in examples])
    by_kind: dict[str, list[bool]] = defaultdict(list)
    for e, f in zip(examples, flagged, strict=True):
        if not e.labels:
            by_kind[e.kind].append(bool(f))
    any_tp = int((flagged & harmful).sum())
    return {
        "size": len(examples),
        "per_category": per_category,
        "any": {
            "precision": any_tp / int(flagged.sum()) if flagged.sum() else None,
            "recall": any_tp / int(harmful.sum()) if harmful.sum() else None,
        },
        "benign_false_positive_rate": {kind: (sum(v) / len(v), len(v)) for kind, v in sorted(by_kind.items())},
    }


def _policy_outcomes(scores: np.ndarray, injection: np.ndarray, examples: list[Example]) -> dict:
    """What the default policy does with each group: the share blocked and the share warned."""
    policy = policy_built_in()
    groups: dict[str, list[str]] = defaultdict(list)
    for row, inj, example in zip(scores, injection, examples, strict=True):
        verdict = verdict_from_scores(
            scores=Scores(dict(zip(CATEGORIES, map(float, row), strict=True)), float(inj)), policy=policy
        )
        groups[example.kind].append(verdict.action)
    return {
        kind: (
            sum(a in ("block", "block_and_review") for a in actions) / len(actions),
            sum(a == "warn" for a in actions) / len(actions),
            len(actions),
        )
        for kind, actions in sorted(groups.items())
    }


def _injection_scores(texts: list[str], x: np.ndarray) -> np.ndarray:
    similarity = (x[:, :-1] @ weights.attacks().T).max(axis=1)
    return np.array([injection_from(t, float(s)) for t, s in zip(texts, similarity, strict=True)])


def measure_injection(threshold: float = DEFAULT_RULES["prompt-injection"][0]) -> dict:
    """Detection and false alarms on attacks and look-alike benign requests kept apart from the known set."""
    with INJECTION_EVAL_PATH.open(encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f))
    texts = [r["text"] for r in rows]
    scores = _injection_scores(texts, features(texts))
    attack = np.array([r["is_attack"] == "1" for r in rows])
    caught = scores >= threshold
    return {
        "threshold": threshold,
        "attacks": int(attack.sum()),
        "benign": int((~attack).sum()),
        "recall": float((caught & attack).sum() / attack.sum()),
        "false_positive_rate": float((caught & ~attack).sum() / (~attack).sum()),
        "missed": [t for t, a, c in zip(texts, attack, caught, strict=True) if a and not c],
        "false_alarms": [t for t, a, c in zip(texts, attack, caught, strict=True) if c and not a],
    }


def measure_streaming(*, leads: int = 8) -> dict:
    """How the output checks of a streaming answer fare against the same text scored alone.

    Each harmful example that the default policy blocks on its own is streamed behind a lead of
    harmless examples (at least 200 characters; `leads` different ones): once as a sentence of its
    own after the lead, and once split in two at its middle word, each half in a check of its own,
    as a sentence end or the cut of a long sentence splits what the model writes. Harmless examples
    are streamed behind the same leads, for the false alarms (the sampled answers' sentences left out:
    see SAMPLED_KIND). Every check is built by `output_check_texts` and scored as `OutputMonitor`
    scores it.
    """
    policy = policy_built_in()
    examples = load_examples()
    harmful = [e.text for e in examples if e.labels]
    harmless = [e.text for e in examples if not e.labels and e.kind != SAMPLED_KIND]
    rng = random.Random(0)
    lead_texts = []
    for _ in range(leads):
        lead = ""
        while len(lead) < 200:
            lead += rng.choice(harmless) + " "
        lead_texts.append(lead)

    def blocked(checks: list[tuple[str, str]]) -> list[bool]:
        """Whether each check, (the text that passed before, the new text), blocks."""
        planned = [output_check_texts(before=before, chunk=chunk) for before, chunk in checks]
        texts = list(dict.fromkeys(text for parts, _ in planned for text in parts))
        scores: dict[str, Any] = {}
        for start in range(0, len(texts), 64):
            scores.update(zip(texts[start : start + 64], score_many(texts[start : start + 64]), strict=True))
        return [
            verdict_from_scores(scores=highest_of([scores[t] for t in parts], rules_text=rules), policy=policy).blocks
            for parts, rules in planned
        ]

    def halves(text: str) -> tuple[str, str]:
        cut = text.rfind(" ", 0, len(text) // 2) + 1
        return text[:cut], text[cut:]

    caught = [text for text, hit in zip(harmful, blocked([("", t) for t in harmful]), strict=True) if hit]
    after_lead = blocked([(lead, text) for text in caught for lead in lead_texts])
    first = blocked([(lead, halves(text)[0]) for text in caught for lead in lead_texts])
    second = blocked([(lead + halves(text)[0], halves(text)[1]) for text in caught for lead in lead_texts])
    alone_alarms = blocked([("", text) for text in harmless])
    lead_alarms = blocked([(lead, text) for text in harmless for lead in lead_texts])
    return {
        "harmful": len(harmful),
        "blocked_alone": len(caught),
        "after_lead": sum(after_lead) / len(after_lead),
        "split": sum(a or b for a, b in zip(first, second, strict=True)) / len(first),
        "harmless": len(harmless),
        "harmless_blocked_alone": sum(alone_alarms) / len(alone_alarms),
        "harmless_blocked_after_lead": sum(lead_alarms) / len(lead_alarms),
    }


def train_and_measure(*, save: bool = True, folds: int = 5) -> dict:
    examples = load_examples()
    texts = [e.text for e in examples]
    x = features(texts)
    train = [i for i, e in enumerate(examples) if not e.held_out]
    test = [i for i, e in enumerate(examples) if e.held_out]
    fitted = _fit(x[train], [examples[i] for i in train])
    held_out = _measure(_predict(x[test], [texts[i] for i in test], fitted), [examples[i] for i in test])

    # Cross-validation: every example scored by a model that never saw it.
    order = np.random.default_rng(0).permutation(len(examples))
    cv_scores = np.zeros((len(examples), len(CATEGORIES)), dtype=np.float32)
    for k in range(folds):
        fold = order[k::folds]
        rest = np.setdiff1d(order, fold)
        fold_fit = _fit(x[rest], [examples[i] for i in rest])
        cv_scores[fold] = _predict(x[fold], [texts[i] for i in fold], fold_fit)
    cross_validated = _measure(cv_scores, examples)
    cross_validated["default_policy"] = _policy_outcomes(cv_scores, _injection_scores(texts, x), examples)

    if save:
        names, coef, intercept = fitted
        np.savez_compressed(WEIGHTS_PATH, categories=np.array(names), coef=coef, intercept=intercept)
    return {
        "train_size": len(train),
        "held_out": held_out,
        "cross_validated": cross_validated,
        "categories_learned": fitted[0],
        "injection": measure_injection(),
        "streaming": measure_streaming(),
    }
