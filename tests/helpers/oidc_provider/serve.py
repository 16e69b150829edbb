"""Start the test identity provider: `python -m tests.helpers.oidc_provider.serve PORT CLIENT_ID
CLIENT_SECRET REDIRECT_URI...`, with OIDC_TEST_DATABASE and OIDC_TEST_PEOPLE set. Prints "ready"
once it serves."""

from __future__ import annotations

import os
import sys
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _Quiet(WSGIRequestHandler):
    def log_message(self, format, *args):
        pass


def main() -> None:
    port, client_id, client_secret, *redirect_uris = sys.argv[1:]
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    os.environ["OIDC_TEST_RSA_KEY"] = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.helpers.oidc_provider.settings"
    import django

    django.setup()
    from django.core.management import call_command
    from django.core.wsgi import get_wsgi_application
    from oauth2_provider.models import Application

    call_command("migrate", verbosity=0)
    Application.objects.create(
        name="chat",
        client_id=client_id,
        client_secret=client_secret,
        client_type=Application.CLIENT_CONFIDENTIAL,
        authorization_grant_type=Application.GRANT_AUTHORIZATION_CODE,
        redirect_uris=" ".join(redirect_uris),
        algorithm=Application.RS256_ALGORITHM,
        skip_authorization=True,
    )
    server = make_server("127.0.0.1", int(port), get_wsgi_application(), server_class=_Server, handler_class=_Quiet)
    print("ready", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
