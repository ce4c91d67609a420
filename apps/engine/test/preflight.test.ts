import { readFileSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { type EngineProcess, engineGroup, rssBytes } from '@hydra-engine/test-kit';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { tinyModel, waitFor } from './helpers.js';

// Hostile GGUF metadata must be refused by code, not abort the process (-m, CONFIGURE and
// /control/load_model alike); CONFIGURE {"n_ctx": 2e9} must not grow RSS (it once reached
// 8.8 GiB); a failed context rebuild must leave the previous context; a deferred load that fails
// must be reported. The engines here are processes of their own: an abort must fail a test, not
// the runner.

const engines = engineGroup();

function spawnEngine(flags: string[], wantReady = true): Promise<EngineProcess> {
  // A failed start-up load exits unless asked to stay up (the cases that expect 'error' do).
  return engines.start(['-t', '1', ...(wantReady ? [] : ['--keep-up-on-load-failure']), ...flags], {
    untilError: !wantReady,
  });
}

/** Writes `name` beside `tiny`: its bytes with `patch` applied. */
function hostile(tiny: string, name: string, patch: (b: Buffer) => void): string {
  const b = Buffer.from(readFileSync(tiny));
  patch(b);
  const out = join(dirname(tiny), name);
  writeFileSync(out, b);
  return out;
}

/** The offset of a metadata value of type u32 (the tiny model's block_count, embedding_length). */
function kvU32At(b: Buffer, key: string): number {
  const k = Buffer.from(key);
  const i = b.indexOf(k);
  if (i < 0 || b.readUInt32LE(i + k.length) !== 4) throw new Error(`${key} is not a u32 in the file`);
  return i + k.length + 4;
}

/** The offsets of a tensor's ne[] and data offset in the tensor table. */
function tensorAt(b: Buffer, name: string): { ne: number; offset: number } {
  const k = Buffer.from(name);
  const i = b.indexOf(k);
  const nDims = b.readUInt32LE(i + k.length);
  const ne = i + k.length + 4;
  return { ne, offset: ne + 8 * nDims + 4 };
}

async function post(url: string, path: string, body: unknown) {
  const t0 = performance.now();
  const res = await fetch(`${url}${path}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body),
  });
  const json = (await res.json()) as {
    success?: boolean;
    error?: { code: string; keys?: string[] };
    [k: string]: unknown;
  };
  return { status: res.status, json, ms: performance.now() - t0 };
}

async function greedy(url: string): Promise<{ status: number; text: string }> {
  const res = await fetch(`${url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ prompt: 'Hello world', max_tokens: 8, temperature: 0, ignore_eos: true }),
  });
  const body = (await res.json()) as { choices?: { text: string }[] };
  return { status: res.status, text: body.choices?.[0]?.text ?? '' };
}

async function status(url: string): Promise<Record<string, any>> {
  return (await fetch(`${url}/control/status`).then((r) => r.json())) as Record<string, any>;
}

