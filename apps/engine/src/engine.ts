import type { ContextMemoryRow, Device, EmbedInfo, Model } from '@hydra-engine/native-ggml';
import type { ModelRegistry } from '@hydra-engine/resolver';
import type { ConfigLayers, Params } from '@hydra-engine/tiering';
import { Runtime } from './core/runtime.js';
import { Scheduler, type SlotInfo } from './core/scheduler.js';
import { speculativeFrom } from './core/speculative.js';
import {
  type Degraded,
  type EngineCounters,
  type EngineState,
  type ExpertMode,
  type GenerationParams,
  type GenerationResult,
  type Logger,
  newCounters,
  type PeerEvents,
  type SubmitOptions,
} from './core/types.js';
import { HydraError } from './errors.js';
import { checkFitSettings, type FitSettings, type Placement } from './placement.js';

export { contextParamsFrom, modelParamsFrom, samplerParamsFrom } from './core/params.js';
export type {
  Degraded,
  EngineCounters,
  EngineState,
  ExpertMode,
  FailoverAnswer,
  FinishReason,
  GenerationParams,
  GenerationResult,
  PeerEvents,
  PeerLossEvent,
  SubmitOptions,
} from './core/types.js';

export interface EngineOptions {
  layers: ConfigLayers;
  /** Requests waiting for a slot before new ones get `HYDRA_ERR_QUEUE_FULL`. */
  maxQueue?: number;
  registry?: ModelRegistry;
  logger?: Logger;
  /** How fit is judged before a load and how `auto` splits are chosen (`--fit-target`, `--fit-prefer`). */
  fit?: FitSettings;
}

/**
 * The engine core, a facade over its runtime (model and context lifecycle, MoE standby,
 * failover: core/runtime.ts) and its scheduler (queue, `n_parallel` slots and the
 * continuous-batching loop: core/scheduler.ts).
 *
 * Seams for the control plane: {@link state}, {@link epoch}, {@link layers} (the applied
 * configuration), {@link reconfigure} (applies planned changes once idle) and {@link whenIdle}.
 */
export class Engine {
  readonly layers: ConfigLayers;
  readonly counters: EngineCounters = newCounters();
  /** The fit settings in force (validated, frozen). */
  readonly fitSettings: FitSettings;
  readonly #scheduler: Scheduler;
  readonly #runtime: Runtime;

