import { describe, expect, it } from 'vitest';
import { initBackend, NgramDrafter } from '../src/index.js';

// Upstream's n-gram drafters (common/ngram-map, ngram-mod, ngram-cache) in the addon, on a token
// history that repeats one 10-token phrase: each must guess the phrase's continuation after the
// token just sampled, never past the limit, and refuse what it cannot use by name.

function errorCode(fn: () => unknown): string | undefined {
  try {
    fn();
  } catch (err) {
    return (err as { code?: string }).code;
  }
  return undefined;
}

const PHRASE = [11, 12, 13, 14, 15, 16, 17, 18, 19, 20];
// Five phrases and the first three tokens of a sixth (the last one is "just sampled").
const HISTORY = Int32Array.from([...PHRASE, ...PHRASE, ...PHRASE, ...PHRASE, ...PHRASE, 11, 12, 13]);
const NEXT = [14, 15, 16, 17, 18, 19, 20, 11, 12, 13, 14, 15];

describe('NgramDrafter', () => {
  initBackend();
  const cases = [
    { type: 'ngram_map_k', params: { sizeN: 3, sizeM: 6, minHits: 1 }, want: 6 },
    { type: 'ngram_map_k4v', params: { sizeN: 3, sizeM: 6, minHits: 1 }, want: 6 },
    { type: 'ngram_mod', params: { nMatch: 3, nMax: 12, nMin: 2 }, want: 12 },
    { type: 'ngram_cache', params: {}, want: 8 },
  ] as const;
  for (const c of cases) {
    it(`${c.type} guesses the continuation of the repeated phrase`, () => {
      const d = new NgramDrafter(c.type, c.params, 2);
      d.begin(0, HISTORY.subarray(0, 40));
      // The guess is the phrase's continuation, as long as the type drafts, cut at the limit.
      const guess = Array.from(d.draft(0, HISTORY, 64));
      expect(guess).toEqual(NEXT.slice(0, c.want));
      d.accept(0, guess.length);
      expect(Array.from(d.draft(0, HISTORY, 2))).toEqual(NEXT.slice(0, 2));
      // Sequence 1 has seen nothing of its own (ngram_mod's table is shared, as upstream's).
      d.begin(1, Int32Array.from([1, 2, 3]));
      const other = Array.from(d.draft(1, Int32Array.from([1, 2, 3, 4]), 8));
      expect(other).toEqual([]);
      expect(errorCode(() => d.draft(2, HISTORY, 4))).toBe('HYDRA_ERR_BAD_ARGUMENT');
      d.dispose();
      expect(errorCode(() => d.draft(0, HISTORY, 4))).toBe('HYDRA_ERR_DISPOSED');
    });
  }

  it('ngram_cache learns from the text generated one token at a time, not only from the prompt', () => {
    // Upstream's speculative.cpp feeds the cache only the new tokens (no n-gram of generated text
    // ever forms); here the whole history goes in with the count of new tokens.
    const d = new NgramDrafter('ngram_cache', {}, 1);
    d.begin(0, Int32Array.from([1, 2, 3]));
    const history = [1, 2, 3];
    let guess: number[] = [];
    for (const t of [...PHRASE, ...PHRASE, ...PHRASE, 11, 12, 13]) {
      history.push(t);
      guess = Array.from(d.draft(0, Int32Array.from(history), 8));
    }
    expect(guess).toEqual(NEXT.slice(0, 8));
    d.dispose();
  });

  it('refuses an unknown type and out-of-range sizes by name', () => {
    expect(errorCode(() => new NgramDrafter('ngram_simple' as 'ngram_mod', {}, 1))).toBe(
      'HYDRA_ERR_BAD_ARGUMENT',
    );
    expect(errorCode(() => new NgramDrafter('ngram_map_k', { sizeN: 0, sizeM: 4, minHits: 1 }, 1))).toBe(
      'HYDRA_ERR_BAD_ARGUMENT',
    );
    expect(errorCode(() => new NgramDrafter('ngram_mod', { nMatch: 4, nMax: 8, nMin: 2 }, 0))).toBe(
      'HYDRA_ERR_BAD_ARGUMENT',
    );
  });
});
