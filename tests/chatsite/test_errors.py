"""Errors outside any view: a URL nothing serves and an unhandled exception, under the APIs and elsewhere."""

from __future__ import annotations

import pytest
from django.core.exceptions import SuspiciousOperation
from django.http import HttpResponse
from django.test import Client, override_settings
from django.urls import path

from chatsite import urls as site_urls


def test_an_api_url_nothing_serves_answers_in_the_openai_shape(client, alice):
    client.force_login(alice)
    for url in ("/api/conversations/not-a-number/", "/v1/no-such-endpoint"):
        response = client.get(url)
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "not_found"
        assert response.json()["error"]["type"] == "invalid_request_error"


def test_a_page_nothing_serves_is_the_sites_404_page(client):
    response = client.get("/no-such-page/")
    assert response.status_code == 404
    assert response["Content-Type"].startswith("text/html")
    page = response.content.decode()
    assert 'rel="icon"' in page and "favicon.svg" in page  # the site's icon, as on every other page
    assert 'href="/"' in page  # and a way back


def _boom(request):
    raise RuntimeError("boom")


def _suspicious(request):
    raise SuspiciousOperation("a request Django refuses")


def _echo(request):
    return HttpResponse(request.body)


# This module doubles as a URLconf: the site's URLs and handlers, plus views that always fail, and
# one that reads the body as any plain view may (Django refuses a body over the upload limit there).
urlpatterns = [
    path("api/boom/", _boom),
    path("boom/", _boom),
    path("api/suspicious/", _suspicious),
    path("api/echo/", _echo),
    path("echo/", _echo),
    *site_urls.urlpatterns,
]
handler400 = site_urls.handler400
handler404 = site_urls.handler404
handler500 = site_urls.handler500


@pytest.mark.django_db
@override_settings(ROOT_URLCONF=__name__)
def test_an_unhandled_error_under_the_api_answers_in_the_openai_shape():
    client = Client(raise_request_exception=False)
    response = client.get("/api/boom/")
    assert response.status_code == 500
    assert response.json()["error"]["code"] == "internal_error"
    assert "boom" not in response.content.decode()  # no internals leak
    assert client.get("/boom/")["Content-Type"].startswith("text/html")


@pytest.mark.django_db
@override_settings(ROOT_URLCONF=__name__, DATA_UPLOAD_MAX_MEMORY_SIZE=1000)
def test_a_request_django_refuses_under_the_api_answers_in_the_openai_shape():
    client = Client(raise_request_exception=False)
    too_large = client.post("/api/echo/", b"x" * 1001, content_type="application/octet-stream")
    assert too_large.status_code == 413
    assert too_large.json()["error"] == {
        "message": "The request body is too large.",
        "type": "invalid_request_error",
        "param": None,
        "code": "request_too_large",
    }
    suspicious = client.get("/api/suspicious/")
    assert suspicious.status_code == 400 and suspicious.json()["error"]["code"] == "bad_request"
    assert "refuses" not in suspicious.content.decode()
    page = client.post("/echo/", b"x" * 1001, content_type="application/octet-stream")
    assert page.status_code == 400 and page["Content-Type"].startswith("text/html")
