// The real `sundial` binary for the tests: `SUNDIAL_BIN`, else target/release/sundial of this
// repository, started on a free loopback port with its own data directory.

import { spawn, type ChildProcess } from "node:child_process";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, isAbsolute, join, resolve } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";

import { SundialClient } from "../index.js";

export const REPO = resolve(dirname(fileURLToPath(import.meta.url)), "../../../..");

export function binary(): string {
  const given = process.env.SUNDIAL_BIN;
  // A relative SUNDIAL_BIN is taken from the current directory, else from the repository root.
  const path = !given
    ? join(REPO, "target/release/sundial")
    : isAbsolute(given) || existsSync(resolve(given))
      ? resolve(given)
      : join(REPO, given);
  if (!existsSync(path)) {
    throw new Error(
      `no sundial binary at ${path}: build it (cargo build --release -p sundial-cli) or point SUNDIAL_BIN at one (for example target/debug/sundial)`,
    );
  }
  return path;
}

export class Server {
  readonly dataDir = mkdtempSync(join(tmpdir(), "sundial-ts-"));
  proc: ChildProcess | null = null;
  port = 0;
  url = "";
  readonly log: string[] = [];

  /** `extraArgs` go to `sundial server` after the defaults (e.g. `--push-allow`). */
  constructor(readonly extraArgs: string[] = []) {}

  async start(): Promise<this> {
    const deadline = Date.now() + 20_000;
    for (;;) {
      const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith("SUNDIAL_")));
      const proc = spawn(
        binary(),
        [
          "server",
          "--data-dir",
          this.dataDir,
          "--listen",
          `127.0.0.1:${this.port}`,
          "--shutdown-grace",
          "1s",
          ...this.extraArgs,
        ],
        { env: { RUST_LOG: "warn", ...env }, stdio: ["ignore", "pipe", "pipe"] },
      );
      this.proc = proc;
      proc.stderr!.on("data", (d) => this.log.push(String(d)));
      const line = await new Promise<string | null>((resolveLine) => {
        const rl = createInterface({ input: proc.stdout! });
        rl.on("line", (l) => {
          this.log.push(l);
          if (l.startsWith("sundial listening on ")) resolveLine(l);
        });
        proc.on("exit", () => resolveLine(null));
      });
      if (line) {
        this.url = line.trim().split(" ").at(-1)!;
        this.port = Number(this.url.split(":").at(-1));
        return this;
      }
      if (Date.now() > deadline) throw new Error(`sundial did not start:\n${this.log.slice(-30).join("\n")}`);
      await new Promise((r) => setTimeout(r, 200)); // a restart's port may be held for a moment
    }
  }

  async stop(signal: NodeJS.Signals = "SIGTERM"): Promise<void> {
    const proc = this.proc;
    this.proc = null;
    if (!proc || proc.exitCode !== null || proc.signalCode !== null) return;
    await new Promise<void>((r) => {
      proc.once("exit", () => r());
      proc.kill(signal);
    });
  }

  async restart(signal: NodeJS.Signals = "SIGKILL"): Promise<void> {
    await this.stop(signal);
    await this.start();
  }

  async dispose(): Promise<void> {
    await this.stop();
    rmSync(this.dataDir, { recursive: true, force: true });
  }

  client(): SundialClient {
    return new SundialClient({ url: this.url });
  }
}

export async function waitFor<T>(fn: () => Promise<T | false | null | undefined>, timeoutMs = 15_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

export function uniqueQueue(): string {
  return `q-${Math.random().toString(16).slice(2, 14)}`;
}

export const finished = (state: string) => ["succeeded", "dead", "cancelled"].includes(state);
