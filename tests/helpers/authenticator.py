"""A software WebAuthn authenticator for the passkey tests that run without a browser: it answers
the service's options as a platform authenticator would (P-256 keys, "none" attestation, user
present and verified), so the service's checks (py_webauthn's) run on real signatures."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import struct
from dataclasses import dataclass, field

import cbor2
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

ORIGIN = "http://testserver"
UP_UV = 0x01 | 0x04
ATTESTED = 0x40


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def unb64url(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@dataclass
class Credential:
    id: bytes
    key: ec.EllipticCurvePrivateKey
    rp_id: str
    user_handle: bytes
    sign_count: int = 0


@dataclass
class SoftAuthenticator:
    credentials: list[Credential] = field(default_factory=list)

    def create(self, options: dict, *, origin: str = ORIGIN, challenge: str | None = None) -> dict:
        rp_id = options["rp"]["id"]
        credential = Credential(
            os.urandom(32), ec.generate_private_key(ec.SECP256R1()), rp_id, unb64url(options["user"]["id"])
        )
        self.credentials.append(credential)
        numbers = credential.key.public_key().public_numbers()
        cose = {1: 2, 3: -7, -1: 1, -2: numbers.x.to_bytes(32, "big"), -3: numbers.y.to_bytes(32, "big")}
        attested = bytes(16) + struct.pack(">H", len(credential.id)) + credential.id + cbor2.dumps(cose)
        auth_data = (
            hashlib.sha256(rp_id.encode()).digest() + bytes([UP_UV | ATTESTED]) + struct.pack(">I", 0) + attested
        )
        client_data = self._client_data("webauthn.create", challenge or options["challenge"], origin)
        return {
            "id": b64url(credential.id),
            "rawId": b64url(credential.id),
            "type": "public-key",
            "response": {
                "clientDataJSON": b64url(client_data),
                "attestationObject": b64url(cbor2.dumps({"fmt": "none", "attStmt": {}, "authData": auth_data})),
                "transports": ["internal"],
            },
            "clientExtensionResults": {},
        }

    def get(self, options: dict, *, origin: str = ORIGIN, credential: Credential | None = None) -> dict:
        credential = credential or self.credentials[-1]
        credential.sign_count += 1
        auth_data = (
            hashlib.sha256(credential.rp_id.encode()).digest()
            + bytes([UP_UV])
            + struct.pack(">I", credential.sign_count)
        )
        client_data = self._client_data("webauthn.get", options["challenge"], origin)
        signature = credential.key.sign(auth_data + hashlib.sha256(client_data).digest(), ec.ECDSA(hashes.SHA256()))
        return {
            "id": b64url(credential.id),
            "rawId": b64url(credential.id),
            "type": "public-key",
            "response": {
                "clientDataJSON": b64url(client_data),
                "authenticatorData": b64url(auth_data),
                "signature": b64url(signature),
                "userHandle": b64url(credential.user_handle),
            },
            "clientExtensionResults": {},
        }

    @staticmethod
    def _client_data(kind: str, challenge: str, origin: str) -> bytes:
        return json.dumps({"type": kind, "challenge": challenge, "origin": origin, "crossOrigin": False}).encode()
