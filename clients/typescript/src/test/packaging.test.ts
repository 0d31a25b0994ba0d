// The package is ready to publish: metadata complete, the version in step, no runtime dependency.

import assert from "node:assert/strict";
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";

import { VERSION } from "../index.js";
import { REPO } from "./server.js";

const dir = join(REPO, "clients/typescript");
const pkg = JSON.parse(readFileSync(join(dir, "package.json"), "utf8"));

test("package metadata", () => {
  assert.equal(pkg.name, "sundial-client");
  assert.equal(pkg.version, VERSION);
  assert.equal(pkg.license, "Apache-2.0");
  assert.equal(pkg.type, "module");
  assert.equal(pkg.exports["."].types, "./dist/index.d.ts");
  assert.equal(pkg.dependencies, undefined, "no runtime dependencies");
  assert.ok(existsSync(join(dir, "README.md")));
  assert.ok(existsSync(join(dir, "LICENSE")));
  assert.ok(existsSync(join(dir, "package-lock.json")));
});
