import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { complete, metric, streamInto, untilSlotsIdle } from './compare-helpers.js';
import { engineWith, tinyModel } from './helpers.js';

// n-gram speculative decoding (speculative.types ngram_simple) against the same engine without
// it: greedy output token for token, with stop strings, limits, cache_prompt and two streams.
type Eng = Awaited<ReturnType<typeof engineWith>>;
let spec: Eng;
let plain: Eng;

beforeAll(async () => {
  const model = await tinyModel();
  const dir = mkdtempSync(join(tmpdir(), 'hydra-spec-'));
  const yaml = join(dir, 'spec.yaml');
  writeFileSync(yaml, 'speculative:\n  types: [ngram_simple]\n  ngram_size_n: 2\n');
  const flags = ['-m', model, '-np', '2', '-c', '2048'];
  // The YAML config and llama-server's flags (--spec-type ngram-simple) set the same keys.
  spec = await engineWith([
    ...flags,
    '--config',
    yaml,
    '--spec-type',
    'ngram-simple',
    '--spec-ngram-simple-size-m',
    '8',
  ]);
  plain = await engineWith(flags);
}, 60_000);
afterAll(async () => {
  await spec?.close();
  await plain?.close();
});

const REPETITIVE = 'one two three four one two three four one two three four one two three four one two';

