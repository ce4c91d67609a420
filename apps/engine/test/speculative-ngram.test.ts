import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { speculativeFrom } from '../src/core/speculative.js';
import { complete, metric } from './compare-helpers.js';
import { engineWith, tinyModel } from './helpers.js';

// llama.cpp's other n-gram types (ngram-map-k, ngram-map-k4v, ngram-mod, ngram-cache: upstream's
// drafters in the addon), selected with llama-server's flags, against the same engine without
// speculation: greedy output token for token, and guesses accepted on text that repeats.
type Eng = Awaited<ReturnType<typeof engineWith>>;

describe('speculative.types: the n-gram types other than ngram_simple', () => {
  it('reads each type and its settings, with upstream defaults', () => {
    expect(speculativeFrom({ 'speculative.types': ['ngram_map_k'] })).toEqual({
      type: 'ngram_map_k',
      sizeN: 12,
      sizeM: 48,
      minHits: 1,
    });
    expect(
      speculativeFrom({
        'speculative.types': ['ngram_map_k4v'],
        'speculative.ngram_map_k4v.size_n': 3,
        'speculative.ngram_map_k4v.size_m': 7,
        'speculative.ngram_map_k4v.min_hits': 2,
      }),
    ).toEqual({ type: 'ngram_map_k4v', sizeN: 3, sizeM: 7, minHits: 2 });
    expect(speculativeFrom({ 'speculative.types': ['ngram_mod'] })).toEqual({
      type: 'ngram_mod',
      nMatch: 24,
      nMax: 64,
      nMin: 48,
    });
    expect(
      speculativeFrom({
        'speculative.types': ['ngram_mod'],
        'speculative.ngram_mod.n_match': 4,
        'speculative.ngram_mod.n_max': 9,
        'speculative.ngram_mod.n_min': 1,
      }),
    ).toEqual({ type: 'ngram_mod', nMatch: 4, nMax: 9, nMin: 1 });
    expect(speculativeFrom({ 'speculative.types': ['ngram_cache'] })).toEqual({ type: 'ngram_cache' });
  });

  let plain: Eng;
  let model: string;
  beforeAll(async () => {
    model = await tinyModel();
    plain = await engineWith(['-m', model, '-np', '2', '-c', '2048']);
  }, 60_000);
  afterAll(async () => {
    await plain?.close();
  });

  const REPETITIVE = 'one two three four one two three four one two three four one two three four one two';
  const cases: { type: string; flags: string[] }[] = [
    {
      type: 'ngram_map_k',
      flags: [
        '--spec-ngram-map-k-size-n',
        '2',
        '--spec-ngram-map-k-size-m',
        '8',
        '--spec-ngram-map-k-min-hits',
        '1',
      ],
    },
    {
      type: 'ngram_map_k4v',
      flags: [
        '--spec-ngram-map-k4v-size-n',
        '2',
        '--spec-ngram-map-k4v-size-m',
        '8',
        '--spec-ngram-map-k4v-min-hits',
        '1',
      ],
    },
    {
      type: 'ngram_mod',
      flags: ['--spec-ngram-mod-n-match', '4', '--spec-ngram-mod-n-max', '16', '--spec-ngram-mod-n-min', '2'],
    },
    { type: 'ngram_cache', flags: [] },
  ];
  for (const c of cases) {
    it(`${c.type}: the plain engine's greedy text, guesses accepted on repeating text`, async () => {
      const spec = await engineWith([
        '-m',
        model,
        '-np',
        '2',
        '-c',
        '2048',
        '--spec-type',
        c.type.replace(/_/g, '-'),
        ...c.flags,
      ]);
      try {
        const bodies = [
          { prompt: REPETITIVE, max_tokens: 96, ignore_eos: true },
          // This prompt's greedy text falls into a loop after ~400 tokens of the tiny model.
          { prompt: 'hello world', max_tokens: 600, ignore_eos: true },
        ];
        for (const body of bodies) expect(await complete(spec, body)).toEqual(await complete(plain, body));
        // Two streams at once (two sequences of one drafter) and a stop string inside the loop.
        const two = await Promise.all(bodies.map((b) => complete(spec, b)));
        expect(two).toEqual(await Promise.all(bodies.map((b) => complete(plain, b))));
        const full = two[1]!.text;
        const stop = { ...bodies[1]!, stop: [full.slice(full.length - 60, full.length - 55)] };
        const cut = await complete(spec, stop);
        expect(cut).toEqual(await complete(plain, stop));
        expect(cut.finish).toBe('stop');
        const drafted = await metric(spec, 'hydra_spec_drafted_total');
        const accepted = await metric(spec, 'hydra_spec_accepted_total');
        expect(drafted).toBeGreaterThan(0);
        expect(accepted).toBeGreaterThan(0);
        expect(accepted).toBeLessThanOrEqual(drafted);
        const st = (await (await fetch(`${spec.url}/control/status`)).json()) as {
          speculative: { types: Record<string, { drafted: number; accepted: number }> };
        };
        expect(st.speculative.types[c.type]).toMatchObject({ drafted, accepted });
        console.log(
          `${c.type}: drafted ${drafted} accepted ${accepted} (${(accepted / drafted).toFixed(3)})`,
        );
      } finally {
        await spec.close();
      }
    }, 120_000);
  }
});
