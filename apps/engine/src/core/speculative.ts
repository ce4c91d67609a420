// Speculative decoding settings and the pure parts (no native calls): llama.cpp's `ngram_simple`
// guesses the next tokens of a slot from its own history, the other n-gram types are upstream's
// drafters in the addon (NgramDrafter), a draft model's guesses come from draft.ts, and a per-slot
// tally turns guessing off when the target keeps rejecting them, so a slot whose text the guesser
// cannot follow pays nothing for it.
import type { SamplerParams } from '@hydra-engine/native-ggml';
import type { Params } from '@hydra-engine/tiering';
import { HydraError } from '../errors.js';

/** The `speculative.*` settings in force, as the scheduler uses them. */
export type SpeculativeSettings =
  | {
      type: 'ngram_simple';
      /** Length of the n-gram looked up in the history (`speculative.ngram_size_n`). */
      sizeN: number;
      /** Most tokens guessed after a match (`speculative.ngram_size_m`). */
      sizeM: number;
    }
  | {
      /** Upstream's ngram-map-k (keys only) and ngram-map-k4v (up to 4 values per key) drafters. */
      type: 'ngram_map_k' | 'ngram_map_k4v';
      /** Length of the key n-gram (`speculative.ngram_map_k.size_n`, `...k4v.size_n`). */
      sizeN: number;
      /** Length of the guessed m-gram (`.size_m`). */
      sizeM: number;
      /** Occurrences of a key before it is used (`.min_hits`). */
      minHits: number;
    }
  | {
      /** Upstream's ngram-mod: a hashed n-gram -> next-token table shared by all slots. */
      type: 'ngram_mod';
      /** Length of the hashed n-gram (`speculative.ngram_mod.n_match`). */
      nMatch: number;
      /** Most tokens guessed (`.n_max`). */
      nMax: number;
      /** A shorter guess is dropped (`.n_min`). */
      nMin: number;
    }
  | {
      /** Upstream's ngram-cache (lookup decoding over the slot's own n-grams of 1 to 4 tokens). */
      type: 'ngram_cache';
    }
  | {
      /** A draft model guesses (`speculative.model`; llama.cpp's draft-simple). */
      type: 'draft_simple';
      /** Most tokens drafted per step (`speculative.n_max`). */
      nMax: number;
      /** A shorter draft is dropped (`speculative.n_min`). */
      nMin: number;
      /** Drafting stops at a guess less likely than this (`speculative.p_min`). */
      pMin: number;
    };

/** Most guessed tokens one step of a slot may carry under `s` (what its outputs are sized for). */
export function maxGuess(s: SpeculativeSettings): number {
  switch (s.type) {
    case 'ngram_simple':
    case 'ngram_map_k':
    case 'ngram_map_k4v':
      return s.sizeM;
    case 'ngram_cache':
      return NGRAM_CACHE_DRAFT;
    default:
      return s.nMax;
  }
}

/**
 * Recurrent-state snapshots per sequence (llama.cpp n_rs_seq) a context needs under the settings of
 * `cfg`: one per token a step's guess may carry, so removing every rejected guess of a step from a
 * recurrent or hybrid memory restores its state before them (0 when speculation is off).
 * llama.cpp clamps it to 0 on an arch without partial rollback; the scheduler reads the clamp back.
 */
export function rsSnapshotsFor(cfg: Params | undefined): number {
  const spec = speculativeFrom(cfg);
  return spec ? maxGuess(spec) : 0;
}

/** ngram-cache's guess length, fixed upstream (common/speculative.cpp, create_state_ngram_cache). */
export const NGRAM_CACHE_DRAFT = 8;

/** The types whose guesses come from the addon's n-gram drafters (NgramDrafter). */
export const NATIVE_NGRAM_TYPES = ['ngram_map_k', 'ngram_map_k4v', 'ngram_mod', 'ngram_cache'] as const;
export type NativeNgramType = (typeof NATIVE_NGRAM_TYPES)[number];

export function isNativeNgram(
  s: SpeculativeSettings,
): s is Extract<SpeculativeSettings, { type: NativeNgramType }> {
  return (NATIVE_NGRAM_TYPES as readonly string[]).includes(s.type);
}

/**
 * The settings of `cfg`, or undefined when speculation is off. A `speculative.model` with the
 * default types means draft_simple, as llama-server infers it from a plain draft GGUF.
 */
export function speculativeFrom(cfg: Params | undefined): SpeculativeSettings | undefined {
  if (!cfg) return undefined;
  let types = ((cfg['speculative.types'] as string[] | undefined) ?? ['none']).filter((t) => t !== 'none');
  const model = (cfg['speculative.model'] as string | undefined) ?? '';
  if (types.length === 0 && model !== '') types = ['draft_simple'];
  if (types.length === 0) return undefined;
  // The registry only admits the implemented types; anything else is a wiring bug.
  const known = ['ngram_simple', 'draft_simple', ...NATIVE_NGRAM_TYPES] as string[];
  if (types.some((t) => !known.includes(t)) || new Set(types).size > 1) {
    throw new HydraError(
      'HYDRA_ERR_UNSUPPORTED_FIELD',
      `speculative.types ${types.join(',')}: one type at a time (${known.join(', ')}) is implemented`,
      { keys: ['speculative.types'] },
    );
  }
  if (types[0] === 'draft_simple') {
    if (model === '')
      throw new HydraError('HYDRA_ERR_BAD_VALUE', 'speculative.types draft_simple needs speculative.model', {
        keys: ['speculative.model'],
      });
    return {
      type: 'draft_simple',
      nMax: (cfg['speculative.n_max'] as number | undefined) ?? 3,
      nMin: (cfg['speculative.n_min'] as number | undefined) ?? 0,
      pMin: (cfg['speculative.p_min'] as number | undefined) ?? 0,
    };
  }
  if (model !== '')
    throw new HydraError(
      'HYDRA_ERR_UNSUPPORTED_FIELD',
      `speculative.model with speculative.types ${types[0]}: one type at a time is implemented`,
      { keys: ['speculative.model', 'speculative.types'] },
    );
  const t = types[0];
  const num = (key: string, dflt: number) => (cfg[key] as number | undefined) ?? dflt;
  if (t === 'ngram_map_k' || t === 'ngram_map_k4v')
    return {
      type: t,
      sizeN: num(`speculative.${t}.size_n`, 12),
      sizeM: num(`speculative.${t}.size_m`, 48),
      minHits: num(`speculative.${t}.min_hits`, 1),
    };
  if (t === 'ngram_mod')
    return {
      type: t,
      nMatch: num('speculative.ngram_mod.n_match', 24),
      nMax: num('speculative.ngram_mod.n_max', 64),
      nMin: num('speculative.ngram_mod.n_min', 48),
    };
  if (t === 'ngram_cache') return { type: t };
  return {
    type: 'ngram_simple',
    sizeN: (cfg['speculative.ngram_size_n'] as number | undefined) ?? 12,
    sizeM: (cfg['speculative.ngram_size_m'] as number | undefined) ?? 48,
  };
}

