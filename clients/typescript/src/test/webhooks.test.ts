// The push-signature helper: the Standard Webhooks test vector, agreement with the
// `standardwebhooks` package both ways, and the refusals.

import assert from "node:assert/strict";
import { test } from "node:test";

import { Webhook } from "standardwebhooks";

import { InvalidSignature, sign, verifySignature } from "../index.js";

// The example of the Standard Webhooks specification.
const SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const MSG_ID = "msg_p5jXN8AQM9LWM0D4loKWxJek";
const TS = 1614265330;
const BODY = '{"test": 2432232314}';
const SIGNATURE = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

const headers = (sig = SIGNATURE, ts = TS, id = MSG_ID): Record<string, string> => ({
  "webhook-id": id,
  "webhook-timestamp": String(ts),
  "webhook-signature": sig,
});

test("the known vector", async () => {
  assert.equal(await sign(SECRET, MSG_ID, TS, BODY), SIGNATURE);
  await verifySignature(SECRET, headers(), new TextEncoder().encode(BODY), { nowSeconds: TS + 10 });
  await verifySignature(SECRET, new Headers(headers(`v1,AAAA v2,zzz ${SIGNATURE}`)), BODY, { nowSeconds: TS });
});

for (const change of ["body", "id", "signature", "old", "future", "missing"]) {
  test(`refuses a changed ${change}`, async () => {
    const h = headers();
    let body = BODY;
    let now = TS;
    if (change === "body") body = BODY.replace("2432232314", "2432232315");
    if (change === "id") h["webhook-id"] = "msg_other";
    if (change === "signature") h["webhook-signature"] = "v1," + btoa("x".repeat(32));
    if (change === "old") now = TS + 301;
    if (change === "future") now = TS - 301;
    if (change === "missing") delete h["webhook-signature"];
    await assert.rejects(verifySignature(SECRET, h, body, { nowSeconds: now }), InvalidSignature);
  });
}

test("agrees with the standardwebhooks package", async () => {
  const secret = "whsec_" + btoa("0123456789abcdef0123456789abcdef");
  const payload = JSON.stringify({ task: { id: "t1", kind: "k" } });
  const now = Math.floor(Date.now() / 1000);
  const theirs = new Webhook(secret).sign("msg_1", new Date(now * 1000), payload);
  await verifySignature(secret, headers(theirs, now, "msg_1"), payload);
  const ours = await sign(secret, "msg_2", now, payload);
  new Webhook(secret).verify(payload, headers(ours, now, "msg_2"));
});

test("a real push delivery verifies with the helper, and a tampered body does not", async () => {
  const { createServer } = await import("node:http");
  const { Server } = await import("./server.js");
  const received: Array<{ headers: Record<string, string | string[] | undefined>; body: Buffer }> = [];
  const sink = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      received.push({ headers: req.headers, body: Buffer.concat(chunks) });
      res.writeHead(204).end();
    });
  });
  await new Promise<void>((r) => sink.listen(0, "127.0.0.1", () => r()));
  const address = sink.address();
  assert.ok(address && typeof address === "object");
  const port = address.port;
  const server = await new Server(["--push-allow", `127.0.0.1:${port}`]).start();
  try {
    const added = await fetch(`${server.url}/v1/push/secrets`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: "{}",
    });
    assert.equal(added.status, 201);
    const { secret } = (await added.json()) as { secret: string };
    const task = await server.client().createTask("remind", {
      payload: { invoice: 7, text: "ü ✓" },
      target: { url: `http://127.0.0.1:${port}/hook` },
    });
    const deadline = Date.now() + 15_000;
    while (received.length === 0) {
      if (Date.now() > deadline) throw new Error("the sink got no request");
      await new Promise((r) => setTimeout(r, 20));
    }
    const { headers, body } = received[0]!;
    assert.deepEqual(JSON.parse(body.toString("utf8")), { invoice: 7, text: "ü ✓" });
    assert.equal(headers["webhook-id"], task.id);
    await verifySignature(secret, headers, new Uint8Array(body));
    const tampered = new Uint8Array([...body, 0x20]);
    await assert.rejects(verifySignature(secret, headers, tampered), InvalidSignature);
    const other = "whsec_" + btoa("x".repeat(32));
    await assert.rejects(verifySignature(other, headers, new Uint8Array(body)), InvalidSignature);
  } finally {
    await server.dispose();
    sink.close();
  }
});
