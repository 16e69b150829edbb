"""How well input moderation tells harm from harmless look-alikes: per-category precision and recall
on moderation/data/category_eval.csv, a set kept apart from the training data.

Every text is scored as the service scores it (classifiers, rule floors, windows) and flagged at 0.5,
the threshold of /v1/moderations. Prints, per category, the labelled positives, precision and recall;
per group of the set (the category a row was written for, and `terrorism`, counted as `violence`),
the harmful rows caught in their own category and the harmless rows flagged in any; with
`--show-misses`, each missed and each wrongly flagged text. Ends with one line
  RESULT precision=<any category> recall=<any category> violence_recall=… terrorism_recall=…
  harassment_threatening_recall=… hate_threatening_recall=…

Run with `make benchmark-moderation-quality` (or `python -m benchmarks moderation_quality`); about
ten seconds of one core after the classifiers load. docs/moderation-quality.md has the figures.
"""

from __future__ import annotations

import argparse
import time

from benchmarks.harness import django_setup, result


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--show-misses", action="store_true", help="list the missed and wrongly flagged texts")


def _pct(value: float | None) -> str:
    return "  n/a" if value is None else f"{value * 100:5.1f}"


def run(args: argparse.Namespace) -> None:
    django_setup()
    from moderation.classifiers import warm_up
    from moderation.evaluation import CATEGORY_EVAL_PATH, THRESHOLD, Figures, evaluate

    started = time.perf_counter()
    warm_up()
    print(f"classifiers loaded in {time.perf_counter() - started:.1f} s")
    started = time.perf_counter()
    measured = evaluate()
    print(
        f"{measured.size} examples of {CATEGORY_EVAL_PATH.name} scored in {time.perf_counter() - started:.1f} s, "
        f"flagged at {THRESHOLD}"
    )
    print(f"\n{'category':24} {'n':>4} {'prec%':>6} {'recall%':>7}")
    for category, figures in measured.per_category.items():
        print(f"{category:24} {figures.positives:4d} {_pct(figures.precision):>6} {_pct(figures.recall):>7}")
    overall = measured.overall
    print(f"{'any category':24} {overall.positives:4d} {_pct(overall.precision):>6} {_pct(overall.recall):>7}")

    print(f"\n{'group':24} {'caught':>9} {'recall%':>7} {'harmless flagged':>17}")
    for group, (alarms, harmless) in measured.group_false_alarms.items():
        figures = measured.group_recall.get(group)
        caught = f"{figures.true_positives}/{figures.positives}" if figures else "-"
        recall = _pct(figures.recall) if figures else "  n/a"
        print(f"{group:24} {caught:>9} {recall:>7} {f'{alarms}/{harmless}':>17}")
    if args.show_misses:
        for group, text in measured.missed:
            print(f"  missed ({group}): {text}")
        for category, text, score in measured.false_alarms:
            print(f"  false alarm ({category} {score:.2f}): {text}")

    def recall(figures: Figures) -> float:
        return round(figures.recall or 0.0, 4)

    result(
        precision=round(overall.precision or 0.0, 4),
        recall=recall(overall),
        violence_recall=recall(measured.per_category["violence"]),
        terrorism_recall=recall(measured.group_recall["terrorism"]),
        harassment_threatening_recall=recall(measured.per_category["harassment/threatening"]),
        hate_threatening_recall=recall(measured.per_category["hate/threatening"]),
    )
