/**
 * Verifying push deliveries: Standard Webhooks signatures (HMAC-SHA256), with the platform's
 * Web Crypto (`crypto.subtle`), so it runs in Node.js 20+, Deno, Bun and workers alike.
 *
 * A delivery carries `webhook-id`, `webhook-timestamp` (Unix seconds) and `webhook-signature`
 * (space-separated `v1,<base64>`; several while a secret is rotated). The signed content is
 * `{id}.{timestamp}.{body}`; the key is the secret's bytes (a `whsec_` secret is base64 after the
 * prefix, any other string is used as its UTF-8 bytes).
 */

/** The delivery's signature or timestamp does not check out. */
export class InvalidSignature extends Error {
  override name = "InvalidSignature";
}

/** How far (seconds) a delivery's timestamp may be from now, either way. */
export const DEFAULT_TOLERANCE_SECONDS = 5 * 60;

const enc = new TextEncoder();

function secretKey(secret: string | Uint8Array): Uint8Array<ArrayBuffer> {
  if (typeof secret !== "string") return new Uint8Array(secret);
  if (secret.startsWith("whsec_")) return Uint8Array.from(atob(secret.slice(6)), (c) => c.charCodeAt(0));
  return enc.encode(secret);
}

function toBase64(bytes: ArrayBuffer): string {
  let s = "";
  for (const b of new Uint8Array(bytes)) s += String.fromCharCode(b);
  return btoa(s);
}

function bytesOf(body: string | Uint8Array): Uint8Array {
  return typeof body === "string" ? enc.encode(body) : body;
}

/** The `v1,<base64>` signature of a delivery. */
export async function sign(
  secret: string | Uint8Array,
  msgId: string,
  timestamp: number,
  body: string | Uint8Array,
): Promise<string> {
  const key = await crypto.subtle.importKey("raw", secretKey(secret), { name: "HMAC", hash: "SHA-256" }, false, ["sign"]);
  const prefix = enc.encode(`${msgId}.${timestamp}.`);
  const b = bytesOf(body);
  const content = new Uint8Array(prefix.length + b.length);
  content.set(prefix);
  content.set(b, prefix.length);
  return "v1," + toBase64(await crypto.subtle.sign("HMAC", key, content));
}

function header(headers: Headers | Record<string, string | string[] | undefined>, name: string): string {
  let v: string | string[] | null | undefined;
  if (typeof (headers as Headers).get === "function") v = (headers as Headers).get(name);
  else {
    const entry = Object.entries(headers).find(([k]) => k.toLowerCase() === name);
    v = entry?.[1];
  }
  if (Array.isArray(v)) v = v.join(" ");
  if (v == null) throw new InvalidSignature(`missing header ${name}`);
  return v;
}

function equal(a: string, b: string): boolean {
  if (a.length !== b.length) return false;
  let diff = 0;
  for (let i = 0; i < a.length; i++) diff |= a.charCodeAt(i) ^ b.charCodeAt(i);
  return diff === 0;
}

/**
 * Throws {@link InvalidSignature} unless `body` with `headers` was signed with `secret` within
 * `toleranceSeconds` of `nowSeconds` (default: the system clock). Pass the body exactly as
 * received, before any JSON parsing. `headers` may be a `Headers` or Node's `IncomingHttpHeaders`.
 */
export async function verifySignature(
  secret: string | Uint8Array,
  headers: Headers | Record<string, string | string[] | undefined>,
  body: string | Uint8Array,
  options: { toleranceSeconds?: number; nowSeconds?: number } = {},
): Promise<void> {
  const msgId = header(headers, "webhook-id");
  const rawTs = header(headers, "webhook-timestamp");
  const signatures = header(headers, "webhook-signature");
  const timestamp = Number(rawTs);
  if (!/^\d+$/.test(rawTs) || !Number.isSafeInteger(timestamp)) {
    throw new InvalidSignature(`webhook-timestamp is not a number: ${JSON.stringify(rawTs)}`);
  }
  const now = options.nowSeconds ?? Date.now() / 1000;
  if (Math.abs(now - timestamp) > (options.toleranceSeconds ?? DEFAULT_TOLERANCE_SECONDS)) {
    throw new InvalidSignature("webhook-timestamp is too far from now");
  }
  const expected = (await sign(secret, msgId, timestamp, body)).slice(3);
  for (const candidate of signatures.split(/\s+/)) {
    const [version, value] = [candidate.slice(0, candidate.indexOf(",")), candidate.slice(candidate.indexOf(",") + 1)];
    if (version === "v1" && equal(value, expected)) return;
  }
  throw new InvalidSignature("no signature matches");
}
