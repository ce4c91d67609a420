// The output stage of one generation: token bytes in, final text out. Pure (no I/O, no native):
// bytes of a UTF-8 character split across tokens wait for the rest, and a tail that could still
// grow into a stop string is held back until it cannot, so a stop string never reaches the client.
// A token may carry a mark (its probabilities): the mark becomes final with the token's first
// character, so a token whose text a stop string cut away entirely is never reported.

/** One reported token's probabilities (llama-server's completion_token_output). */
export interface TokenProb {
  id: number;
  /** The token's piece as llama.cpp renders it (specials as text, as llama-server does). */
  bytes: Uint8Array;
  /** Probability of this token: before the sampler chain, or after it (`post_sampling_probs`). */
  prob: number;
  /** The most likely tokens, most likely first. */
  top: { id: number; bytes: Uint8Array; prob: number }[];
  /** Where the token's text starts in the generation's text (UTF-16 units). */
  offset: number;
}

/** Incremental UTF-8 decoding and stop strings of one generation. */
export class TextOutput<Mark = never> {
  readonly #stops: readonly string[];
  readonly #longest: number;
  readonly #decoder = new TextDecoder('utf-8');
  #text = '';
  #sent = 0;
  #stopped = false;
  #ended = false;
  /** Marks not yet final, with where their token's text starts. */
  #marks: { at: number; mark: Mark }[] = [];

  constructor(stops: readonly string[]) {
    this.#stops = stops.filter((s) => s.length > 0);
    let longest = 0;
    for (const s of this.#stops) if (s.length > longest) longest = s.length;
    this.#longest = longest;
  }

  /** True once a stop string was seen: the text ends before it and nothing more is taken. */
  get stopped(): boolean {
    return this.#stopped;
  }

  /** UTF-16 units decoded so far, sent or held back: where the next token's text starts. */
  get decoded(): number {
    return this.#text.length;
  }

  /** Everything sent so far: the generation's text. */
  get text(): string {
    return this.#text.slice(0, this.#sent);
  }

  /**
   * Appends one token's bytes, and its mark if given (see {@link take}); returns the text that
   * became final ('' when none did).
   */
  push(bytes: Uint8Array, mark?: Mark): string {
    if (this.#stopped) return '';
    if (mark !== undefined) this.#marks.push({ at: this.#text.length, mark });
    this.#text += this.#decoder.decode(bytes, { stream: true });
    if (this.#stops.length === 0) return this.#sendUpTo(this.#text.length);
    const text = this.#text;
    const from = Math.max(0, this.#sent - this.#longest);
    let cut = -1;
    for (const s of this.#stops) {
      const at = text.indexOf(s, from);
      if (at >= 0 && (cut < 0 || at < cut)) cut = at;
    }
    if (cut >= 0) {
      this.#stopped = true;
      // Tokens whose text starts at or after the stop string gave the reply nothing.
      while (this.#marks.length > 0 && this.#marks[this.#marks.length - 1]!.at >= cut) this.#marks.pop();
      this.#text = text.slice(0, cut);
      const out = cut > this.#sent ? this.#text.slice(this.#sent) : '';
      this.#sent = this.#text.length;
      return out;
    }
    let hold = 0;
    for (const s of this.#stops) {
      for (let n = Math.min(s.length - 1, text.length); n > hold; n--) {
        if (text.endsWith(s.slice(0, n))) {
          hold = n;
          break;
        }
      }
    }
    return this.#sendUpTo(text.length - hold);
  }

  /**
   * Ends the generation (EOS or the token limit): incomplete UTF-8 becomes U+FFFD and a held-back
   * tail is sent, since no later token can complete a stop string any more.
   */
  end(): string {
    if (this.#stopped) return '';
    this.#ended = true;
    this.#text += this.#decoder.decode();
    return this.#sendUpTo(this.#text.length);
  }

  /**
   * The marks that became final since the last call, in token order: those of tokens whose first
   * character has been sent (a token that ends inside a character goes with the token that
   * completes it), and at the end every other mark (tokens with an empty piece).
   */
  take(): Mark[] {
    const out: Mark[] = [];
    const all = this.#ended || this.#stopped;
    let n = 0;
    while (n < this.#marks.length && (all || this.#marks[n]!.at < this.#sent))
      out.push(this.#marks[n++]!.mark);
    if (n > 0) this.#marks.splice(0, n);
    return out;
  }

  #sendUpTo(end: number): string {
    if (end <= this.#sent) return '';
    const out = this.#text.slice(this.#sent, end);
    this.#sent = end;
    return out;
  }
}
