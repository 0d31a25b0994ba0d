"""Verifying push deliveries: Standard Webhooks signatures (HMAC-SHA256).

A delivery carries three headers: ``webhook-id`` (the message id), ``webhook-timestamp`` (Unix
seconds) and ``webhook-signature`` (space-separated ``v1,<base64>`` signatures; several while a
secret is being rotated). The signed content is ``{id}.{timestamp}.{body}`` and the key is the
secret's bytes: a ``whsec_`` secret is base64 after the prefix, any other string is used as it is.

:func:`verify` checks that one of the signatures matches (in constant time) and that the timestamp
is within ``tolerance`` seconds of now, which bounds replays.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from typing import Mapping, Optional, Union

__all__ = ["InvalidSignature", "verify", "sign", "secret_key"]

#: How far (seconds) a delivery's timestamp may be from now, either way.
DEFAULT_TOLERANCE = 5 * 60


class InvalidSignature(Exception):
    """The delivery's signature or timestamp does not check out."""


def secret_key(secret: Union[str, bytes]) -> bytes:
    """The HMAC key of a secret: ``whsec_<base64>`` decoded, raw bytes or other text as is."""
    if isinstance(secret, bytes):
        return secret
    if secret.startswith("whsec_"):
        return base64.b64decode(secret[len("whsec_") :])
    return secret.encode()


def _as_bytes(body: Union[str, bytes]) -> bytes:
    return body.encode() if isinstance(body, str) else body


def sign(secret: Union[str, bytes], msg_id: str, timestamp: int, body: Union[str, bytes]) -> str:
    """The ``v1,<base64>`` signature of a delivery."""
    content = f"{msg_id}.{timestamp}.".encode() + _as_bytes(body)
    mac = hmac.new(secret_key(secret), content, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


def _header(headers: Mapping[str, str], name: str) -> str:
    for k, v in headers.items():
        if k.lower() == name:
            return v
    raise InvalidSignature(f"missing header {name}")


def verify(
    secret: Union[str, bytes],
    headers: Mapping[str, str],
    body: Union[str, bytes],
    *,
    tolerance: float = DEFAULT_TOLERANCE,
    now: Optional[float] = None,
) -> None:
    """Raise :class:`InvalidSignature` unless ``body`` with ``headers`` was signed with
    ``secret`` within ``tolerance`` seconds of ``now`` (default: the system clock). Pass the body
    exactly as received (bytes), before any JSON parsing."""
    msg_id = _header(headers, "webhook-id")
    raw_ts = _header(headers, "webhook-timestamp")
    signatures = _header(headers, "webhook-signature")
    try:
        timestamp = int(raw_ts)
    except ValueError:
        raise InvalidSignature(f"webhook-timestamp is not a number: {raw_ts!r}") from None
    current = time.time() if now is None else now
    if abs(current - timestamp) > tolerance:
        raise InvalidSignature("webhook-timestamp is too far from now")
    expected = sign(secret, msg_id, timestamp, body).split(",", 1)[1]
    for candidate in signatures.split():
        version, _, value = candidate.partition(",")
        if version == "v1" and hmac.compare_digest(value, expected):
            return
    raise InvalidSignature("no signature matches")