describe('GGUF checks, bounds before allocation and atomic rebuilds', () => {
  let tiny: string;
  const bad: Record<string, { path: string; code: string }> = {};
  let badNrot: string;
  beforeAll(async () => {
    tiny = await tinyModel();
    bad.blocks0 = {
      path: hostile(tiny, 'blocks0.gguf', (b) => b.writeUInt32LE(0, kvU32At(b, 'llama.block_count'))),
      code: 'HYDRA_ERR_MODEL_METADATA',
    };
    bad.blocks1e9 = {
      path: hostile(tiny, 'blocks1e9.gguf', (b) => b.writeUInt32LE(1e9, kvU32At(b, 'llama.block_count'))),
      code: 'HYDRA_ERR_MODEL_METADATA',
    };
    bad.dims = {
      // blk.0.attn_q.weight as 256 x 2^40: its data would run far past the end of the file.
      path: hostile(tiny, 'dims.gguf', (b) =>
        b.writeBigUInt64LE(1n << 40n, tensorAt(b, 'blk.0.attn_q.weight').ne + 8),
      ),
      code: 'HYDRA_ERR_GGUF_INVALID',
    };
    bad.offset = {
      path: hostile(tiny, 'offset.gguf', (b) =>
        b.writeBigUInt64LE(1n << 40n, tensorAt(b, 'output.weight').offset),
      ),
      code: 'HYDRA_ERR_GGUF_INVALID',
    };
    // Passes every check before load, then llama.cpp refuses it by throwing ("invalid n_rot").
    badNrot = hostile(tiny, 'nrot.gguf', (b) =>
      b.writeUInt32LE(1 << 20, kvU32At(b, 'llama.embedding_length')),
    );
  }, 60_000);
  afterAll(() => engines.stopAll());

  it('-m with a hostile GGUF is refused with a code; the engine stays up with no model', async () => {
    for (const [name, b] of Object.entries(bad)) {
      const e = await spawnEngine(['-m', b.path], false);
      expect(e.log(), name).toContain(b.code);
      const h = await fetch(`${e.url}/health`);
      expect(h.status, name).toBe(503);
      expect(e.child.exitCode, name).toBeNull();
      await e.stop();
    }
  }, 120_000);

  it('CONFIGURE and /control/load_model refuse hostile GGUFs with codes; the old model keeps serving', async () => {
    const e = await spawnEngine(['-m', tiny, '-c', '512']);
    const before = await greedy(e.url);
    expect(before.status).toBe(200);
    for (const [name, b] of Object.entries(bad)) {
      const r = await post(e.url, '/control/configure', { model: b.path });
      expect([name, r.json.error?.code], JSON.stringify(r.json)).toEqual([name, b.code]);
      expect(r.status).toBe(400);
    }
    // load_model reads the tensor table for its reply: the block-count check comes before it.
    const lm = await post(e.url, '/control/load_model', { model: bad.blocks1e9!.path });
    expect(lm.json.error).toMatchObject({ code: 'HYDRA_ERR_MODEL_METADATA', keys: ['llama.block_count'] });
    expect(lm.ms).toBeLessThan(2000);
    // keep_layer_range is refused by name before the file is read at all.
    const kept = await post(e.url, '/control/load_model', {
      model: bad.blocks1e9!.path,
      keep_layer_range: { lo: 0, hi: 1 },
    });
    expect(kept.json.error).toMatchObject({
      code: 'HYDRA_ERR_UNSUPPORTED_FIELD',
      keys: ['keep_layer_range'],
    });
    expect(await greedy(e.url)).toEqual(before);
    const st = await status(e.url);
    expect(st).toMatchObject({ state: 'ready', model: { path: tiny } });
    expect(e.child.exitCode).toBeNull();
  }, 120_000);

  it('CONFIGURE n_ctx 2e9 is refused before any allocation: RSS stays, the configuration is untouched', async () => {
    const e = await spawnEngine(['-m', tiny, '-c', '512']);
    const before = await greedy(e.url);
    const epoch = (await status(e.url)).epoch;
    const rss0 = rssBytes(e.child.pid!);
    const r = await post(e.url, '/control/configure', { n_ctx: 2_000_000_000 });
    const rss1 = rssBytes(e.child.pid!);
    console.log(
      `n_ctx 2e9: refused in ${r.ms.toFixed(1)} ms, RSS ${(rss0 / 2 ** 20).toFixed(0)} -> ${(rss1 / 2 ** 20).toFixed(0)} MiB`,
    );
    expect(r.json.error?.code).toBe('HYDRA_ERR_INSUFFICIENT_MEMORY');
    expect(r.json.error?.keys).toContain('n_ctx');
    expect(rss1 - rss0).toBeLessThan(64 * 2 ** 20);
    // With a model change too (a T3): checked against the devices' whole memory before the unload.
    const other = hostile(tiny, 'copy.gguf', () => undefined);
    const t3 = await post(e.url, '/control/configure', { model: other, n_ctx: 2_000_000_000 });
    expect(t3.json.error?.code).toBe('HYDRA_ERR_INSUFFICIENT_MEMORY');
    expect(rssBytes(e.child.pid!) - rss0).toBeLessThan(64 * 2 ** 20);
    // n_parallel past llama.cpp's 256 sequences.
    const np = await post(e.url, '/control/configure', { n_parallel: 300 });
    expect(np.json.error).toMatchObject({ code: 'HYDRA_ERR_BAD_VALUE', keys: ['n_parallel'] });
    const st = await status(e.url);
    expect(st.epoch).toBe(epoch);
    expect(st.applied.n_ctx).toBe(512);
    expect(st.slots.n_ctx_seq).toBe(512);
    expect(await greedy(e.url)).toEqual(before);
    // n_cpu_moe is size-like too (one override per layer): 2e9 reloads like any value past the
    // model's blocks instead of building 2e9 strings.
    const moe = await post(e.url, '/control/configure', { n_cpu_moe: 2_000_000_000 });
    expect(moe.json.success, JSON.stringify(moe.json)).toBe(true);
    expect(await greedy(e.url)).toEqual(before);
    expect(rssBytes(e.child.pid!) - rss0).toBeLessThan(64 * 2 ** 20);
    // And at startup: -c 2e9 never reaches llama.cpp.
    const s = await spawnEngine(['-m', tiny, '-c', '2000000000'], false);
    expect(s.log()).toContain('HYDRA_ERR_INSUFFICIENT_MEMORY');
    expect(rssBytes(s.child.pid!)).toBeLessThan(512 * 2 ** 20);
  }, 120_000);

  it('a context rebuild llama.cpp refuses restores the previous context: completions, /health and STATUS stay true', async () => {
    const e = await spawnEngine(['-m', tiny, '-c', '512']);
    const before = await greedy(e.url);
    const epoch = (await status(e.url)).epoch;
    // The planner accepts it; llama.cpp refuses a quantized V cache without flash attention.
    const r = await post(e.url, '/control/configure', { cache_type_v: 'q8_0', flash_attn: 'off' });
    expect(r.json.success).toBe(false);
    expect(r.json.error?.code).toBe('HYDRA_ERR_CONTEXT_FAILED');
    expect(await greedy(e.url)).toEqual(before);
    const h = await fetch(`${e.url}/health`);
    expect(h.status).toBe(200);
    expect(((await h.json()) as { status: string }).status).toBe('ok');
    const st = await status(e.url);
    expect(st.state).toBe('ready');
    expect(st.epoch).toBe(epoch);
    expect(st.applied.cache_type_v ?? 'f16').toBe('f16');
    expect(st.applied.flash_attn ?? 'auto').toBe('auto');
    expect(st.last_rebuild_failure).toMatchObject({
      rebuild: 'context',
      code: 'HYDRA_ERR_CONTEXT_FAILED',
      deferred: false,
      restored: true,
    });
    expect(st.last_rebuild_failure.keys).toEqual(expect.arrayContaining(['cache_type_v', 'flash_attn']));
    const metrics = await fetch(`${e.url}/metrics`).then((m) => m.text());
    expect(metrics).toContain('hydra_rebuild_failures_total{rebuild="context"} 1');
    // A later good change applies and clears the report.
    const ok = await post(e.url, '/control/configure', { n_ctx: 1024 });
    expect(ok.json.success).toBe(true);
    const after = await status(e.url);
    expect(after.slots.n_ctx_seq).toBe(1024);
    expect(after.last_rebuild_failure).toBeUndefined();
    expect((await greedy(e.url)).status).toBe(200);
    expect(e.log()).toContain('context rebuild of');
  }, 120_000);

  it('a deferred model load that fails is reported in STATUS, the log and a metric; the old model serves', async () => {
    const e = await spawnEngine(['-m', tiny, '-c', '512']);
    const before = await greedy(e.url);
    // A long stream holds the slot until the CONFIGURE reply says the load was deferred.
    const ctrl = new AbortController();
    const res = await fetch(`${e.url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ prompt: 'Hello', max_tokens: 4000, ignore_eos: true, stream: true }),
      signal: ctrl.signal,
    });
    const reader = res.body!.getReader();
    await reader.read();
    const reply = await post(e.url, '/control/configure', { model: badNrot });
    ctrl.abort();
    await reader.closed.catch(() => undefined);
    await waitFor(async () => (await status(e.url)).last_rebuild_failure !== undefined, 20_000);
    expect(reply.json).toMatchObject({ success: true, deferred_keys: ['model'] });
    const st = await status(e.url);
    expect(st.last_rebuild_failure).toMatchObject({
      rebuild: 'model',
      keys: ['model'],
      code: 'HYDRA_ERR_LOAD_FAILED',
      deferred: true,
      restored: true,
    });
    expect(st).toMatchObject({ state: 'ready', model: { path: tiny }, deferred_keys: [] });
    expect(st.applied.model).toBe(tiny);
    expect(await greedy(e.url)).toEqual(before);
    const metrics = await fetch(`${e.url}/metrics`).then((m) => m.text());
    expect(metrics).toContain('hydra_rebuild_failures_total{rebuild="model"} 1');
    expect(e.log()).toMatch(/deferred model rebuild of model failed: HYDRA_ERR_LOAD_FAILED/);
  }, 120_000);
});
