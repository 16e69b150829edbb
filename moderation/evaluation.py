"""Measuring the per-category classifiers on an evaluation set that training never sees.

`data/category_eval.csv` (`text,labels,group`) was written apart from `data/labelled.csv`: for each
category, harmful requests and harmless look-alikes (questions about crime, fiction, news, history,
prevention), and threats phrased as plans or questions. `group` says which category a row was written
for; its harmful rows carry that category in `labels` (a sub-category implies its parent) and
harmless rows carry none. One group is not an OpenAI category: `terrorism` (praising an attack and
urging others to repeat it) is labelled `violence`, its closest category; requests for the means of
an attack are `illicit/violent` besides. `sexual/minors` has harmless rows only: the project writes
no examples of that harm (docs/moderation-quality.md).

Texts are scored as the service scores them (`score_many`: windows, rule floors, parents), flagged
at `THRESHOLD`, the threshold of `/v1/moderations`.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path

from moderation.classifiers import CATEGORIES, DATA_DIR, PARENT, score_many

CATEGORY_EVAL_PATH = DATA_DIR / "category_eval.csv"
THRESHOLD = 0.5
# A group that is not a category, and the category that stands for it.
GROUP_CATEGORY = {"terrorism": "violence"}


@dataclass(frozen=True)
class EvalExample:
    text: str
    labels: frozenset[str]
    group: str

    @property
    def harmful(self) -> bool:
        return bool(self.labels)


@dataclass(frozen=True)
class Figures:
    positives: int
    true_positives: int
    flagged: int

    @property
    def precision(self) -> float | None:
        return self.true_positives / self.flagged if self.flagged else None

    @property
    def recall(self) -> float | None:
        return self.true_positives / self.positives if self.positives else None


@dataclass(frozen=True)
class Evaluation:
    size: int
    per_category: dict[str, Figures]
    # Per group: harmful rows flagged in the group's category, and harmless rows flagged in any.
    group_recall: dict[str, Figures]
    group_false_alarms: dict[str, tuple[int, int]]
    overall: Figures
    missed: list[tuple[str, str]] = field(default_factory=list)  # (group, text)
    false_alarms: list[tuple[str, str, float]] = field(default_factory=list)  # (category, text, score)


def load_eval(path: Path = CATEGORY_EVAL_PATH) -> list[EvalExample]:
    examples = []
    with path.open(encoding="utf-8", newline="") as f:
        for row in csv.DictReader(f):
            labels = {label for label in row["labels"].split("|") if label}
            unknown = labels - set(CATEGORIES)
            group_category = GROUP_CATEGORY.get(row["group"], row["group"])
            if unknown or group_category not in CATEGORIES:
                raise ValueError(f"unknown labels or group in {row['text'][:60]!r}")
            if labels and group_category not in labels:
                raise ValueError(f"a harmful row without its group's category: {row['text'][:60]!r}")
            labels |= {PARENT[label] for label in labels if label in PARENT}
            examples.append(EvalExample(row["text"], frozenset(labels), row["group"]))
    return examples


def evaluate(path: Path = CATEGORY_EVAL_PATH, *, batch: int = 64) -> Evaluation:
    """Score every example of the set and count, per category and overall, what is flagged."""
    examples = load_eval(path)
    scores: list[dict[str, float]] = []
    for start in range(0, len(examples), batch):
        scores += [s.categories for s in score_many([e.text for e in examples[start : start + batch]])]
    flagged = [{c for c, v in s.items() if v >= THRESHOLD} for s in scores]

    per_category = {
        c: Figures(
            positives=sum(c in e.labels for e in examples),
            true_positives=sum(c in e.labels and c in f for e, f in zip(examples, flagged, strict=True)),
            flagged=sum(c in f for f in flagged),
        )
        for c in CATEGORIES
    }
    groups = list(dict.fromkeys(e.group for e in examples))
    group_recall: dict[str, Figures] = {}
    group_false_alarms: dict[str, tuple[int, int]] = {}
    missed: list[tuple[str, str]] = []
    false_alarms: list[tuple[str, str, float]] = []
    for e, f, s in zip(examples, flagged, scores, strict=True):
        if e.harmful and GROUP_CATEGORY.get(e.group, e.group) not in f:
            missed.append((e.group, e.text))
        if not e.harmful and f:
            top = max(f, key=lambda c: s[c])
            false_alarms.append((top, e.text, s[top]))
    for group in groups:
        category = GROUP_CATEGORY.get(group, group)
        rows = [(e, f) for e, f in zip(examples, flagged, strict=True) if e.group == group]
        harmful = [f for e, f in rows if e.harmful]
        harmless = [f for e, f in rows if not e.harmful]
        if harmful:
            caught = sum(category in f for f in harmful)
            group_recall[group] = Figures(positives=len(harmful), true_positives=caught, flagged=caught)
        group_false_alarms[group] = (sum(bool(f) for f in harmless), len(harmless))
    overall = Figures(
        positives=sum(e.harmful for e in examples),
        true_positives=sum(e.harmful and bool(f) for e, f in zip(examples, flagged, strict=True)),
        flagged=sum(bool(f) for f in flagged),
    )
    return Evaluation(len(examples), per_category, group_recall, group_false_alarms, overall, missed, false_alarms)
