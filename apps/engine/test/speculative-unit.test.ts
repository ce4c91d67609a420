import { describe, expect, it } from 'vitest';
import {
  mayGuessAfter,
  ngramDraft,
  SPEC_JUDGE_AFTER,
  SPEC_PAUSE_TOKENS,
  SpecTally,
  speculable,
  speculativeFrom,
} from '../src/core/speculative.js';

describe('ngram_simple drafting (llama.cpp common_ngram_simple_draft)', () => {
  const s = { sizeN: 2, sizeM: 4 };
  it('guesses what followed the latest earlier match of the last n tokens', () => {
    // ... 5 6 7 8 9 | 1 2 3 4 | 5 6: the last two (5 6) were followed by 7 8 9 1 before.
    const h = [0, 5, 6, 7, 8, 9, 1, 2, 3, 4, 5, 6];
    expect(ngramDraft(h, s, 16)).toEqual([7, 8, 9, 1]);
    expect(ngramDraft(h, s, 3)).toEqual([7, 8, 9]);
    expect(ngramDraft(h, { sizeN: 2, sizeM: 8 }, 16)).toEqual([]); // history too short for n + m + 1
  });
  it('makes no guess without a match, or when fewer than n tokens follow it', () => {
    expect(ngramDraft([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11], s, 16)).toEqual([]);
    // A run of one token: the nearest match is one back, one token follows it (< n).
    expect(ngramDraft([7, 7, 7, 7, 7, 7, 7, 7, 7, 7], s, 16)).toEqual([]);
    expect(ngramDraft([0, 5, 6, 7, 8, 9, 1, 2, 3, 4, 5, 6], s, 0)).toEqual([]);
  });
});

describe('mayGuessAfter', () => {
  it('is false only when no next token can lead to a guess (the pipelined step loses nothing)', () => {
    // Deterministic xorshift over small alphabets, so n-grams repeat often.
    let x = 12345;
    const rnd = (k: number) => {
      x ^= x << 13;
      x ^= x >>> 17;
      x ^= x << 5;
      return (x >>> 0) % k;
    };
    let falses = 0;
    let trues = 0;
    for (let round = 0; round < 3000; round++) {
      const s = { sizeN: 1 + rnd(3), sizeM: 1 + rnd(4) };
      const alphabet = 2 + rnd(6);
      const h = Array.from({ length: rnd(24) }, () => rnd(alphabet));
      const may = mayGuessAfter(h, s);
      if (may) trues++;
      else falses++;
      if (!may) for (let t = 0; t < alphabet; t++) expect(ngramDraft([...h, t], s, 64)).toEqual([]);
    }
    expect(falses).toBeGreaterThan(100);
    expect(trues).toBeGreaterThan(100);
  });
});

describe('SpecTally', () => {
  it('pauses guessing after a window of poor acceptance, and resumes later', () => {
    const t = new SpecTally();
    t.record(SPEC_JUDGE_AFTER, SPEC_JUDGE_AFTER, 20);
    expect(t.mayDraft(21)).toBe(true);
    t.record(SPEC_JUDGE_AFTER, 1, 40);
    expect(t.mayDraft(41)).toBe(false);
    expect(t.pausedAt(40 + SPEC_PAUSE_TOKENS - 1)).toBe(true);
    expect(t.mayDraft(40 + SPEC_PAUSE_TOKENS)).toBe(true);
    expect(t.drafted).toBe(2 * SPEC_JUDGE_AFTER);
    expect(t.acceptance).toBeCloseTo((SPEC_JUDGE_AFTER + 1) / (2 * SPEC_JUDGE_AFTER));
  });
});

describe('settings', () => {
  it('reads speculative.types and the n-gram sizes; none is off', () => {
    expect(speculativeFrom({ 'speculative.types': ['none'] })).toBeUndefined();
    expect(
      speculativeFrom({
        'speculative.types': ['ngram_simple'],
        'speculative.ngram_size_n': 3,
        'speculative.ngram_size_m': 5,
      }),
    ).toEqual({ type: 'ngram_simple', sizeN: 3, sizeM: 5 });
    // draft_simple needs its model; a model alone means draft_simple (llama-server infers it).
    expect(() => speculativeFrom({ 'speculative.types': ['draft_simple'] })).toThrow(
      expect.objectContaining({ code: 'HYDRA_ERR_BAD_VALUE' }),
    );
    expect(speculativeFrom({ 'speculative.model': 'd.gguf', 'speculative.n_max': 4 })).toEqual({
      type: 'draft_simple',
      nMax: 4,
      nMin: 0,
      pMin: 0,
    });
    // One type at a time: both together are refused by name, not half honoured.
    expect(() =>
      speculativeFrom({
        'speculative.types': ['ngram_simple', 'draft_simple'],
        'speculative.model': 'd.gguf',
      }),
    ).toThrow(expect.objectContaining({ code: 'HYDRA_ERR_UNSUPPORTED_FIELD' }));
    expect(() =>
      speculativeFrom({ 'speculative.types': ['ngram_simple'], 'speculative.model': 'd.gguf' }),
    ).toThrow(expect.objectContaining({ code: 'HYDRA_ERR_UNSUPPORTED_FIELD' }));
  });
  it('only stateless greedy samplers are speculated', () => {
    expect(speculable({ temp: 0 })).toBe(true);
    expect(speculable({ temp: 0, logitBias: [{ token: 1, bias: 2 }] })).toBe(true);
    expect(speculable({})).toBe(false);
    expect(speculable({ temp: 0.5 })).toBe(false);
    expect(speculable({ temp: 0, grammar: 'root ::= "a"' })).toBe(false);
    expect(speculable({ temp: 0, penaltyRepeat: 1.1 })).toBe(false);
    expect(speculable({ temp: 0, dryMultiplier: 0.8 })).toBe(false);
  });
});
