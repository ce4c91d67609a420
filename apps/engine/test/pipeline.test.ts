import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { complete, metric } from './compare-helpers.js';
import { engineWith, tinyModel, waitFor } from './helpers.js';

// The decode loop queues step k+1 before step k ends (Engine #chain). Whatever ends a request early
// (a stop string, max_tokens, a cancel) leaves one wasted entry in the step queued ahead; these
// tests hold the pipelined engine to the unpipelined one's exact output and KV state.
type Eng = Awaited<ReturnType<typeof engineWith>>;
let model: string;
let piped: Eng;
let plain: Eng;

beforeAll(async () => {
  model = await tinyModel();
  const flags = ['-m', model, '-np', '2', '-c', '2048'];
  piped = await engineWith(flags);
  const saved = process.env.HYDRA_PIPELINE;
  process.env.HYDRA_PIPELINE = '0';
  try {
    plain = await engineWith(flags);
  } finally {
    if (saved === undefined) delete process.env.HYDRA_PIPELINE;
    else process.env.HYDRA_PIPELINE = saved;
  }
}, 60_000);
afterAll(async () => {
  await piped?.close();
  await plain?.close();
});

describe('pipelined decode loop', () => {
  it('queues steps ahead only when pipelined (HYDRA_PIPELINE=0 turns it off)', async () => {
    const body = { prompt: 'the long day', max_tokens: 8, ignore_eos: true };
    const before = await metric(piped, 'hydra_decode_steps_ahead_total');
    await complete(piped, body);
    await complete(plain, body);
    // 8 tokens: the prompt step, then 7 follow steps, each queued while the one before ran.
    expect((await metric(piped, 'hydra_decode_steps_ahead_total')) - before).toBe(7);
    expect(await metric(plain, 'hydra_decode_steps_ahead_total')).toBe(0);
  });

  it('gives the same text as the unpipelined loop, across max_tokens', async () => {
    for (const max of [1, 2, 3, 17]) {
      const body = { prompt: 'the water of the day', max_tokens: max, ignore_eos: true };
      const [a, b] = await Promise.all([complete(piped, body), complete(plain, body)]);
      expect(a).toEqual(b);
      expect(a.completion).toBe(max);
    }
  });

  it('stops at a stop string mid-generation, and the cached slot continues identically', async () => {
    const prompt = 'people who could write';
    const full = await complete(plain, { prompt, max_tokens: 24, ignore_eos: true });
    expect(full.text.length).toBeGreaterThan(12);
    const stop = full.text.slice(8, 11);
    for (const eng of [piped, plain]) {
      const body = { prompt, max_tokens: 24, ignore_eos: true, stop: [stop], cache_prompt: true, id_slot: 0 };
      const first = await complete(eng, body);
      expect(first.finish).toBe('stop');
      expect(first.text).toBe(full.text.slice(0, full.text.indexOf(stop)));
      // Same prompt on the same slot: its KV (prompt minus the last token) is reused, and the
      // wasted entry of the stopped request must not leak into the continuation.
      // The reply goes out as the stop string is seen; the step queued ahead ends just after.
      const wasted = eng === piped ? 1 : 0;
      await waitFor(async () => (await metric(eng, 'hydra_decode_entries_wasted_total')) === wasted, 5000);
      const again = await complete(eng, { ...body, stop: [] });
      expect(again.cached).toBeGreaterThan(0);
      expect(again.text).toBe(full.text);
    }
  });

  it('keeps the pipeline going when one of the running requests reaches its token limit', async () => {
    const greedy = (maxTokens: number) => ({ maxTokens, stop: [], sampler: { temp: 0 }, ignoreEos: true });
    const run = (eng: Eng) => {
      const prompts = ['the long day', 'people who could write'].map((p) => eng.engine.tokenize(p));
      // Admitted together (held while both are queued): both prompts go into the same first step.
      const release = eng.engine.hold('test: admit both together');
      const both = Promise.all([
        eng.engine.submit(prompts[0]!, greedy(4)),
        eng.engine.submit(prompts[1]!, greedy(12)),
      ]);
      release();
      return both;
    };
    const before = piped.engine.counters.decodeStepsAhead;
    const a = await run(piped);
    // 12 steps (the prompts, then 11 follow steps); only the last has no successor queued: the
    // 4-token request ends inside the pipeline instead of stopping it for a step.
    expect(piped.engine.counters.decodeStepsAhead - before).toBe(11);
    const b = await run(plain);
    expect(a.map((r) => r.tokens)).toEqual(b.map((r) => r.tokens));
    expect(a.map((r) => r.finishReason)).toEqual(['length', 'length']);
  });

  it('serves more concurrent streams than slots with the same text per request', async () => {
    const bodies = [5, 9, 2, 14, 7, 11].map((max, i) => ({
      prompt: `number ${i} of the long way`,
      max_tokens: max,
      ignore_eos: true,
    }));
    const a = await Promise.all(bodies.map((b) => complete(piped, b)));
    const b = await Promise.all(bodies.map((b) => complete(plain, b)));
    expect(a).toEqual(b);
    expect(a.map((c) => c.completion)).toEqual(bodies.map((b) => b.max_tokens));
  });

  it('cancels a stream mid-generation and frees the slot for the next request', async () => {
    const ctrl = new AbortController();
    const res = await fetch(`${piped.url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ prompt: 'a long way', max_tokens: 1500, ignore_eos: true, stream: true }),
      signal: ctrl.signal,
    });
    const reader = res.body!.getReader();
    await reader.read();
    ctrl.abort();
    await reader.closed.catch(() => undefined);
    const body = { prompt: 'the water of the day', max_tokens: 6, ignore_eos: true };
    expect(await complete(piped, body)).toEqual(await complete(plain, body));
  });
});
