// The scheduler's embedding work (llama-server's embedding and rerank tasks): inputs wait here and
// run between decode steps, each in a free slot's sequence, as one native call of at most one
// ubatch of tokens, so running requests wait at most one batch for them.
import type { Context } from '@hydra-engine/native-ggml';
import { HydraError } from '../errors.js';

interface EmbedItem {
  tokens: Int32Array;
  normalize: number;
  signal: AbortSignal | undefined;
  resolve(row: Float32Array): void;
  reject(err: unknown): void;
}

/** Inputs waiting to be embedded, in arrival order. */
export class EmbedQueue {
  readonly #items: EmbedItem[] = [];
  /** Requests with inputs still waiting (what the queue limit counts). */
  #requests = 0;

  get length(): number {
    return this.#items.length;
  }

  get requests(): number {
    return this.#requests;
  }

  /** Queues one request's inputs; resolves with a row per input, in order. */
  add(inputs: readonly Int32Array[], normalize: number, signal?: AbortSignal): Promise<Float32Array[]> {
    let left = inputs.length;
    this.#requests += 1;
    const done = () => {
      if (--left === 0) this.#requests -= 1;
    };
    return Promise.all(
      inputs.map(
        (tokens) =>
          new Promise<Float32Array>((resolve, reject) => {
            this.#items.push({
              tokens,
              normalize,
              signal,
              resolve: (row) => {
                done();
                resolve(row);
              },
              reject: (err) => {
                done();
                reject(err);
              },
            });
          }),
      ),
    );
  }

  /** Rejects every waiting input with `err`. */
  rejectAll(err: Error): void {
    for (const item of this.#items.splice(0)) item.reject(err);
  }

  /**
   * Embeds the first waiting inputs that fit `seqs` and `budget` tokens (the first always fits:
   * {@link Scheduler.embed} refused longer ones) in one native call; inputs of a client that left
   * end as cancelled. An input asking another normalization waits for the next call.
   * @returns the sequences it used (emptied again), none when nothing was waiting.
   */
  async runOne(ctx: Context, seqs: readonly number[], budget: number): Promise<number[]> {
    for (let i = 0; i < this.#items.length; i++) {
      const item = this.#items[i]!;
      if (!item.signal?.aborted) continue;
      this.#items.splice(i--, 1);
      item.reject(new HydraError('HYDRA_ERR_CANCELLED', 'the client closed the request'));
    }
    const batch: EmbedItem[] = [];
    let tokens = 0;
    while (batch.length < seqs.length && this.#items.length > 0) {
      const next = this.#items[0]!;
      if (
        tokens + next.tokens.length > budget ||
        (batch.length > 0 && next.normalize !== batch[0]!.normalize)
      )
        break;
      tokens += next.tokens.length;
      batch.push(this.#items.shift()!);
    }
    if (batch.length === 0) return [];
    const used = seqs.slice(0, batch.length);
    try {
      const rows = await ctx.embed(
        batch.map((item, i) => ({ seq: used[i]!, tokens: item.tokens })),
        batch[0]!.normalize,
      );
      for (let i = 0; i < batch.length; i++) batch[i]!.resolve(rows[i]!);
    } catch (err) {
      const failure = new HydraError(
        'HYDRA_ERR_DECODE_FAILED',
        `embedding failed: ${(err as Error).message}`,
        {
          cause: err,
        },
      );
      for (const item of batch) item.reject(failure);
    }
    return used;
  }
}
