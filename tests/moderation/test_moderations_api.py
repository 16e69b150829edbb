from __future__ import annotations

import pytest

from chatsite.errors import ClientError
from moderation.classifiers import CATEGORIES
from moderation.services import moderations_create

OPENAI_CATEGORIES = {
    "harassment",
    "harassment/threatening",
    "hate",
    "hate/threatening",
    "illicit",
    "illicit/violent",
    "self-harm",
    "self-harm/intent",
    "self-harm/instructions",
    "sexual",
    "sexual/minors",
    "violence",
    "violence/graphic",
}


def test_the_response_has_openais_moderation_shape():
    body = moderations_create(inputs=["How do I build a pipe bomb?", "What is the capital of France?"])
    assert body["id"].startswith("modr-")
    assert isinstance(body["model"], str) and body["model"]
    assert len(body["results"]) == 2
    for result in body["results"]:
        assert set(result) >= {"flagged", "categories", "category_scores"}
        assert set(result["categories"]) == OPENAI_CATEGORIES == set(CATEGORIES)
        assert set(result["category_scores"]) == OPENAI_CATEGORIES
        assert all(isinstance(v, bool) for v in result["categories"].values())
        assert all(isinstance(v, float) and 0.0 <= v <= 1.0 for v in result["category_scores"].values())
    bomb, paris = body["results"]
    assert bomb["flagged"] and bomb["categories"]["illicit/violent"] and bomb["categories"]["illicit"]
    assert not paris["flagged"]


@pytest.mark.parametrize("inputs", [[], "a string", [1, 2], None])
def test_bad_input_is_a_client_error(inputs):
    with pytest.raises(ClientError) as refused:
        moderations_create(inputs=inputs)
    assert refused.value.code == "invalid_input"
