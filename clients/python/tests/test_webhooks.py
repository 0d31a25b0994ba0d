"""The push-signature helper: the Standard Webhooks test vector, agreement with the
``standardwebhooks`` package in both directions, and the refusals."""

from __future__ import annotations

import base64
import json
import time

import pytest
import standardwebhooks

from sundial_client import InvalidSignature, verify_signature
from sundial_client.webhooks import sign

# The example from the Standard Webhooks specification.
SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
MSG_ID = "msg_p5jXN8AQM9LWM0D4loKWxJek"
TIMESTAMP = 1614265330
BODY = '{"test": 2432232314}'
SIGNATURE = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


def headers(sig=SIGNATURE, ts=TIMESTAMP, msg_id=MSG_ID):
    return {"webhook-id": msg_id, "webhook-timestamp": str(ts), "webhook-signature": sig}


def test_known_vector():
    assert sign(SECRET, MSG_ID, TIMESTAMP, BODY) == SIGNATURE
    verify_signature(SECRET, headers(), BODY.encode(), now=TIMESTAMP + 10)


def test_headers_are_case_insensitive_and_rotation_lists_are_read():
    h = {k.title(): v for k, v in headers(sig="v1,AAAA v2,zzz " + SIGNATURE).items()}
    verify_signature(SECRET, h, BODY, now=TIMESTAMP)


@pytest.mark.parametrize(
    "change",
    ["body", "id", "signature", "old", "future", "missing"],
)
def test_refusals(change):
    h, body, now = headers(), BODY, TIMESTAMP
    if change == "body":
        body = BODY.replace("2432232314", "2432232315")
    elif change == "id":
        h["webhook-id"] = "msg_other"
    elif change == "signature":
        h["webhook-signature"] = "v1," + base64.b64encode(b"x" * 32).decode()
    elif change == "old":
        now = TIMESTAMP + 301
    elif change == "future":
        now = TIMESTAMP - 301
    elif change == "missing":
        del h["webhook-signature"]
    with pytest.raises(InvalidSignature):
        verify_signature(SECRET, h, body, now=now)


def test_agrees_with_the_standardwebhooks_package():
    secret = "whsec_" + base64.b64encode(b"0123456789abcdef0123456789abcdef").decode()
    payload = json.dumps({"task": {"id": "t1", "kind": "k"}})
    now = int(time.time())
    theirs = standardwebhooks.Webhook(secret).sign("msg_1", standardwebhooks.webhooks.datetime.fromtimestamp(now, tz=standardwebhooks.webhooks.timezone.utc), payload)
    verify_signature(secret, headers(sig=theirs, ts=now, msg_id="msg_1"), payload)
    ours = sign(secret, "msg_2", now, payload)
    standardwebhooks.Webhook(secret).verify(payload, headers(sig=ours, ts=now, msg_id="msg_2"))


def test_a_real_push_delivery_verifies_with_the_helper(tmp_path):
    """The server's own signature, live: a task whose target is a sink on loopback (allowed by
    ``--push-allow``), the request the sink receives, checked with this client's helper; a
    tampered body and another secret are refused."""
    import queue as queue_mod
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    import httpx

    from conftest import Server

    received: "queue_mod.Queue" = queue_mod.Queue()

    class Sink(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (the http.server API)
            body = self.rfile.read(int(self.headers.get("content-length") or 0))
            received.put((dict(self.headers.items()), body))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args):
            pass

    sink = ThreadingHTTPServer(("127.0.0.1", 0), Sink)
    port = sink.server_address[1]
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    server = Server(tmp_path / "data", extra_args=["--push-allow", f"127.0.0.1:{port}"]).start()
    try:
        added = httpx.post(f"{server.url}/v1/push/secrets", json={}, timeout=10)
        assert added.status_code == 201, added.text
        secret = added.json()["secret"]
        with server.client() as c:
            task = c.create_task(
                "remind",
                payload={"invoice": 7, "text": "ü ✓"},
                target={"url": f"http://127.0.0.1:{port}/hook"},
            )
        headers, body = received.get(timeout=15)
        assert json.loads(body) == {"invoice": 7, "text": "ü ✓"}
        assert headers.get("webhook-id") == task.id
        verify_signature(secret, headers, body)
        with pytest.raises(InvalidSignature):
            verify_signature(secret, headers, body + b" ")
        other = "whsec_" + base64.b64encode(b"x" * 32).decode()
        with pytest.raises(InvalidSignature):
            verify_signature(other, headers, body)
    finally:
        server.stop()
        sink.shutdown()
