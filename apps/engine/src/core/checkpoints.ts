// Prompt checkpoints of one slot (llama-server's context checkpoints, common_prompt_checkpoint): the
// partial state of a recurrent or hybrid memory read right after a prompt chunk. Such a memory
// cannot drop a sequence's last positions, so a cached prefix is reused by restoring the newest
// checkpoint inside it and re-reading only the tokens after it.

/** One checkpoint: the state after the first `nTokens` tokens (positions 0..nTokens-1). */
export interface PromptCheckpoint {
  nTokens: number;
  /** LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY state bytes of the slot's sequence. */
  data: Buffer;
}

/** The `n_ctx_checkpoints` / `checkpoint_min_step` settings in force (read at each admission). */
export interface CheckpointSettings {
  /** Checkpoints kept per slot (the oldest goes first); 0: none are made. */
  max: number;
  /** Minimum spacing in tokens between checkpoints made while a long prompt is read (0: none). */
  minStep: number;
}

/**
 * Where a prompt chunk starting at `fed` should end so that a checkpoint can be taken at its end,
 * as llama-server cuts the prompt: `min(nBatch, offset)` tokens before the end for offset
 * 4 + n_ubatch and 4 (server-context.cpp checkpoint_offsets). Undefined when no cut lies ahead.
 */
export function checkpointCut(
  fed: number,
  promptLength: number,
  nBatch: number,
  nUbatch: number,
): number | undefined {
  let cut: number | undefined;
  for (const offset of [4 + nUbatch, 4]) {
    const end = promptLength - Math.min(nBatch, offset);
    if (end > fed && (cut === undefined || end < cut)) cut = end;
  }
  return cut;
}

/** One slot's checkpoints, oldest first. */
export class CheckpointList {
  #list: PromptCheckpoint[] = [];
  #bytes = 0;

  get count(): number {
    return this.#list.length;
  }
  get bytes(): number {
    return this.#bytes;
  }
  /** The token count of the newest checkpoint, or -1. */
  get lastTokens(): number {
    return this.#list.at(-1)?.nTokens ?? -1;
  }

  /**
   * Keeps `ckpt`, evicting the oldest while `max` are held (create_checkpoint). A checkpoint at or
   * before the newest one's position replaces the ones it makes stale.
   */
  add(ckpt: PromptCheckpoint, max: number): void {
    if (max <= 0) return;
    this.dropAbove(ckpt.nTokens - 1);
    while (this.#list.length >= max) this.#bytes -= this.#list.shift()!.data.length;
    this.#list.push(ckpt);
    this.#bytes += ckpt.data.length;
  }

  /** The newest checkpoint within the first `n` tokens, if any. */
  newestWithin(n: number): PromptCheckpoint | undefined {
    for (let k = this.#list.length - 1; k >= 0; k--) if (this.#list[k]!.nTokens <= n) return this.#list[k];
    return undefined;
  }

  /** Forgets the checkpoints past the first `n` tokens (the sequence no longer holds them). */
  dropAbove(n: number): void {
    while (this.#list.length > 0 && this.#list.at(-1)!.nTokens > n)
      this.#bytes -= this.#list.pop()!.data.length;
  }

  clear(): void {
    this.#list = [];
    this.#bytes = 0;
  }
}