  constructor(options: EngineOptions) {
    if (!options || typeof options !== 'object')
      throw new HydraError('HYDRA_ERR_BAD_ARGUMENT', 'options must be an object');
    const maxQueue = options.maxQueue ?? 64;
    if (!Number.isInteger(maxQueue) || maxQueue < 0) {
      throw new HydraError('HYDRA_ERR_BAD_ARGUMENT', 'options.maxQueue must be a non-negative integer');
    }
    this.layers = options.layers;
    this.fitSettings = checkFitSettings(options.fit);
    const log = options.logger ?? {
      info: (m: string) => process.stderr.write(`${m}\n`),
      warn: (m: string) => process.stderr.write(`${m}\n`),
    };
    this.#scheduler = new Scheduler({
      maxQueue,
      counters: this.counters,
      epoch: () => this.#runtime.epoch,
      // Queue the next decode step before the current one ends; HYDRA_PIPELINE=0 turns it off.
      pipeline: process.env.HYDRA_PIPELINE !== '0',
      // The speculative.* keys are T2: the context in force was built with the ones that apply.
      speculative: () => speculativeFrom(this.#runtime.builtConfig),
      // T1: read at each admission, no rebuild (llama-server's --ctx-checkpoints, --checkpoint-min-step).
      checkpoints: () => ({
        max: options.layers.get('n_ctx_checkpoints') as number,
        minStep: options.layers.get('checkpoint_min_step') as number,
      }),
      // Read at each submission, as llama-server reads --context-shift / --keep per slot.
      contextShift: () => ({
        on: options.layers.get('ctx_shift') as boolean,
        nKeep: options.layers.get('n_keep') as number,
      }),
    });
    this.#runtime = new Runtime({
      layers: options.layers,
      registry: options.registry,
      log,
      counters: this.counters,
      scheduler: this.#scheduler,
      fit: this.fitSettings,
    });
  }

  get state(): EngineState {
    return this.#runtime.state;
  }
  /** Bumped each time a configuration (model, context or settings) takes effect. */
  get epoch(): number {
    return this.#runtime.epoch;
  }
  get model(): Model | undefined {
    return this.#runtime.model;
  }
  get modelPath(): string | undefined {
    return this.#runtime.modelPath;
  }
  get placement(): Placement | undefined {
    return this.#runtime.placement;
  }
  /** llama.cpp's allocation per buffer type of the model and context in force, read when built. */
  get memory(): ContextMemoryRow[] | undefined {
    return this.#runtime.memory;
  }
  /** The configuration the loaded model and context were built with, `auto` values resolved. */
  get builtConfig(): Params | undefined {
    return this.#runtime.builtConfig;
  }
  get lastError(): string | undefined {
    return this.#runtime.lastError;
  }
  get slots(): { total: number; busy: number; nCtxSeq: number } {
    const s = this.#scheduler;
    return { total: s.nSlots, busy: s.busy, nCtxSeq: s.nCtxSeq };
  }
  /** Per slot (llama-server's `/slots`): a request runs in it, and the tokens of its cached KV. */
  slotInfo(): SlotInfo[] {
    return this.#scheduler.slotInfo();
  }
  get queueDepth(): number {
    return this.#scheduler.queueDepth;
  }
  /** Generated tokens per second over the last 10 s of decoding. */
  tokensPerSecond(now = performance.now()): number {
    return this.#scheduler.tokensPerSecond(now);
  }
  /** This process's devices; never dials a lost peer (see combine/devices.ts). */
  devices(): Device[] {
    return this.#runtime.devices();
  }
  /** Set after a peer loss until the next model load the operator asks for. */
  get degraded(): Degraded | undefined {
    return this.#runtime.degraded;
  }
  /**
   * Time since the last decode progress (ms) while a step is in flight, else undefined: a step
   * carries at most n_batch tokens, so this stays short on a live device however long the prompt.
   */
  decodeStalledMs(now = performance.now()): number | undefined {
    return this.#scheduler.decodeStalledMs(now);
  }
  /** True when MoE + COMBINE keeps both expert placements loaded. */
  get dualPlacement(): boolean {
    return this.#runtime.dualPlacement;
  }

  /**
   * Throws the error a request would get now (`HYDRA_ERR_LOADING`, `HYDRA_ERR_DRAINING`,
   * `HYDRA_ERR_NO_MODEL`) unless requests are admitted: HTTP checks it before it streams.
   */
  assertReady(): void {
    this.#runtime.requireModel();
  }

  /**
   * Loads the model named by the configuration in force (`model`: a path or registry alias),
   * registering `rpc_servers` first, then creates the context and slots. Bumps the epoch.
   */
  load(options: { onProgress?: (p: number) => void; signal?: AbortSignal } = {}): Promise<void> {
    return this.#runtime.load(options);
  }

  /** Resolves when no slot is busy and the decode loop has stopped. */
  whenIdle(): Promise<void> {
    return this.#scheduler.whenIdle();
  }

  /**
   * Applies configuration changes already recorded in {@link layers} (the control plane plans and
   * records them): `sampler`/`none` only bump the epoch; `context` waits for idle slots and
   * rebuilds the context; `model` reloads.
   */
  reconfigure(rebuild: 'none' | 'sampler' | 'context' | 'model'): Promise<void> {
    return this.#runtime.reconfigure(rebuild);
  }

  /**
   * Stops admitting queued requests (running ones continue) until every holder released.
   * @param reason names the holder in {@link holders} (and STATUS `holds`).
   * @returns this holder's release: it resumes admission once no other holder is left; a second
   *   call is a no-op.
   */
  hold(reason: string): () => void {
    const release = this.#scheduler.hold(reason);
    let released = false;
    return () => {
      if (released) return;
      released = true;
      release();
      this.#scheduler.kick();
    };
  }

  /** Who holds admission now, by reason, oldest first. */
  get holders(): { reason: string; held_ms: number }[] {
    return this.#scheduler.holders;
  }

  /** Ends every running request with `err`; queued requests stay queued. */
  endRunning(err: Error): void {
    this.#scheduler.endRunning(err);
  }

  /** Called with the busy slot count each time a slot is taken or freed. */
  onSlotsChanged(listener: (busy: number) => void): void {
    this.#scheduler.onSlotsChanged(listener);
  }

  /** The expert placement in force: set by {@link setExpertMode}, else `combined` when peers are configured. */
  get mode(): ExpertMode {
    return this.#runtime.mode;
  }

  /**
   * The MoE expert placement switch (SET_EXPERT_MODE). With both placements resident (a MoE model
   * loaded with peers) the other model and context serve from the next decode step on: between
   * two steps, the KV of every busy or cached slot is copied into the other context
   * (getSequenceState/setSequenceState, no re-prefill), then the pairs swap. Without a standby
   * placement it only records the mode. Callers validate (MoE model, peer configured) first.
   * @returns whether weights were reloaded (never, by protocol) and how many slots moved.
   */
  setExpertMode(mode: ExpertMode): Promise<{ reloaded: false; moved: number }> {
    return this.#runtime.setExpertMode(mode);
  }

  /**
   * Sets the one listener of peer losses and rejoins: the owner of {@link layers} and the deferral
   * policy (the controller). It answers each loss with what to build and writes the layers itself.
   * @throws HydraError `HYDRA_ERR_BAD_ARGUMENT` when a listener is already set.
   */
  setPeerEvents(events: PeerEvents): void {
    this.#runtime.setPeerEvents(events);
  }

  /**
   * Peer loss: tells the {@link setPeerEvents} listener (which drops `rpc_servers` from the
   * configuration and answers what to build per `failover_policy`), ends the running requests with
   * `HYDRA_ERR_PEER_LOST`, abandons (never frees) the models and contexts that used the peers and
   * loads the model as answered (SOLO or offload); queued requests run on it. Without a listener
   * nothing is reloaded. `degraded` says why until the next load the operator asks for. A decode
   * step stuck on the peer is left parked in its native thread.
   */
  failOver(reason: string, peers: string[]): Promise<void> {
    return this.#runtime.failOver(reason, peers);
  }

  /**
   * Drops an idle slot's KV and its cached tokens (llama-server's `/slots/{id}?action=erase`).
   * @returns the tokens it held.
   */
  eraseSlot(slot: number): Promise<number> {
    return this.#scheduler.eraseSlot(slot);
  }

  /**
   * A slot's saved state (see core/slot-state.ts): the tokens whose KV the slot holds, then
   * llama.cpp's sequence state. {@link setSlotState} restores it; a `cachePrompt` request on that
   * slot whose prompt starts with those tokens reuses the KV.
   */
  getSlotState(slot: number): Promise<Buffer> {
    return this.#scheduler.getSlotState(slot);
  }

  /** Restores a slot from {@link getSlotState} output (this engine or another with the same model). */
  setSlotState(slot: number, data: Uint8Array): Promise<void> {
    return this.#scheduler.setSlotState(slot, data);
  }

  /** Tokenizes a prompt the way the completion routes do (BOS per the model, specials parsed). */
  tokenize(text: string): Int32Array {
    return this.#runtime.requireModel().tokenize(text);
  }

  /** Formats chat messages with the model's template. */
  chatPrompt(messages: { role: string; content: string }[]): string {
    return this.#runtime.requireModel().applyChatTemplate(messages);
  }

  /** {@link tokenize} off the JS thread, in time linear in the text (HTTP prompts). */
  tokenizeAsync(text: string): Promise<Int32Array> {
    return this.#runtime.requireModel().tokenizeAsync(text);
  }

  /** {@link chatPrompt} off the JS thread (HTTP chat requests). */
  chatPromptAsync(messages: readonly { role: string; content: string }[] | Uint8Array): Promise<string> {
    return this.#runtime.requireModel().applyChatTemplateAsync(messages);
  }

  /** {@link chatPrompt} then {@link tokenize} in one native job (HTTP chat requests). */
  chatTokensAsync(messages: readonly { role: string; content: string }[] | Uint8Array): Promise<Int32Array> {
    return this.#runtime.requireModel().tokenizeChatAsync(messages);
  }

  /**
   * Queues a generation. Admission errors throw synchronously (`HYDRA_ERR_NO_MODEL`,
   * `HYDRA_ERR_LOADING`, `HYDRA_ERR_DRAINING`, `HYDRA_ERR_QUEUE_FULL`, `HYDRA_ERR_PROMPT_TOO_LONG`)
   * so HTTP can answer with a status before streaming starts.
   */
  submit(
    prompt: Int32Array,
    params: GenerationParams,
    options: SubmitOptions = {},
  ): Promise<GenerationResult> {
    this.#runtime.requireModel();
    return this.#scheduler.submit(prompt, params, options);
  }

  /**
   * Queues embeddings of tokenized inputs (llama-server's embedding and rerank tasks): each in a
   * free slot, between decode steps, with the context's pooling (`pooling_type`); pooled rows are
   * normalized by `normalize` (llama.cpp's embd_normalize). Admission errors throw synchronously.
   */
  embed(inputs: readonly Int32Array[], normalize: number, signal?: AbortSignal): Promise<Float32Array[]> {
    this.#runtime.requireModel();
    return this.#scheduler.embed(inputs, normalize, signal);
  }

  /** What the serving context pools and returns (undefined without one). */
  get embedInfo(): EmbedInfo | undefined {
    return this.#scheduler.ctx?.embedInfo;
  }

  /** Stops admitting, cancels queued and running requests, frees the model. */
  close(): Promise<void> {
    return this.#runtime.close();
  }
}
