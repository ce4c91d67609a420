// The output stage of one generation: token bytes in, final text out. Pure (no I/O, no native):
// bytes of a UTF-8 character split across tokens wait for the rest, and a tail that could still
// grow into a stop string is held back until it cannot, so a stop string never reaches the client.

/** Incremental UTF-8 decoding and stop strings of one generation. */
export class TextOutput {
  readonly #stops: readonly string[];
  readonly #longest: number;
  readonly #decoder = new TextDecoder('utf-8');
  #text = '';
  #sent = 0;
  #stopped = false;

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

  /** Everything sent so far: the generation's text. */
  get text(): string {
    return this.#text.slice(0, this.#sent);
  }

  /** Appends one token's bytes; returns the text that became final ('' when none did). */
  push(bytes: Uint8Array): string {
    if (this.#stopped) return '';
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
    this.#text += this.#decoder.decode();
    return this.#sendUpTo(this.#text.length);
  }

  #sendUpTo(end: number): string {
    if (end <= this.#sent) return '';
    const out = this.#text.slice(this.#sent, end);
    this.#sent = end;
    return out;
  }
}
