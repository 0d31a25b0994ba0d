"""Checks a push call's signature with the public `standardwebhooks` library.

Reads one JSON object on stdin: {"secret": "whsec_...", "headers": {...}, "body": "..."}.
Prints "ok" and exits 0 when the library accepts the call, prints the library's error and
exits 1 when it refuses it.
"""
import json
import sys

from standardwebhooks.webhooks import Webhook

case = json.load(sys.stdin)
try:
    Webhook(case["secret"]).verify(case["body"], case["headers"])
except Exception as e:  # the library raises WebhookVerificationError
    print(f"refused: {e}")
    sys.exit(1)
print("ok")
