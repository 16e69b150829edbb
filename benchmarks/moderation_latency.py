"""What input moderation costs a message: the classifiers' time per text, warm, in this process.

Scores a spread of prompts (short and long, benign and harmful) one at a time, the way
`message_send` does, and prints p50/p99 for the whole check (embedding, profanity model, rules,
prompt-injection similarity) and for its parts, then one line
  RESULT input_moderation_p50_ms=<x> input_moderation_p99_ms=<y>

It also times the whole check while another thread of the process runs Python, as the web
process's database thread does while a message is scored beside its send transaction: a check
that needs the GIL back often waits for the interpreter's switch interval each time.

Then output moderation: what an answer's checks cost per streamed token, in CPU (every thread of
the process): `OutputMonitor` fed a prose answer a word at a time under the built-in policy, one
stream alone and eight on one loop, whose sentences share the batched scorer's passes, as a
worker's streams do.
  RESULT ... output_moderation_ms_per_token=<alone> output_moderation_ms_per_token_8=<eight>

Run with `make benchmark-moderation` (or `python -m benchmarks moderation`).
Nothing else should be using the CPU: the figure is the classifier's, not the machine's load.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import threading
import time
from contextlib import contextmanager

from benchmarks.harness import django_setup, result

ROUNDS = 5


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def timed(function, texts: list[str]) -> list[float]:
    timings = []
    for _ in range(ROUNDS):
        for text in texts:
            started = time.perf_counter()
            function(text)
            timings.append((time.perf_counter() - started) * 1000)
    return timings


@contextmanager
def python_running_beside():
    """Another thread running pure Python (holding the GIL whenever it can) until the block ends."""
    stop = threading.Event()

    def spin() -> None:
        total = 0
        while not stop.is_set():
            for i in range(1000):
                total += i

    thread = threading.Thread(target=spin, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def run(args: argparse.Namespace) -> None:
    django_setup()
    from moderation.classifiers import embedder, profanity, score_text, warm_up
    from moderation.training import load_examples

    started = time.perf_counter()
    warm_up()
    print(f"classifiers loaded in {time.perf_counter() - started:.1f} s")
    texts = [example.text for example in load_examples()][::5]
    texts.append(" ".join(texts[:12]))  # one long message, scored in windows
    lengths = [len(text) for text in texts]
    print(f"{len(texts)} texts, {min(lengths)}–{max(lengths)} characters (median {statistics.median(lengths):.0f})")

    rows = [
        ("whole check", timed(lambda text: score_text(text, injection=True), texts)),
        ("embedding", timed(lambda text: embedder.embed([text]), texts)),
        ("profanity", timed(lambda text: profanity([text]), texts)),
    ]
    with python_running_beside():
        rows.append(("beside Python", timed(lambda text: score_text(text, injection=True), texts)))
    print(f"{'':13} {'p50 ms':>7} {'p99 ms':>7}")
    for name, timings in rows:
        print(f"{name:13} {statistics.median(timings):7.2f} {percentile(timings, 0.99):7.2f}")
    whole = rows[0][1]
    per_token = {streams: asyncio.run(output_cpu_per_token(streams)) for streams in (1, 8)}
    for streams, figures in per_token.items():
        print(f"output, {streams} stream(s): " + " ".join(f"{f:.3f}" for f in figures) + " ms of CPU a token")
    result(
        input_moderation_p50_ms=round(statistics.median(whole), 2),
        input_moderation_p99_ms=round(percentile(whole, 0.99), 2),
        output_moderation_ms_per_token=round(statistics.median(per_token[1]), 3),
        output_moderation_ms_per_token_8=round(statistics.median(per_token[8]), 3),
    )


ANSWER = (
    "The water cycle moves water between the land, the sea and the sky. Heat from the sun evaporates water "
    "from oceans and lakes, and plants release vapour from their leaves. As the warm, moist air rises it "
    "cools, and the vapour condenses into the droplets that form clouds. When the droplets grow heavy enough "
    "they fall as rain, snow or hail. Some of that water runs off into rivers, some soaks into the ground and "
    "refills aquifers, and some is taken up by plants again. Over time the same water travels this loop many "
    "times, which is why fresh water keeps being renewed even though its total amount barely changes. "
) * 2


async def output_cpu_per_token(streams: int) -> list[float]:
    """CPU seconds of the process per token fed, in ms, over three rounds of `streams` answers at once."""
    from moderation.selectors import policy_built_in
    from moderation.services import OutputMonitor

    words = [word + " " for word in ANSWER.split(" ")]

    async def answer() -> None:
        monitor = OutputMonitor(policy_built_in())
        for i, word in enumerate(words):
            await monitor.feed(word, final=i == len(words) - 1)

    await answer()  # untimed: the scorer's first pass on this loop
    figures = []
    for _ in range(3):
        started = time.process_time()
        await asyncio.gather(*(answer() for _ in range(streams)))
        figures.append((time.process_time() - started) * 1000 / (streams * len(words)))
    return figures