/**
 * Whether a request's sampler picks the argmax and keeps no state (no grammar, penalties, DRY, XTC
 * or mirostat). Only those are speculated: on a GPU the chain samples on the device, through a
 * clone of the chain whose state the host copy (which samples a guessed run) would not share.
 */
export function speculable(p: SamplerParams): boolean {
  return (
    p.temp !== undefined &&
    p.temp <= 0 &&
    !p.mirostat &&
    !p.grammar &&
    (p.penaltyRepeat ?? 1) === 1 &&
    !p.penaltyFreq &&
    !p.penaltyPresent &&
    !p.dryMultiplier &&
    !p.xtcProbability
  );
}

/**
 * llama.cpp's common_ngram_simple_draft: the last `sizeN` tokens of `history` (its last item is the
 * token just sampled) are searched for backwards; the tokens that followed the latest earlier match
 * are the guess, at most `sizeM` and at least `sizeN` of them, else none. `limit` caps the length.
 */
export function ngramDraft(
  history: ArrayLike<number>,
  s: { sizeN: number; sizeM: number },
  limit: number,
): number[] {
  // In upstream's terms `cur` is the history before the sampled token.
  const cur = history.length - 1;
  const n = s.sizeN;
  const m = s.sizeM;
  if (cur <= n + m + 1 || limit < 1) return [];
  const start = cur + 1 - n;
  let match = 0;
  for (let j = cur - n - 1; j > 0; j--) {
    let k = 0;
    while (k < n && history[j + k] === history[start + k]) k++;
    if (k === n) {
      match = j;
      break;
    }
  }
  if (match === 0) return [];
  const copy = Math.min(m, cur - (match + n));
  if (copy < n) return [];
  const out: number[] = [];
  for (let j = 0; j < Math.min(copy, limit); j++) out.push(history[match + n + j]!);
  return out;
}

/**
 * Whether {@link ngramDraft} could guess once one more token, whatever it is, joins `history`:
 * the n-gram then ends with that token, so its first n - 1 tokens (the end of `history`) must
 * occur earlier where the search looks. When it cannot, the next step may be queued ahead
 * (pipelined) without losing a guess.
 */
export function mayGuessAfter(history: ArrayLike<number>, s: { sizeN: number; sizeM: number }): boolean {
  const len = history.length;
  const n = s.sizeN;
  if (len <= n + s.sizeM + 1) return false;
  const k = n - 1;
  if (k === 0) return true;
  const start = len - k;
  for (let j = len - n - 1; j > 0; j--) {
    let i = 0;
    while (i < k && history[j + i] === history[start + i]) i++;
    if (i === k) return true;
  }
  return false;
}

/** Guessing pauses when fewer than this share of the guesses so far were accepted. */
export const SPEC_MIN_ACCEPTANCE = 0.2;
/** Guesses made before the share is judged (then a new window starts). */
export const SPEC_JUDGE_AFTER = 16;
/** Tokens a paused slot generates without guesses before it guesses again. */
export const SPEC_PAUSE_TOKENS = 64;

/** One slot's guesses: what was drafted and accepted, and until when guessing is paused. */
export class SpecTally {
  drafted = 0;
  accepted = 0;
  #windowDrafted = 0;
  #windowAccepted = 0;
  /** Guessing resumes once the job has generated this many tokens. */
  #pausedUntil = 0;

  /** Whether the step after `generated` tokens may carry a guess. */
  mayDraft(generated: number): boolean {
    return generated >= this.#pausedUntil;
  }

  pausedAt(generated: number): boolean {
    return generated < this.#pausedUntil;
  }

  /** Accepted share of the guesses so far (0 before any). */
  get acceptance(): number {
    return this.drafted === 0 ? 0 : this.accepted / this.drafted;
  }

  /** One verified guess of `drafted` tokens, `accepted` of them confirmed, the job at `generated`. */
  record(drafted: number, accepted: number, generated: number): void {
    this.drafted += drafted;
    this.accepted += accepted;
    this.#windowDrafted += drafted;
    this.#windowAccepted += accepted;
    if (this.#windowDrafted >= SPEC_JUDGE_AFTER) {
      if (this.#windowAccepted < SPEC_MIN_ACCEPTANCE * this.#windowDrafted)
        this.#pausedUntil = generated + SPEC_PAUSE_TOKENS;
      this.#windowDrafted = 0;
      this.#windowAccepted = 0;
    }
  }
}
