/** Reads an OpenAI completion SSE stream chunk by chunk: the text, the error event, the finish reason. */
export class SseCompletion {
  text = '';
  error: { code: string } | undefined;
  finish: string | undefined;
  #buf = '';
  #first = true;
  readonly #onFirst: (() => void) | undefined;

  /** `onFirst` runs once, at the first event with a choice. */
  constructor(onFirst?: () => void) {
    this.#onFirst = onFirst;
  }

  /** Takes the next chunk of the stream's text. */
  push(chunk: string): void {
    this.#buf += chunk;
    for (let at = this.#buf.indexOf('\n\n'); at >= 0; at = this.#buf.indexOf('\n\n')) {
      const line = this.#buf.slice(0, at).replace(/^data: /, '');
      this.#buf = this.#buf.slice(at + 2);
      if (line === '[DONE]' || line === '') continue;
      const ev = JSON.parse(line);
      if (ev.error) this.error = ev.error;
      else if (ev.choices?.[0]) {
        this.text += ev.choices[0].text ?? '';
        if (ev.choices[0].finish_reason) this.finish = ev.choices[0].finish_reason;
        if (this.#first) {
          this.#first = false;
          this.#onFirst?.();
        }
      }
    }
  }

  /** The result fields, leaving out the error and finish reason when there were none. */
  result(): { text: string; error?: { code: string }; finish?: string } {
    return {
      text: this.text,
      ...(this.error ? { error: this.error } : {}),
      ...(this.finish ? { finish: this.finish } : {}),
    };
  }
}
