import { HydraClient } from '@hydra-engine/hydra-rpc';
import { afterEach, beforeAll, describe, expect, it } from 'vitest';
import { complete, freePort, stream } from './control-helpers.js';
import { engineWith, tinyModel, waitFor } from './helpers.js';

type Running = Awaited<ReturnType<typeof engineWith>>;
let model: string;
let running: Running | undefined;
let c: HydraClient | undefined;

beforeAll(async () => {
  model = await tinyModel();
});
afterEach(async () => {
  c?.close();
  await running?.close();
  delete process.env.HYDRA_COORD_PROFILE_SWITCH_DRAIN_TIMEOUT;
});

async function start(drain: string, flags: string[] = []): Promise<{ e: Running; c: HydraClient }> {
  process.env.HYDRA_COORD_PROFILE_SWITCH_DRAIN_TIMEOUT = drain;
  const port = await freePort();
  running = await engineWith(['-m', model, '-np', '2', '-c', '4096', '--rpc-port', String(port), ...flags]);
  c = await HydraClient.connect({ port, encoding: 'msgpack', timeoutMs: 30_000 });
  return { e: running, c };
}

describe('CONFIGURE while streams run', () => {
  it('T1 reaches new requests only; T3 waits for the streams, then applies; nothing is lost', async () => {
    const { e, c } = await start('60', ['-n', '1500']);
    const epoch0 = (await c.status()).epoch;
    let started = 0;
    const body = { prompt: 'a long story', ignore_eos: true, temperature: 0 };
    const s1 = stream(e.url, body, () => started++);
    const s2 = stream(e.url, body, () => started++);
    await waitFor(async () => started === 2, 10_000);
    const t1 = await c.configure({ n_predict: 4 });
    expect(t1.tier).toBe('T1');
    const t3 = await c.configure({ use_mmap: false, n_ctx: 3072 });
    expect(t3.tier).toBe('T3');
    expect(t3.deferred_keys.sort()).toEqual(['n_ctx', 'use_mmap']);
    expect(t3.epoch).toBe(epoch0 + 1);
    const st = await c.status();
    expect(st.deferred_keys.sort()).toEqual(['n_ctx', 'use_mmap']);
    expect(st.slots.busy).toBe(2);
    // The same change again is a no-op.
    expect((await c.configure({ use_mmap: false })).tier).toBe('none');
    const [r1, r2] = await Promise.all([s1, s2]);
    expect(r1.error).toBeUndefined();
    expect(r2.error).toBeUndefined();
    expect(r1.finish).toBe('length');
    expect(r1.epoch).toBe(String(epoch0));
    await waitFor(async () => {
      const s = await c.status();
      return s.deferred_keys.length === 0 && s.state === 'ready' && s.epoch === epoch0 + 2;
    }, 20_000);
    const after = (await c.status()) as any;
    expect(after.epoch).toBe(epoch0 + 2);
    expect(after.applied.use_mmap).toBe(false);
    expect(after.slots.n_ctx_seq).toBe(1536);
    const r3 = await complete(e.url, { prompt: 'new', ignore_eos: true });
    expect(r3.status).toBe(200);
    expect(r3.json.usage.completion_tokens).toBe(4);
    expect(r3.epoch).toBe(String(epoch0 + 2));
  });

  it('the drain timeout ends running requests with a clear code; queued ones run after the rebuild', async () => {
    const { e, c } = await start('400ms', ['-n', '1900']);
    const epoch0 = (await c.status()).epoch;
    let started = 0;
    const body = { prompt: 'endless', ignore_eos: true };
    const s1 = stream(e.url, body, () => started++);
    const s2 = stream(e.url, body, () => started++);
    await waitFor(async () => started === 2, 10_000);
    // A third request waits in the queue for a slot.
    const queued = complete(e.url, { prompt: 'queued', max_tokens: 5, ignore_eos: true });
    const r = await c.configure({ n_ctx: 2048 });
    expect(r.deferred_keys).toEqual(['n_ctx']);
    const t0 = performance.now();
    const [a1, a2] = await Promise.all([s1, s2]);
    const waited = performance.now() - t0;
    expect(a1.error?.code).toBe('HYDRA_ERR_DRAIN_TIMEOUT');
    expect(a2.error?.code).toBe('HYDRA_ERR_DRAIN_TIMEOUT');
    expect(waited).toBeGreaterThan(250);
    const q = await queued;
    expect(q.status).toBe(200);
    expect(q.json.usage.completion_tokens).toBe(5);
    expect(Number(q.epoch)).toBe(epoch0 + 1);
    const st = (await c.status()) as unknown as { deferred_keys: string[]; slots: { n_ctx_seq: number } };
    expect(st.deferred_keys).toEqual([]);
    expect(st.slots.n_ctx_seq).toBe(1024);
  });
});
