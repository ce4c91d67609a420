import { readFileSync } from 'node:fs';
import { expect, it } from 'vitest';
import { GGML_RPC_VERSION } from '../src/index.js';

// The probe and the engine's HELLO state the version this constant holds; it must be the one the
// pinned upstream (fetched by the build) compiles into the addon.
it('GGML_RPC_VERSION is the pinned ggml-rpc.h RPC_PROTO_*_VERSION', () => {
  const text = readFileSync(new URL('../upstream/ggml/include/ggml-rpc.h', import.meta.url), 'utf8');
  const part = (name: string) =>
    Number(new RegExp(`#define RPC_PROTO_${name}_VERSION\\s+(\\d+)`).exec(text)?.[1]);
  expect({ major: part('MAJOR'), minor: part('MINOR'), patch: part('PATCH') }).toEqual(GGML_RPC_VERSION);
});
