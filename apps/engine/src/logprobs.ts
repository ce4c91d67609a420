// Token probabilities in the shapes clients read them: llama-server's `completion_probabilities`
// (probs_vector_to_json in tools/server/server-task.cpp), OpenAI chat's `logprobs.content` and
// OpenAI completions' `logprobs` (tokens, token_logprobs, top_logprobs, text_offset). Pure.
import type { TokenProb } from './core/output.js';

/** What a request asked to be told about each generated token. */
export interface ProbsRequest {
  /** How many of the most likely tokens to list per token (0: the sampled token's alone). */
  n: number;
  /** Probabilities after the sampler chain instead of before it (llama-server's post_sampling_probs). */
  postSampling: boolean;
}

/**
 * llama-server's validate_utf8: the length of `bytes` without a multi-byte character cut off at
 * its end (bytes of a character that a later token completes).
 */
export function validUtf8Length(bytes: Uint8Array): number {
  const len = bytes.length;
  for (let i = 1; i <= 4 && i <= len; i++) {
    const c = bytes[len - i]!;
    if ((c & 0xe0) === 0xc0) {
      if (i < 2) return len - i;
    } else if ((c & 0xf0) === 0xe0) {
      if (i < 3) return len - i;
    } else if ((c & 0xf8) === 0xf0) {
      if (i < 4) return len - i;
    }
  }
  return len;
}

const decoder = new TextDecoder('utf-8');

/** A piece as text: a cut-off character at its end dropped, as llama-server does (`bytes` keeps it). */
export function pieceText(bytes: Uint8Array): string {
  return decoder.decode(bytes.subarray(0, validUtf8Length(bytes)));
}

/** The lowest float, where the log of 0 would be -Infinity (JSON has none), as llama-server. */
const LOG_ZERO = -3.4028234663852886e38;

function logarithm(p: number): number {
  return p === 0 ? LOG_ZERO : Math.log(p);
}

interface Candidate {
  id: number;
  token: string;
  bytes: number[];
  logprob?: number;
  prob?: number;
}

function candidate(id: number, bytes: Uint8Array, p: number, post: boolean): Candidate {
  const c: Candidate = { id, token: pieceText(bytes), bytes: Array.from(bytes) };
  if (post) c.prob = p;
  else c.logprob = logarithm(p);
  return c;
}

/** One generated token in llama-server's shape (completion_token_output::probs_vector_to_json). */
export type ProbsEntry = Candidate & { top_logprobs?: Candidate[]; top_probs?: Candidate[] };

/**
 * llama-server's `completion_probabilities` (and OpenAI chat's `logprobs.content`): per token its
 * id, text, bytes and logprob (`prob` after the chain), with the `n` most likely tokens.
 */
export function probsJson(probs: readonly TokenProb[], req: ProbsRequest): ProbsEntry[] {
  return probs.map((t) => {
    const e: ProbsEntry = candidate(t.id, t.bytes, t.prob, req.postSampling);
    const top = t.top.slice(0, req.n).map((c) => candidate(c.id, c.bytes, c.prob, req.postSampling));
    if (req.postSampling) e.top_probs = top;
    else e.top_logprobs = top;
    return e;
  });
}

/** OpenAI chat's `choices[i].logprobs`. */
export function chatLogprobs(probs: readonly TokenProb[], req: ProbsRequest): { content: ProbsEntry[] } {
  return { content: probsJson(probs, req) };
}

/**
 * UTF-16 offsets into a growing text as code point offsets (OpenAI's `text_offset`), for offsets
 * asked in increasing order: each character is counted once however long the text grows.
 */
export class CodePointOffsets {
  #text = '';
  #unit = 0;
  #points = 0;

  /** Appends text the offsets may point into. */
  feed(text: string): void {
    this.#text += text;
  }

  /** Code points before UTF-16 offset `at` (at least the last offset asked). */
  at(at: number): number {
    const end = Math.min(at, this.#text.length);
    while (this.#unit < end) {
      const c = this.#text.charCodeAt(this.#unit);
      this.#unit += c >= 0xd800 && c < 0xdc00 && this.#unit + 1 < this.#text.length ? 2 : 1;
      this.#points += 1;
    }
    return this.#points;
  }
}

/** OpenAI completions' `choices[i].logprobs`, with llama-server's `content` beside it. */
export interface CompletionLogprobs {
  tokens: string[];
  token_logprobs: number[];
  top_logprobs: Record<string, number>[];
  text_offset: number[];
  content: ProbsEntry[];
}

/**
 * OpenAI's legacy completions shape of the tokens' log probabilities (log of the chain's
 * probabilities with `post_sampling_probs`); `offsets` converts the tokens' offsets (fed with the
 * completion's text so far).
 */
export function completionLogprobs(
  probs: readonly TokenProb[],
  req: ProbsRequest,
  offsets: CodePointOffsets,
): CompletionLogprobs {
  const out: CompletionLogprobs = {
    tokens: [],
    token_logprobs: [],
    top_logprobs: [],
    text_offset: [],
    content: probsJson(probs, req),
  };
  for (const t of probs) {
    out.tokens.push(pieceText(t.bytes));
    out.token_logprobs.push(logarithm(t.prob));
    const top: Record<string, number> = {};
    for (const c of t.top.slice(0, req.n)) {
      const token = pieceText(c.bytes);
      // A piece named like an Object.prototype member must stay a plain key.
      if (!Object.hasOwn(top, token))
        Object.defineProperty(top, token, {
          value: logarithm(c.prob),
          enumerable: true,
          writable: true,
          configurable: true,
        });
    }
    out.top_logprobs.push(top);
    out.text_offset.push(offsets.at(t.offset));
  }
  return out;
}
