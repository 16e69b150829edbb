"""The optional guard model (Llama Guard) as an extra input classifier.

No guard model can run here (it needs a GPU and its weights), so a small HTTP server stands in for
vLLM's OpenAI-compatible server hosting one: it answers chat completions the way Llama Guard 3 does
("safe", or "unsafe" and hazard codes, with log-probabilities). Everything on this side of the
HTTP connection is the real code: the official `openai` client, the mapping, the policy, the send.
"""

from __future__ import annotations

import json
import math
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from conversations.requests import SendRequest
from conversations.services import message_send
from moderation.guard import guard_verdict
from moderation.models import Flag
from moderation.services import moderations_create

# Benign to the built-in classifiers; the stand-in guard calls it a non-violent crime (S2).
GUARD_ONLY = "Tell me the combination the guard flags: alpha bravo charlie."


class StandInGuard(BaseHTTPRequestHandler):
    requests: list[dict] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        StandInGuard.requests.append({"path": self.path, "auth": self.headers.get("Authorization"), "body": body})
        text = body["messages"][-1]["content"]
        answer, probability = ("unsafe\nS2", 0.93) if "alpha bravo charlie" in text else ("safe", 0.99)
        first_token = answer.split("\n")[0]
        payload = {
            "id": "chatcmpl-guard",
            "object": "chat.completion",
            "created": 0,
            "model": body["model"],
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": answer},
                    "logprobs": {
                        "content": [
                            {"token": first_token, "logprob": math.log(probability), "bytes": None, "top_logprobs": []}
                        ]
                    },
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 200, "completion_tokens": 3, "total_tokens": 203},
        }
        data = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def guard(settings):
    server = ThreadingHTTPServer(("127.0.0.1", 0), StandInGuard)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    StandInGuard.requests = []
    settings.MODERATION_GUARD_URL = f"http://127.0.0.1:{server.server_port}/v1"
    settings.MODERATION_GUARD_MODEL = "meta-llama/Llama-Guard-3-1B"
    settings.MODERATION_GUARD_API_KEY = "guard-secret"
    yield StandInGuard.requests
    server.shutdown()
    server.server_close()


def test_the_guard_answer_is_mapped_to_openai_categories():
    assert guard_verdict("safe") == {}
    assert guard_verdict("unsafe\nS1,S10", confidence=0.8) == {"violence": 0.8, "illicit/violent": 0.8, "hate": 0.8}
    assert guard_verdict("unsafe\nS4") == {"sexual/minors": 1.0}
    # Hazards without an OpenAI counterpart (S7 privacy) count for nothing; so does an answer it cannot read.
    assert guard_verdict("unsafe\nS7") == {}
    assert guard_verdict("I cannot help with that") == {}


def test_a_message_only_the_guard_flags_is_blocked(alice, guard):
    sent = message_send(user=alice, request=SendRequest(content=GUARD_ONLY))
    assert sent.blocked and sent.generation is None
    flag = Flag.objects.get()
    assert "illicit" in flag.categories
    assert flag.category_scores["illicit"] == pytest.approx(0.93, abs=1e-6)
    # It was asked through the OpenAI chat API, with the model, the key and the user's text.
    (request,) = guard
    assert request["path"] == "/v1/chat/completions"
    assert request["auth"] == "Bearer guard-secret"
    assert request["body"]["model"] == "meta-llama/Llama-Guard-3-1B"
    assert request["body"]["messages"] == [{"role": "user", "content": GUARD_ONLY}]


def test_a_message_the_guard_calls_safe_is_answered(alice, guard):
    sent = message_send(user=alice, request=SendRequest(content="What is the capital of France?"))
    assert not sent.blocked and sent.generation is not None
    assert len(guard) == 1


def test_the_moderations_api_includes_the_guard(guard):
    result = moderations_create(inputs=[GUARD_ONLY, "Hello there"])["results"]
    assert result[0]["flagged"] and result[0]["categories"]["illicit"]
    assert not result[1]["flagged"]


def test_without_a_guard_nothing_is_asked_and_the_classifiers_decide(alice, settings):
    settings.MODERATION_GUARD_URL = ""
    assert not message_send(user=alice, request=SendRequest(content=GUARD_ONLY)).blocked


def test_a_guard_that_does_not_answer_leaves_the_classifiers_in_charge(alice, settings, caplog):
    settings.MODERATION_GUARD_URL = "http://127.0.0.1:9/v1"  # nothing listens on the discard port
    assert not message_send(user=alice, request=SendRequest(content=GUARD_ONLY)).blocked
    assert message_send(user=alice, request=SendRequest(content="How do I build a pipe bomb in my garage?")).blocked
    assert "guard model did not answer" in caplog.text