describe('n-gram speculative decoding', () => {
  it('gives the greedy text of the plain engine and accepts guesses on a repetitive prompt', async () => {
    const drafted0 = await metric(spec, 'hydra_spec_drafted_total');
    const accepted0 = await metric(spec, 'hydra_spec_accepted_total');
    const steps0 = await metric(spec, 'hydra_decode_steps_total');
    const body = { prompt: REPETITIVE, max_tokens: 96, ignore_eos: true };
    const a = await complete(spec, body);
    const b = await complete(plain, body);
    expect(a).toEqual(b);
    const drafted = (await metric(spec, 'hydra_spec_drafted_total')) - drafted0;
    const accepted = (await metric(spec, 'hydra_spec_accepted_total')) - accepted0;
    const steps = (await metric(spec, 'hydra_decode_steps_total')) - steps0;
    expect(drafted).toBeGreaterThan(0);
    expect(accepted).toBeGreaterThan(0);
    expect(accepted).toBeLessThanOrEqual(drafted);
    // Each accepted guess is a token that took no step of its own.
    expect(steps).toBeLessThanOrEqual(1 + 96 - accepted);
    console.log(`spec: drafted ${drafted} accepted ${accepted} steps ${steps} for 96 tokens`);
    // Per slot (llama-server's draft_n, draft_n_accepted) and in STATUS.
    const slots = (await (await fetch(`${spec.url}/slots`)).json()) as Record<string, unknown>[];
    const used = slots.find((x) => (x.draft_n as number) > 0)!;
    expect(used.draft_n_accepted).toBeGreaterThan(0);
    expect(used.speculative).toBe(false); // idle now
    const st = (await (await fetch(`${spec.url}/control/status`)).json()) as {
      speculative: { drafted: number; accepted: number; acceptance: number };
    };
    expect(st.speculative.drafted).toBe(await metric(spec, 'hydra_spec_drafted_total'));
    expect(st.speculative.acceptance).toBeCloseTo(st.speculative.accepted / st.speculative.drafted);
  });

  it('stops at the same place across max_tokens and stop strings inside accepted runs', async () => {
    const full = await complete(plain, { prompt: REPETITIVE, max_tokens: 96, ignore_eos: true });
    for (const max of [1, 2, 3, 5, 17, 40]) {
      const body = { prompt: REPETITIVE, max_tokens: max, ignore_eos: true };
      expect(await complete(spec, body)).toEqual(await complete(plain, body));
    }
    // Stop strings cut from the middle of the text: later tokens of the run must not leak.
    for (const at of [10, 33, 61, 120]) {
      const stop = full.text.slice(at, at + 4);
      if (stop.trim().length === 0) continue;
      const body = { prompt: REPETITIVE, max_tokens: 96, ignore_eos: true, stop: [stop] };
      const a = await complete(spec, body);
      expect(a).toEqual(await complete(plain, body));
      expect(a.finish).toBe('stop');
    }
  });

  it('two streams at once and a cached prompt give the plain engine output', async () => {
    const bodies = [
      { prompt: REPETITIVE, max_tokens: 48, ignore_eos: true },
      { prompt: 'the water of the day and the water of the night and the', max_tokens: 48, ignore_eos: true },
    ];
    const a = await Promise.all(bodies.map((b) => complete(spec, b)));
    const b = await Promise.all(bodies.map((b) => complete(plain, b)));
    expect(a).toEqual(b);
    // cache_prompt: the KV left by a speculative run holds exactly the tokens fed (no guesses).
    const first = { prompt: REPETITIVE, max_tokens: 30, ignore_eos: true, cache_prompt: true, id_slot: 1 };
    expect(await complete(spec, first)).toEqual(await complete(plain, first));
    const again = { ...first, prompt: `${REPETITIVE}${a[0]!.text.slice(0, 40)}`, max_tokens: 40 };
    const x = await complete(spec, again);
    const y = await complete(plain, again);
    expect(x).toEqual(y);
    expect(x.cached).toBeGreaterThan(0);
  });

  it('accepted runs: a stop string or the limit inside one ends the text where the plain engine does', async () => {
    // This prompt's greedy text falls into a loop ("real com hera") after ~400 tokens of the tiny
    // model: there the guesses are confirmed several tokens at a time.
    const body = { prompt: 'hello world', max_tokens: 600, ignore_eos: true };
    const accepted0 = await metric(spec, 'hydra_spec_accepted_total');
    const full = await complete(plain, body);
    expect(await complete(spec, body)).toEqual(full);
    expect((await metric(spec, 'hydra_spec_accepted_total')) - accepted0).toBeGreaterThan(10);
    for (const max of [571, 572, 573, 574, 575, 590, 597]) {
      const b2 = { ...body, max_tokens: max };
      expect(await complete(spec, b2)).toEqual(await complete(plain, b2));
    }
    const n = full.text.length;
    for (const back of [150, 97, 60, 41, 22, 9]) {
      const stop = full.text.slice(n - back, n - back + 5);
      const b2 = { ...body, stop: [stop] };
      const x = await complete(spec, b2);
      expect(x).toEqual(await complete(plain, b2));
      expect(x.finish).toBe('stop');
    }
  });

  it('a cancel in the guessing part of a stream frees the slot and the next request is unchanged', async () => {
    // Into the loop where guesses are confirmed (see above), then cancel.
    const stream = await streamInto(
      spec,
      { prompt: 'hello world', max_tokens: 900, ignore_eos: true, stream: true, temperature: 0 },
      480,
    );
    await stream.cancel();
    await untilSlotsIdle(spec, 200);
    expect(await metric(spec, 'hydra_slots_busy')).toBe(0);
    expect(await metric(spec, 'hydra_requests_total{finish_reason="cancelled"}')).toBe(1);
    const body = { prompt: REPETITIVE, max_tokens: 40, ignore_eos: true };
    expect(await complete(spec, body)).toEqual(await complete(plain, body));
  });

  it('keeps the pipelined loop where no guess can come (text that does not repeat)', async () => {
    const ahead0 = await metric(spec, 'hydra_decode_steps_ahead_total');
    const drafted0 = await metric(spec, 'hydra_spec_drafted_total');
    const body = { prompt: 'the long day', max_tokens: 24, ignore_eos: true };
    expect(await complete(spec, body)).toEqual(await complete(plain, body));
    const ahead = (await metric(spec, 'hydra_decode_steps_ahead_total')) - ahead0;
    const drafted = (await metric(spec, 'hydra_spec_drafted_total')) - drafted0;
    console.log(`no repeats: ${ahead} of 23 steps queued ahead, ${drafted} guessed`);
    expect(ahead).toBeGreaterThan(10);
  });

  it('does not guess for a sampled (temperature > 0) request', async () => {
    const drafted0 = await metric(spec, 'hydra_spec_drafted_total');
    const body = { prompt: REPETITIVE, max_tokens: 48, ignore_eos: true, temperature: 0.7, seed: 5 };
    expect(await complete(spec, body)).toEqual(await complete(plain, body));
    expect(await metric(spec, 'hydra_spec_drafted_total')).toBe(drafted0);
  });
});
