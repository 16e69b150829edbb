"""Retrain the moderation classifiers from moderation/data/labelled.csv and print how well they do."""

from __future__ import annotations

from django.core.management.base import BaseCommand

from moderation.classifiers import WEIGHTS_PATH
from moderation.training import THRESHOLD, train_and_measure


def _pct(value: float | None) -> str:
    return "  n/a" if value is None else f"{value * 100:5.1f}"


class Command(BaseCommand):
    help = "Train the per-category moderation classifiers, save their weights, print precision and recall."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--dry-run", action="store_true", help="Measure only; keep the saved weights.")

    def handle(self, *args, dry_run: bool = False, **options) -> None:
        report = train_and_measure(save=not dry_run)
        out = self.stdout
        out.write(f"trained on {report['train_size']} examples; learned: {', '.join(report['categories_learned'])}")
        for title, key in (("held-out split", "held_out"), ("5-fold cross-validation", "cross_validated")):
            section = report[key]
            out.write(f"\n== {title} ({section['size']} examples, threshold {THRESHOLD}) ==")
            out.write(f"{'category':26} {'n':>4} {'prec%':>6} {'recall%':>7}")
            for category, m in section["per_category"].items():
                out.write(f"{category:26} {m['positives']:4d} {_pct(m['precision']):>6} {_pct(m['recall']):>7}")
            out.write(
                f"{'any category':26} {'':4} {_pct(section['any']['precision']):>6} {_pct(section['any']['recall']):>7}"
            )
            out.write("benign false-positive rate (flagged in any category):")
            for kind, (rate, n) in section["benign_false_positive_rate"].items():
                out.write(f"  {kind:22} {_pct(rate)}%  of {n}")
        out.write("\n== what the default policy does (5-fold cross-validation scores) ==")
        out.write(f"{'group':22} {'blocked%':>8} {'warned%':>8} {'n':>4}")
        for kind, (blocked, warned, n) in report["cross_validated"]["default_policy"].items():
            out.write(f"{kind:22} {_pct(blocked):>8} {_pct(warned):>8} {n:4d}")
        injection = report["injection"]
        out.write(
            f"\n== prompt injection (data/injection_eval.csv, threshold {injection['threshold']}) ==\n"
            f"caught {_pct(injection['recall'])}% of {injection['attacks']} attacks; "
            f"false alarms on {_pct(injection['false_positive_rate'])}% of {injection['benign']} look-alike requests"
        )
        for text in injection["missed"]:
            out.write(f"  missed: {text}")
        for text in injection["false_alarms"]:
            out.write(f"  false alarm: {text}")
        streaming = report["streaming"]
        out.write(
            "\n== answers checked while they stream (default policy; harmful examples blocked on their own) ==\n"
            f"blocked on their own: {streaming['blocked_alone']} of {streaming['harmful']} harmful examples\n"
            f"of those, blocked behind a harmless lead: {_pct(streaming['after_lead'])}%; "
            f"split in two across two checks: {_pct(streaming['split'])}%\n"
            f"harmless examples blocked on their own: {_pct(streaming['harmless_blocked_alone'])}%; "
            f"behind a harmless lead: {_pct(streaming['harmless_blocked_after_lead'])}% "
            f"(of {streaming['harmless']})"
        )
        if not dry_run:
            out.write(f"\nsaved {WEIGHTS_PATH} ({WEIGHTS_PATH.stat().st_size} bytes)")
