"""Prompt injection in files: precision and recall of the file-passage rules on a labelled set.

The set (`moderation/data/injection_passages.csv`, written for this) holds 110 passages of documents
that carry an injection (paraphrased overrides, exfiltration links, fake ends of quotation and
system lines, role-play, instructions to the model) and 120 harmless ones, hard negatives among
them: pages about prompt injection, manuals full of imperatives, emails that say "ignore the
previous email", policies, code. The rules (`moderation/passage_injection.py`) were written against
a separate development set (`--set development`) and never matched this one while being written.
Prints each kind's figures, the misses and false alarms, and

  RESULT recall=<r> precision=<p> false_positive_rate=<f> injected=<n> harmless=<m>

`--compare` also runs the detector messages get (known-attack similarity and its rules, at the 0.8
that withheld passages before the file rules) on the same passages, loading the embedding model.

    make benchmark-injection      (or `python -m benchmarks injection`)
"""

from __future__ import annotations

import argparse
import time

from benchmarks.harness import django_setup, result


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--set",
        choices=["evaluation", "development"],
        default="evaluation",
        help="which labelled set (default evaluation)",
    )
    parser.add_argument("--compare", action="store_true", help="also measure the message detector on the same set")


def run(args: argparse.Namespace) -> None:
    from moderation.passage_injection import (
        DEVELOPMENT_PATH,
        EVALUATION_PATH,
        Measured,
        labelled_passages,
        passage_injection_measure,
    )

    path = EVALUATION_PATH if args.set == "evaluation" else DEVELOPMENT_PATH
    passages = labelled_passages(path)
    started = time.perf_counter()
    measured = passage_injection_measure(passages)
    per_passage_ms = (time.perf_counter() - started) * 1000 / len(passages)
    print(f"{path.name}: {measured.injected} injected, {measured.harmless} harmless passages")
    _report("file rules", measured)
    print(f"  {per_passage_ms:.2f} ms a passage")
    for text in measured.missed:
        print(f"  missed: {text[:110]!r}")
    for text in measured.false_alarms:
        print(f"  false alarm: {text[:110]!r}")

    if args.compare:
        django_setup()
        from moderation.classifiers import score_many

        def message_detector(texts: list[str]) -> list[bool]:
            return [s.injection >= 0.8 for s in score_many(texts, injection=True)]

        compared: Measured = passage_injection_measure(passages, flagged=message_detector)
        _report("message detector", compared)

    result(
        recall=round(measured.recall, 4),
        precision=round(measured.precision, 4),
        false_positive_rate=round(measured.false_positive_rate, 4),
        injected=measured.injected,
        harmless=measured.harmless,
    )


def _report(name: str, measured) -> None:
    print(
        f"\n{name}: recall {measured.recall:.1%}, precision {measured.precision:.1%}, "
        f"harmless withheld {measured.false_positive_rate:.1%} ({len(measured.false_alarms)} of {measured.harmless})"
    )
    print(f"  {'':9} {'kind':16} {'flagged':>8}")
    for (injected, kind), (flagged, total) in measured.by_kind.items():
        print(f"  {'injected' if injected else 'harmless':9} {kind:16} {flagged:>3} of {total}")
