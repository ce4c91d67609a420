// The scheduler: the bounded queue, the `n_parallel` slots and the continuous-batching loop that
// assembles each decode step. It serves the model and context the runtime attaches and knows
// nothing of how they were made; the runtime holds it (hold/whenIdle) around every rebuild.
import {
  type Context,
  type DecodeEntry,
  type Model,
  NgramDrafter,
  type Sampler,
  type TokenProbs,
} from '@hydra-engine/native-ggml';
import { HydraError } from '../errors.js';
import {
  CheckpointList,
  type CheckpointSettings,
  checkpointCut,
  type PromptCheckpoint,
} from './checkpoints.js';
import { EmbedQueue } from './embed-queue.js';
import { TextOutput, type TokenProb } from './output.js';
import { decodeSlotState, encodeSlotState } from './slot-state.js';
import {
  isNativeNgram,
  mayGuessAfter,
  ngramDraft,
  SpecTally,
  type SpeculativeSettings,
  speculable,
} from './speculative.js';
import type {
  EngineCounters,
  FinishReason,
  GenerationParams,
  GenerationResult,
  SubmitOptions,
} from './types.js';

interface Job {
  prompt: Int32Array;
  params: GenerationParams;
  onText: ((text: string, probs?: TokenProb[]) => void) | undefined;
  onToken: ((token: number) => void) | undefined;
  signal: AbortSignal | undefined;
  epoch: number;
  slotId: number | undefined;
  cachePrompt: boolean;
  reuse: number;
  /** SubmitOptions.promptGroup: the first job of the group is its leader (see #leaders). */
  group: object | undefined;
  /** Set by {@link Scheduler.endRunning}: the loop ends the job with it between steps. */
  failure: Error | undefined;
  resolve(r: GenerationResult): void;
  reject(err: unknown): void;
  /** performance.now() at submission, then the queue wait once a slot took it. */
  submittedAt: number;
  queueMs: number;
  // Slot-time state.
  slot: number;
  sampler: Sampler | undefined;
  /** Admission order: prompt chunks are fed first come, first served across slots. */
  order: number;
  /** Prompt tokens whose KV is in the slot's sequence (from `reuse` up to the prompt's length). */
  fed: number;
  promptFed: boolean;
  pos: number;
  last: number;
  generated: number[];
  output: TextOutput<TokenProb>;
  /** Probabilities of the tokens whose text reached the client (GenerationParams.probs). */
  reported: TokenProb[];
  maxTokens: number;
  /** Speculative decoding of this job (the settings in force at admission), else undefined. */
  spec:
    | {
        settings: SpeculativeSettings;
        tally: SpecTally;
        /** The prompt and the tokens generated so far (what the n-gram lookup searches). */
        history: number[];
        /** Tokens guessed in the step in flight. */
        pending: number;
        /** The draft model's guess for the next step (draft_simple), made before it is assembled. */
        next?: number[];
        /** Upstream's drafter of the other n-gram types, this job's slot one of its sequences. */
        drafter?: NgramDrafter;
      }
    | undefined;
  /** Prompt checkpoints this job takes (recurrent or hybrid memory, cache_prompt), else undefined. */
  ckpt: CheckpointSettings | undefined;
  /** ctx_shift: the n_keep it shifts with (negative: the whole prompt); undefined: no shift. */
  shiftKeep: number | undefined;
  /** A shift dropped KV in the middle: the slot's KV no longer matches prompt + generated. */
  shifted: boolean;
}

/** What {@link Scheduler.slotInfo} reports of one slot. */
export interface SlotInfo {
  busy: boolean;
  /** Tokens whose KV the slot keeps for reuse (cache_prompt). */
  cachedTokens: number;
  kvCells: number;
  /** The running request is speculated (n-gram or draft-model guesses). */
  speculative: boolean;
  /** Its speculative.types (ngram_simple, draft_simple), while one runs. */
  speculativeType: string | undefined;
  /** Guessed and confirmed tokens of the running or last speculated request (llama-server's draft_n). */
  draftN: number;
  draftAccepted: number;
  /** Prompt checkpoints the slot keeps (recurrent or hybrid memory) and their bytes. */
  checkpoints: number;
  checkpointBytes: number;
}

/** One queued decode step: the jobs of its entries, in entry order. */
interface Step {
  jobs: Job[];
  /** Prompt tokens each entry feeds (0: a generated token); undefined when all are 0. */
  chunks: number[] | undefined;
  result: Promise<{
    tokens: Int32Array;
    runs?: (Int32Array | null)[];
    probs?: (TokenProbs | null)[];
    checkpoints?: (Buffer | null)[];
  }>;
  queuedAt: number;
}

const RATE_WINDOW_MS = 10_000;

/** A decode entry's probability fields for `job` (at least one candidate: the sampled token's own). */
function probsEntry(job: Job): { probs?: number; postSampling?: boolean } {
  const p = job.params.probs;
  return p ? { probs: Math.max(1, p.n), postSampling: p.postSampling } : {};
}

export interface SchedulerOptions {
  maxQueue: number;
  counters: EngineCounters;
  /** The configuration epoch in force; a job records it when admitted. */
  epoch: () => number;
  /** Queue the next step before the current one ends (see #chain). */
  pipeline: boolean;
  /** The `speculative.*` settings in force (read at each admission); undefined: off. */
  speculative?: () => SpeculativeSettings | undefined;
  /** `n_ctx_checkpoints` / `checkpoint_min_step` in force (read at each admission); undefined: none. */
  checkpoints?: () => CheckpointSettings;
  /** `ctx_shift` and `n_keep` in force (read at each submission); undefined: no context shift. */
  contextShift?: () => { on: boolean; nKeep: number };
}

/** Queue, slots and the decode loop over one attached model and context. */
export class Scheduler {
  readonly #maxQueue: number;
  readonly #counters: EngineCounters;
  readonly #epoch: () => number;
  readonly #pipeline: boolean;
  readonly #speculative: () => SpeculativeSettings | undefined;
  readonly #checkpointSettings: () => CheckpointSettings;
  readonly #contextShift: () => { on: boolean; nKeep: number };
  /** Per slot: its prompt checkpoints, freed with the slot's cache. */
  #ckpts: CheckpointList[] = [];
  /** Checkpoints #admit chose to restore before the next step (see #restoreCheckpoints). */
  readonly #restores: { job: Job; ckpt: PromptCheckpoint }[] = [];
  #nUbatch = 1;
  #model: Model | undefined;
  #ctx: Context | undefined;
  /**
   * Per token id of the attached model: its bytes, and 1/2 for not/an end of generation (0:
   * not asked yet). Each generated token would otherwise cost two native calls and a Buffer.
   */
  #pieces: (Uint8Array | undefined)[] = [];
  #eog = new Uint8Array(0);
  #nCtxSeq = 0;
  /**
   * Most guessed tokens a step may carry per slot: the context's recurrent-state snapshots
   * (n_rs_seq) on a recurrent or hybrid memory, which can drop no more rejected guesses than that;
   * unbounded on a plain KV cache.
   */
  #guessCap = Number.POSITIVE_INFINITY;
  /** Tokens one step may carry (the context's n_batch): decode tokens first, then prompt chunks. */
  #budget = 1;
  #admitted = 0;
  #slots: (Job | undefined)[] = [];
  readonly #queue: Job[] = [];
  #running = false;
  #idleWaiters: (() => void)[] = [];
  /** Tokens whose KV each slot's sequence holds (kept only for `cachePrompt` requests). */
  #cache: Int32Array[] = [];
  /** Per slot: the guess tally of its running or last speculated request. */
  #specTally: (SpecTally | undefined)[] = [];
  /** The draft model's context (speculative.types draft_simple), one sequence per slot. */
  #draft: Context | undefined;
  /** Per slot: the tokens whose KV the draft context's sequence holds. */
  #draftKv: number[][] = [];
  /**
   * The n-gram drafter of the settings in force (one sequence per slot), replaced when they change;
   * a job keeps the one it started with, and a dropped one is freed by its finalizer.
   */
  #ngram: { key: string; drafter: NgramDrafter } | undefined;
  /** Who holds admission (see {@link hold}), by token, with the reason and since when. */
  readonly #holders = new Map<number, { reason: string; since: number }>();
  #holdSeq = 0;
  /** Bumped when the attached pair is abandoned: a decode loop of an older generation stops. */
  #gen = 0;
  #decodeSince: number | undefined;
  readonly #tasks: (() => Promise<void>)[] = [];
  /** Decode steps queued or running; KV and sampler cleanups wait for 0 (#afterStep). */
  #stepsInFlight = 0;
  readonly #afterSteps: (() => void)[] = [];
  #lastStepEnd = 0;
  readonly #slotListeners: ((busy: number) => void)[] = [];
  readonly #rate: { at: number; tokens: number }[] = [];
  readonly #embeds = new EmbedQueue();
  /** The job that prefills for each prompt group (SubmitOptions.promptGroup). */
  readonly #leaders = new WeakMap<object, Job>();

  constructor(options: SchedulerOptions) {
    this.#maxQueue = options.maxQueue;
    this.#counters = options.counters;
    this.#epoch = options.epoch;
    this.#pipeline = options.pipeline;
    this.#speculative = options.speculative ?? (() => undefined);
    this.#checkpointSettings = options.checkpoints ?? (() => ({ max: 0, minStep: 0 }));
    this.#contextShift = options.contextShift ?? (() => ({ on: false, nKeep: 0 }));
  }

  /** The context steps run on, if one is attached. */
  get ctx(): Context | undefined {
    return this.#ctx;
  }
  get held(): boolean {
    return this.#holders.size > 0;
  }
  /** The current holders of admission, oldest first (a forgotten release shows here). */
  get holders(): { reason: string; held_ms: number }[] {
    const now = performance.now();
    return [...this.#holders.values()].map((h) => ({ reason: h.reason, held_ms: Math.round(now - h.since) }));
  }
  get nSlots(): number {
    return this.#slots.length;
  }
  get nCtxSeq(): number {
    return this.#nCtxSeq;
  }
  get busy(): number {
    let n = 0;
    for (const s of this.#slots) if (s) n += 1;
    return n;
  }
  get queueDepth(): number {
    return this.#queue.length;
  }

  /** Serves `ctx` from the next step on, with empty slots sized to it (a new context). */
  attach(model: Model, ctx: Context, draft?: Context): void {
    this.#model = model;
    this.#ctx = ctx;
    this.#draft = draft;
    this.#draftKv = [];
    this.#forgetTokens();
    const info = ctx.info;
    this.#nCtxSeq = info.nCtxSeq;
    this.#guessCap = model.info.recurrent ? info.nRsSeq : Number.POSITIVE_INFINITY;
    this.#budget = Math.max(1, info.nBatch);
    this.#slots = new Array(info.nSeqMax).fill(undefined);
    this.#cache = this.#slots.map(() => new Int32Array(0));
    this.#ckpts = this.#slots.map(() => new CheckpointList());
    this.#nUbatch = Math.max(1, info.nUbatch);
    this.#specTally = [];
  }

  /** Serves another pair with the same slots and KV (the KV was copied over by the caller). */
  swap(model: Model, ctx: Context): void {
    this.#model = model;
    this.#ctx = ctx;
    this.#guessCap = model.info.recurrent ? ctx.info.nRsSeq : Number.POSITIVE_INFINITY;
    this.#forgetTokens();
    // Another context: a partial state read from the old one is not restored into it.
    for (const c of this.#ckpts) c.clear();
  }

  #forgetTokens(): void {
    this.#pieces = [];
    this.#eog = new Uint8Array(this.#model?.info.nVocab ?? 0);
  }

  #isEog(token: number): boolean {
    let v = this.#eog[token];
    if (v === undefined) return this.#model!.isEndOfGeneration(token);
    if (v === 0) {
      v = this.#model!.isEndOfGeneration(token) ? 2 : 1;
      this.#eog[token] = v;
    }
    return v === 2;
  }

  #piece(token: number): Uint8Array {
    let bytes = this.#pieces[token];
    if (bytes === undefined) {
      bytes = this.#model!.tokenBytes(token);
      this.#pieces[token] = bytes;
    }
    return bytes;
  }

  /** Stops serving the attached context (call once idle); returns it for the caller to free. */
  detach(): Context | undefined {
    const ctx = this.#ctx;
    this.#ctx = undefined;
    this.#model = undefined;
    this.#draft = undefined;
    this.#slots = [];
    this.#cache = [];
    this.#ckpts = [];
    return ctx;
  }

  /**
   * Per slot: whether a request runs in it, the tokens whose KV it keeps for reuse, and the KV
   * cells its sequence holds now (from this loop's own counts: llama.cpp's are written by the
   * decode thread while a step runs).
   */
  slotInfo(): SlotInfo[] {
    return this.#slots.map((job, i) => {
      const tally = this.#specTally[i];
      return {
        busy: job !== undefined,
        cachedTokens: this.#cache[i]?.length ?? 0,
        kvCells: job ? (job.promptFed ? job.pos : job.fed) : (this.#cache[i]?.length ?? 0),
        speculative: job?.spec !== undefined,
        speculativeType: job?.spec?.settings.type,
        draftN: tally?.drafted ?? 0,
        draftAccepted: tally?.accepted ?? 0,
        checkpoints: this.#ckpts[i]?.count ?? 0,
        checkpointBytes: this.#ckpts[i]?.bytes ?? 0,
      };
    });
  }

  /** Slots that are running a request or hold cached KV (what a KV move must carry). */
  slotsInUse(): number[] {
    const out: number[] = [];
    for (let i = 0; i < this.#slots.length; i++)
      if (this.#slots[i] || (this.#cache[i]?.length ?? 0) > 0) out.push(i);
    return out;
  }

  /**
   * The attached pair is lost (a peer died under it): every running request is rejected with
   * `err`, a step parked on it is forgotten and nothing is freed (the caller keeps the pair).
   */
  abandon(err: Error): void {
    this.#gen += 1;
    this.#running = false;
    this.#decodeSince = undefined;
    this.#stepsInFlight = 0;
    this.#afterSteps.length = 0;
    for (const job of this.#slots) {
      if (!job) continue;
      // Its sampler may be in use by the parked decode: not freed either.
      this.#counters.requests.error += 1;
      job.reject(err);
    }
    this.#ctx = undefined;
    this.#model = undefined;
    this.#draft = undefined;
    this.#slots = [];
    this.#cache = [];
    this.#ckpts = [];
    this.#restores.length = 0;
    this.#slotsChanged();
    for (const w of this.#idleWaiters.splice(0)) w();
  }

  /** Rejects every queued request with `err`. */
  rejectQueued(err: Error): void {
    for (const job of this.#queue.splice(0)) job.reject(err);
    this.#embeds.rejectAll(err);
  }

  /** Ends queued requests as cancelled and asks running ones to stop at the next step. */
  cancelAll(): void {
    for (const job of this.#queue.splice(0)) this.#finish(job, 'cancelled');
    this.#embeds.rejectAll(new HydraError('HYDRA_ERR_CANCELLED', 'the engine cancelled every request'));
    for (const job of this.#slots) if (job) job.signal = AbortSignal.abort();
  }

  /** Generated tokens per second over the last 10 s of decoding. */
  tokensPerSecond(now = performance.now()): number {
    while (this.#rate.length > 0 && this.#rate[0]!.at < now - RATE_WINDOW_MS) this.#rate.shift();
    if (this.#rate.length === 0) return 0;
    let tokens = 0;
    for (const r of this.#rate) tokens += r.tokens;
    const span = Math.max(now - this.#rate[0]!.at, 1);
    return (tokens * 1000) / span;
  }

  /** How long the decode step in flight has run (ms), or undefined between steps. */
  decodeStalledMs(now = performance.now()): number | undefined {
    return this.#decodeSince === undefined ? undefined : now - this.#decodeSince;
  }

  /** Resolves when no slot is busy and the decode loop has stopped. */
  whenIdle(): Promise<void> {
    if (!this.#running && this.#slots.every((s) => !s)) return Promise.resolve();
    return new Promise((resolve) => this.#idleWaiters.push(resolve));
  }

  /**
   * Stops admitting queued requests (running ones continue) until every holder released. Each
   * holder gets its own release: calling it again is a no-op, so one holder can never end
   * another's hold. Releasing does not start the loop ({@link kick} does, once the caller is ready).
   */
  hold(reason: string): () => void {
    const token = ++this.#holdSeq;
    this.#holders.set(token, { reason, since: performance.now() });
    return () => {
      this.#holders.delete(token);
    };
  }

  /** Starts the decode loop if it is not running (new work, a new context, a resume). */
  kick(): void {
    void this.#run();
  }

  /** Ends every running request with `err`; queued requests stay queued. */
  endRunning(err: Error): void {
    for (const job of this.#slots) if (job) job.failure = err;
    this.kick();
  }

  /** Runs `fn` between decode steps (KV sequence operations must not race a decode). */
  exclusive<T>(fn: () => Promise<T>): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      this.#tasks.push(() => fn().then(resolve, reject));
      this.kick();
    });
  }

  /** Called with the busy slot count each time a slot is taken or freed. */
  onSlotsChanged(listener: (busy: number) => void): void {
    this.#slotListeners.push(listener);
  }

  #slotsChanged(): void {
    const busy = this.busy;
    for (const l of this.#slotListeners) l(busy);
  }

  /** Queues a generation (the caller checked that a model is ready); see `Engine.submit`. */
  submit(prompt: Int32Array, params: GenerationParams, options: SubmitOptions): Promise<GenerationResult> {
    if (prompt.length === 0) throw new HydraError('HYDRA_ERR_BAD_REQUEST', 'the prompt is empty');
    if (prompt.length >= this.#nCtxSeq) {
      throw new HydraError(
        'HYDRA_ERR_PROMPT_TOO_LONG',
        `the prompt has ${prompt.length} tokens; a slot holds ${this.#nCtxSeq} (n_ctx / n_parallel)`,
      );
    }
    if (
      options.slot !== undefined &&
      (!Number.isInteger(options.slot) || options.slot < 0 || options.slot >= this.#slots.length)
    ) {
      throw new HydraError(
        'HYDRA_ERR_BAD_VALUE',
        `slot_id must be an integer in 0..${this.#slots.length - 1}`,
        {
          keys: ['slot_id'],
        },
      );
    }
    // llama-server's --context-shift: a bounded generation goes on past the slot's context instead
    // of stopping there (an unbounded one still stops there: it would never end otherwise).
    const shift = this.#contextShift();
    const shiftKeep =
      shift.on &&
      params.maxTokens < Number.MAX_SAFE_INTEGER &&
      prompt.length + params.maxTokens > this.#nCtxSeq
        ? (params.nKeep ?? shift.nKeep)
        : undefined;
    if (shiftKeep !== undefined && this.#ctx && !this.#ctx.canShift) {
      throw new HydraError(
        'HYDRA_ERR_UNSUPPORTED_FIELD',
        "ctx_shift: this model's memory (recurrent or hybrid) cannot shift positions (llama_memory_can_shift)",
        { keys: ['ctx_shift'] },
      );
    }
    const freeSlot = this.#holders.size === 0 && this.#slots.some((s) => !s);
    if (!freeSlot && this.#queue.length >= this.#maxQueue) {
      this.#counters.rejectedQueueFull += 1;
      throw new HydraError(
        'HYDRA_ERR_QUEUE_FULL',
        `all ${this.#slots.length} slots busy and ${this.#queue.length} requests queued`,
      );
    }
    return new Promise<GenerationResult>((resolve, reject) => {
      const job: Job = {
        prompt,
        params,
        onText: options.onText,
        onToken: options.onToken,
        signal: options.signal,
        epoch: this.#epoch(),
        slotId: options.slot,
        cachePrompt: options.cachePrompt === true,
        reuse: 0,
        group: options.promptGroup,
        failure: undefined,
        resolve,
        reject,
        submittedAt: performance.now(),
        queueMs: 0,
        slot: -1,
        sampler: undefined,
        order: 0,
        fed: 0,
        promptFed: false,
        pos: 0,
        last: -1,
        generated: [],
        output: new TextOutput<TokenProb>(params.stop),
        reported: [],
        maxTokens:
          shiftKeep === undefined
            ? Math.max(0, Math.min(params.maxTokens, this.#nCtxSeq - prompt.length))
            : params.maxTokens,
        spec: undefined,
        ckpt: undefined,
        shiftKeep,
        shifted: false,
      };
      if (options.signal) {
        options.signal.addEventListener(
          'abort',
          () => {
            const at = this.#queue.indexOf(job);
            if (at >= 0) {
              this.#queue.splice(at, 1);
              this.#finish(job, 'cancelled');
            }
          },
          { once: true },
        );
      }
      if (job.group && !this.#leaders.has(job.group)) this.#leaders.set(job.group, job);
      this.#queue.push(job);
      this.kick();
    });
  }

  /**
   * The slot whose sequence holds `job`'s prompt to copy from (its group's leader, prefilled), -1
   * when it must prefill alone, undefined while the leader is still queued or prefilling.
   */
  #shareFrom(job: Job): number | undefined {
    const leader = job.group ? this.#leaders.get(job.group) : undefined;
    if (!leader || leader === job || this.#model!.info.recurrent) return -1;
    if (leader.prompt.length !== job.prompt.length || job.prompt.length < 2) return -1;
    if (this.#slots[leader.slot] !== leader) return this.#queue.includes(leader) ? undefined : -1;
    return leader.promptFed ? leader.slot : undefined;
  }

  /**
   * Queues embeddings (llama-server's embedding and rerank tasks): each input runs in a free slot's
   * sequence, between decode steps, in native calls of at most one ubatch (see core/embed-queue.ts).
   * With the context's pooling, a row per input normalized by `normalize` (common_embd_normalize);
   * rank pooling, the scores; none, every token's row.
   */
  embed(inputs: readonly Int32Array[], normalize: number, signal?: AbortSignal): Promise<Float32Array[]> {
    const ctx = this.#ctx;
    if (!ctx) throw new HydraError('HYDRA_ERR_NO_MODEL', 'no model is loaded');
    const { nBatch, nUbatch } = ctx.info;
    const limit = Math.min(nBatch, nUbatch);
    for (let i = 0; i < inputs.length; i++) {
      const n = inputs[i]!.length;
      if (n === 0)
        throw new HydraError('HYDRA_ERR_BAD_REQUEST', 'Input content cannot be empty', { keys: ['input'] });
      // A pooled input split across ubatches would pool its last piece only (llama-server's check).
      if (n > limit)
        throw new HydraError(
          'HYDRA_ERR_PROMPT_TOO_LONG',
          `input ${i} (${n} tokens) is too large to process. increase the physical batch size (current batch size: ${limit})`,
          { keys: ['input'] },
        );
    }
    if (this.#embeds.requests >= this.#maxQueue) {
      this.#counters.rejectedQueueFull += 1;
      throw new HydraError('HYDRA_ERR_QUEUE_FULL', `${this.#embeds.requests} embedding requests queued`);
    }
    const rows = this.#embeds.add(inputs, normalize, signal);
    this.kick();
    return rows;
  }

  /** One batch of queued embeddings over the free slots (their cached KV is given up). */
  async #embedStep(): Promise<void> {
    const free: number[] = [];
    for (let i = 0; i < this.#slots.length; i++) if (!this.#slots[i]) free.push(i);
    // Slots that keep no prompt cache first.
    free.sort((a, b) => (this.#cache[a]?.length ?? 0) - (this.#cache[b]?.length ?? 0));
    const used = await this.#embeds.runOne(
      this.#ctx!,
      free,
      Math.min(this.#ctx!.info.nBatch, this.#ctx!.info.nUbatch),
    );
    for (const i of used) {
      this.#cache[i] = new Int32Array(0);
      this.#ckpts[i]?.clear();
    }
  }

  #embedsRunnable(): boolean {
    return this.#embeds.length > 0 && this.#holders.size === 0 && this.#slots.some((s) => !s);
  }

  /** A free slot for `job`: its own when pinned, else an empty one first, else any. */
  #slotFor(job: Job): number {
    if (job.slotId !== undefined) return this.#slots[job.slotId] ? -1 : job.slotId;
    let any = -1;
    for (let i = 0; i < this.#slots.length; i++) {
      if (this.#slots[i]) continue;
      if ((this.#cache[i]?.length ?? 0) === 0) return i;
      if (any < 0) any = i;
    }
    return any;
  }

  #admit(): void {
    if (this.#holders.size > 0) return;
    const model = this.#model!;
    const ctx = this.#ctx!;
    let changed = false;
    for (let q = 0; q < this.#queue.length; q++) {
      const job = this.#queue[q]!;
      const share = this.#shareFrom(job);
      if (share === undefined) continue;
      const i = this.#slotFor(job);
      if (i < 0) continue;
      this.#queue.splice(q--, 1);
      if (job.maxTokens === 0) {
        this.#finish(job, 'length');
        continue;
      }
      const cached = this.#cache[i] ?? new Int32Array(0);
      let reuse = 0;
      if (share >= 0) {
        // A copy across KV streams (kv_unified off) must take the whole sequence: the leader's
        // generated tail is dropped after. The last prompt token is decoded again for this
        // job's own first sample. No step is in flight here (admission runs between steps).
        ctx.removeSequence(i, -1, -1);
        ctx.copySequence(share, i, -1, -1);
        if (ctx.removeSequence(i, job.prompt.length - 1, -1)) reuse = job.prompt.length - 1;
        else ctx.removeSequence(i, -1, -1);
      } else if (job.cachePrompt) {
        const limit = Math.min(cached.length, job.prompt.length - 1);
        while (reuse < limit && cached[reuse] === job.prompt[reuse]) reuse++;
      }
      // A recurrent or hybrid memory keeps no per-position history: llama_memory_seq_rm refuses a
      // partial range and leaves the sequence as it was. The newest prompt checkpoint inside the
      // common prefix is restored before the next step (#restoreCheckpoints); without one the
      // prompt is read again from scratch.
      const ckpts = this.#ckpts[i];
      const ckptSettings = model.info.recurrent ? this.#checkpointSettings() : undefined;
      if (ckptSettings !== undefined && ckptSettings.max === 0) ckpts?.clear();
      if (share >= 0) {
        this.#cache[i] = new Int32Array(0);
        ckpts?.clear();
      } else if (!ctx.removeSequence(i, reuse, -1)) {
        const ckpt = reuse > 0 ? ckpts?.newestWithin(reuse) : undefined;
        if (ckpt) {
          reuse = ckpt.nTokens;
          ckpts!.dropAbove(reuse);
          this.#cache[i] = cached.subarray(0, reuse);
          this.#restores.push({ job, ckpt });
        } else {
          ctx.removeSequence(i, -1, -1);
          reuse = 0;
          this.#cache[i] = new Int32Array(0);
          ckpts?.clear();
        }
      } else {
        this.#cache[i] = cached.subarray(0, reuse);
        ckpts?.dropAbove(reuse);
      }
      // Never on a plain KV model: its sequence can be trimmed to any prefix.
      job.ckpt =
        ckptSettings !== undefined && ckptSettings.max > 0 && job.cachePrompt ? ckptSettings : undefined;
      job.reuse = reuse;
      job.fed = reuse;
      job.order = this.#admitted++;
      job.slot = i;
      job.queueMs = performance.now() - job.submittedAt;
      // The configuration that serves it is the one in force at admission, not at submission.
      job.epoch = this.#epoch();
      changed = true;
      job.sampler = model.createSampler(job.params.sampler);
      if (
        (job.params.sampler.penaltyRepeat ?? 1) !== 1 ||
        job.params.sampler.penaltyFreq ||
        job.params.sampler.penaltyPresent
      ) {
        job.sampler.accept(job.prompt);
      }
      // Probabilities are computed one token a step (llama-server reports none for drafted tokens).
      // A shift would move the target's positions under the drafter's: a shifting job is not speculated.
      // A recurrent memory drops rejected guesses only through its rollback snapshots (n_rs_seq).
      const unspeculable =
        this.#guessCap < 1 ||
        !speculable(job.params.sampler) ||
        job.params.probs !== undefined ||
        job.shiftKeep !== undefined;
      const spec = unspeculable ? undefined : this.#speculative();
      if (spec && (spec.type !== 'draft_simple' || this.#draft !== undefined))
        job.spec = { settings: spec, tally: new SpecTally(), history: Array.from(job.prompt), pending: 0 };
      if (job.spec && isNativeNgram(spec!)) {
        job.spec.drafter = this.#ngramDrafter(spec);
        job.spec.drafter.begin(i, job.prompt);
      }
      this.#specTally[i] = job.spec?.tally;
      this.#slots[i] = job;
    }
    if (changed) this.#slotsChanged();
  }

  /**
   * Restores the checkpoints #admit chose (a partial state: the recurrent part), then drops the
   * attention KV after each: the recurrent part now ends at the checkpoint, so that removal is no
   * longer partial for it. Anything that does not add up reads the job's prompt from scratch.
   */
  async #restoreCheckpoints(gen: number): Promise<void> {
    const ctx = this.#ctx!;
    for (const { job, ckpt } of this.#restores.splice(0)) {
      let ok: boolean;
      try {
        ok = (await ctx.setSequenceState(job.slot, ckpt.data, { partial: true })) > 0;
      } catch {
        ok = false;
      }
      if (gen !== this.#gen) return;
      ok =
        ok &&
        ctx.removeSequence(job.slot, ckpt.nTokens, -1) &&
        ctx.sequenceEnd(job.slot) === ckpt.nTokens - 1;
      if (ok) {
        this.#counters.checkpointRestores += 1;
        continue;
      }
      ctx.removeSequence(job.slot, -1, -1);
      job.reuse = 0;
      job.fed = 0;
      this.#cache[job.slot] = new Int32Array(0);
      this.#ckpts[job.slot]?.clear();
    }
  }

  async #run(): Promise<void> {
    if (this.#running) return;
    this.#running = true;
    const gen = this.#gen;
    // A step already queued behind the current one (see #chain); it becomes the next current step.
    let ahead: Step | undefined;
    try {
      for (;;) {
        let step: Step;
        if (ahead) {
          step = ahead;
          ahead = undefined;
        } else {
          while (this.#tasks.length > 0) {
            await this.#tasks.shift()!();
            if (gen !== this.#gen) return;
          }
          if (!this.#ctx) break;
          this.#admit();
          if (this.#restores.length > 0) {
            await this.#restoreCheckpoints(gen);
            if (gen !== this.#gen) return;
          }
          if (this.#embedsRunnable()) {
            await this.#embedStep();
            if (gen !== this.#gen) return;
            if (!this.#ctx) break;
          }
          if (this.#draft) {
            await this.#draftStep(gen);
            if (gen !== this.#gen) return;
          }
          const next = this.#assemble();
          if (!next) {
            if (
              this.#tasks.length === 0 &&
              (this.#queue.length === 0 || this.#holders.size > 0) &&
              !this.#embedsRunnable()
            )
              break;
            continue;
          }
          step = this.#decode(this.#ctx, next.jobs, next.entries, next.chunks);
        }
        ahead = this.#chain(step);
        let out: {
          tokens: Int32Array;
          runs?: (Int32Array | null)[];
          probs?: (TokenProbs | null)[];
          checkpoints?: (Buffer | null)[];
        };
        // A step queued ahead starts on the device when the one before it ends.
        const started = Math.max(step.queuedAt, this.#lastStepEnd);
        this.#decodeSince = started;
        try {
          out = await step.result;
        } catch (err) {
          if (gen !== this.#gen) return;
          this.#decodeSince = undefined;
          const failure = new HydraError(
            'HYDRA_ERR_DECODE_FAILED',
            `decode failed: ${(err as Error).message}`,
            {
              cause: err,
            },
          );
          for (const job of step.jobs) if (this.#slots[job.slot] === job) this.#release(job, failure);
          // The step queued behind it follows tokens that were never sampled: it fails too.
          if (ahead) await ahead.result.catch(() => undefined);
          ahead = undefined;
          continue;
        }
        if (gen !== this.#gen) return;
        const t1 = performance.now();
        this.#decodeSince = ahead ? t1 : undefined;
        this.#counters.decodeSteps += 1;
        this.#counters.decodeSeconds += (t1 - started) / 1000;
        this.#lastStepEnd = t1;
        let served = 0;
        const chunks = step.chunks;
        for (let i = 0; i < step.jobs.length; i++) {
          const job = step.jobs[i]!;
          // A job that ended at the step before (stop, EOS) still had an entry in this one: dropped.
          if (this.#slots[job.slot] !== job) {
            this.#counters.decodeEntriesWasted += 1;
            continue;
          }
          const chunk = chunks === undefined ? 0 : chunks[i]!;
          if (chunk > 0) {
            job.fed += chunk;
            this.#counters.promptTokens += chunk;
            this.#counters.promptChunks += 1;
            const state = out.checkpoints?.[i];
            if (state && job.ckpt) {
              this.#ckpts[job.slot]?.add({ nTokens: job.fed, data: state }, job.ckpt.max);
              this.#counters.checkpointsCreated += 1;
            }
            if (job.fed < job.prompt.length) {
              // An intermediate chunk samples nothing; a cancel or failure ends the prefill here.
              if (job.failure) this.#release(job, job.failure);
              else if (job.signal?.aborted) this.#release(job, 'cancelled');
              continue;
            }
          }
          served += 1;
          const run = out.runs?.[i];
          if (job.failure) this.#release(job, job.failure);
          else if (run) served += this.#advanceRun(job, run) - 1;
          else this.#advance(job, out.tokens[i]!, out.probs?.[i]);
        }
        this.#rate.push({ at: t1, tokens: served });
        // Trimmed here too: nothing else reads it unless /metrics is asked.
        while (this.#rate[0]!.at < t1 - RATE_WINDOW_MS) this.#rate.shift();
      }
    } finally {
      if (gen === this.#gen) {
        this.#running = false;
        if (this.#slots.every((s) => !s)) for (const w of this.#idleWaiters.splice(0)) w();
      }
    }
  }

  /**
   * The next step's entries: the next token of every generating slot first, then prompt chunks of
   * prefilling slots in admission order up to the budget (n_batch), so a long prompt is fed over
   * several steps and never holds the running streams for longer than one budget-sized step. Only
   * the chunk that ends a prompt samples; the others ask for no output. Ends cancelled and failed
   * jobs on the way.
   */
  #assemble(): { jobs: Job[]; entries: DecodeEntry[]; chunks: number[] | undefined } | undefined {
    const jobs: Job[] = [];
    const entries: DecodeEntry[] = [];
    let decodeTokens = 0;
    let prefill: Job[] | undefined;
    for (const job of this.#slots) {
      if (!job) continue;
      if (job.failure) {
        this.#release(job, job.failure);
        continue;
      }
      if (job.signal?.aborted) {
        this.#release(job, 'cancelled');
        continue;
      }
      if (job.promptFed) {
        if (job.shiftKeep !== undefined && job.pos + 1 >= this.#nCtxSeq) this.#shiftContext(job);
        jobs.push(job);
        const draft = this.#draftFor(job);
        if (draft.length > 0) {
          const tokens = new Int32Array(draft.length + 1);
          tokens[0] = job.last;
          tokens.set(draft, 1);
          entries.push({ seq: job.slot, pos: job.pos, tokens, sampler: job.sampler!, draft: draft.length });
          this.#counters.specDrafted += draft.length;
          this.#counters.specByType.drafted[job.spec!.settings.type]! += draft.length;
          decodeTokens += draft.length + 1;
        } else {
          entries.push({
            seq: job.slot,
            pos: job.pos,
            tokens: Int32Array.of(job.last),
            sampler: job.sampler!,
            ...probsEntry(job),
          });
          decodeTokens += 1;
        }
      } else {
        prefill ??= [];
        prefill.push(job);
      }
    }
    if (!prefill) return entries.length === 0 ? undefined : { jobs, entries, chunks: undefined };
    const chunks: number[] = new Array(jobs.length).fill(0);
    if (prefill.length > 1) prefill.sort((a, b) => a.order - b.order);
    // At least one prompt token per step, so prompts advance even when decodes fill the budget.
    let room = Math.max(1, this.#budget - decodeTokens);
    for (const job of prefill) {
      if (room === 0) break;
      let n = Math.min(job.prompt.length - job.fed, room);
      let checkpoint = false;
      if (job.ckpt) {
        // As llama-server: a chunk ends a few tokens before the prompt's end (and n_ubatch before
        // that) so a checkpoint there survives a next turn that diverges at the reply; while a
        // long prompt is read, one every checkpoint_min_step tokens.
        const cut = checkpointCut(job.fed, job.prompt.length, this.#budget, this.#nUbatch);
        const end = job.fed + n;
        if (cut !== undefined && end >= cut) {
          n = cut - job.fed;
          checkpoint = true;
        } else if (end < job.prompt.length) {
          const last = Math.max(0, this.#ckpts[job.slot]?.lastTokens ?? 0);
          checkpoint = end - last >= Math.max(1, job.ckpt.minStep);
        }
      }
      room -= n;
      const tokens = job.prompt.subarray(job.fed, job.fed + n);
      jobs.push(job);
      chunks.push(n);
      entries.push(
        job.fed + n === job.prompt.length
          ? { seq: job.slot, pos: job.fed, tokens, sampler: job.sampler!, ...probsEntry(job) }
          : { seq: job.slot, pos: job.fed, tokens, ...(checkpoint ? { checkpoint: true } : {}) },
      );
    }
    return { jobs, entries, chunks };
  }

  /**
   * llama-server's context shift (pre_decode in server-context.cpp): keeps the first n_keep tokens
   * (+1 with a BOS, at most n_ctx - 4), drops half of the rest and moves the tail down over them.
   */
  #shiftContext(job: Job): void {
    const ctx = this.#ctx!;
    let nKeep = job.shiftKeep! < 0 ? job.prompt.length : job.shiftKeep!;
    if (this.#model?.info.addBos) nKeep += 1;
    nKeep = Math.min(this.#nCtxSeq - 4, nKeep);
    const nLeft = job.pos - nKeep;
    const nDiscard = Math.min(Math.max(0, Math.floor(nLeft / 2)), Math.max(0, nLeft - 1));
    ctx.removeSequence(job.slot, nKeep, nKeep + nDiscard);
    ctx.shiftSequence(job.slot, nKeep + nDiscard, job.pos, -nDiscard);
    job.pos -= nDiscard;
    job.shifted = true;
  }

  #decode(ctx: Context, jobs: Job[], entries: DecodeEntry[], chunks: number[] | undefined): Step {
    this.#stepsInFlight += 1;
    const gen = this.#gen;
    const result = ctx.decode(entries);
    const settled = (): void => {
      // A step parked on a lost peer never settles; abandon() starts the count again.
      if (gen !== this.#gen) return;
      this.#stepsInFlight -= 1;
      if (this.#stepsInFlight === 0) for (const cleanup of this.#afterSteps.splice(0)) cleanup();
    };
    result.then(settled, settled);
    return { jobs, chunks, result, queuedAt: performance.now() };
  }

  /**
   * Queues the next step before `step` ends when its make-up is already known: every job goes on
   * generating and nothing waits to be admitted or run between steps. Each entry feeds the token
   * its sequence samples in `step` (`follow`), so the device starts the next step the moment the
   * current one ends instead of waiting for the JS thread to see the result and answer. A job that
   * stops early (EOS, a stop string, a cancel) wastes that one entry; its KV position is dropped.
   * A job that reaches its token limit in `step` is left out of the next one.
   * Not while a prompt is still being fed: its next chunk must go in the next step.
   */
  #chain(step: Step): Step | undefined {
    if (!this.#pipeline || !this.#ctx || this.#tasks.length > 0 || this.#embedsRunnable()) return undefined;
    if (this.#queue.length > 0 && this.#holders.size === 0 && this.#slots.some((s) => !s)) return undefined;
    let active = 0;
    for (const s of this.#slots) if (s) active += 1;
    if (active !== step.jobs.length) return undefined;
    const jobs: Job[] = [];
    const entries: DecodeEntry[] = [];
    const chunks = step.chunks;
    for (let i = 0; i < step.jobs.length; i++) {
      const job = step.jobs[i]!;
      if (this.#slots[job.slot] !== job || job.failure || job.signal?.aborted || !job.sampler)
        return undefined;
      if (chunks !== undefined && job.fed + chunks[i]! < job.prompt.length) return undefined;
      // Its next step may carry a guess made from the token this step samples.
      const spec = job.spec;
      // A guess in `step` moves the slot's position by the tokens it confirms: unknown until it ends.
      if (spec && spec.pending > 0) return undefined;
      if (
        spec &&
        !spec.tally.pausedAt(job.generated.length + 1) &&
        (spec.settings.type !== 'ngram_simple' || mayGuessAfter(spec.history, spec.settings))
      )
        return undefined;
      // At its token limit once `step` ends (the limit is clipped to the slot's context): it
      // finishes there, and the others go on without a round trip through the JS thread.
      if (job.generated.length + 1 >= job.maxTokens) continue;
      const pos = job.promptFed ? job.pos + 1 : job.prompt.length;
      // Its next step shifts the context first (#assemble), between steps.
      if (job.shiftKeep !== undefined && pos + 1 >= this.#nCtxSeq) return undefined;
      if (pos >= this.#nCtxSeq) continue;
      jobs.push(job);
      entries.push({ seq: job.slot, pos, follow: true, sampler: job.sampler, ...probsEntry(job) });
    }
    if (entries.length === 0) return undefined;
    this.#counters.decodeStepsAhead += 1;
    return this.#decode(this.#ctx, jobs, entries, undefined);
  }

  #advance(job: Job, token: number, probs?: TokenProbs | null): void {
    if (!job.promptFed) {
      job.promptFed = true;
      job.pos = job.prompt.length;
    } else {
      job.pos += 1;
    }
    if (job.signal?.aborted) {
      this.#release(job, 'cancelled');
      return;
    }
    if (!job.params.ignoreEos && this.#isEog(token)) {
      this.#send(job, job.output.end());
      this.#release(job, 'stop');
      return;
    }
    job.generated.push(token);
    job.spec?.history.push(token);
    job.last = token;
    job.onToken?.(token);
    this.#counters.generatedTokens += 1;
    this.#send(
      job,
      job.output.push(this.#piece(token), probs ? this.#tokenProb(job, token, probs) : undefined),
    );
    if (job.output.stopped) {
      this.#release(job, 'stop');
      return;
    }
    if (job.generated.length >= job.maxTokens) {
      this.#send(job, job.output.end());
      this.#release(job, 'length');
    }
  }

  /**
   * The guess for `job`'s next step (n-gram lookup in its own history): none when speculation is
   * off or paused for it, and never past its token limit, its context or one step's budget.
   */
  #ngramDrafter(s: Extract<SpeculativeSettings, { type: NgramDrafter['type'] }>): NgramDrafter {
    const key = `${JSON.stringify(s)}/${this.#slots.length}`;
    if (this.#ngram?.key !== key) {
      const { type, ...params } = s;
      this.#ngram = { key, drafter: new NgramDrafter(type, params, this.#slots.length) };
    }
    return this.#ngram.drafter;
  }

  #draftFor(job: Job): number[] {
    const spec = job.spec;
    if (!spec || !spec.tally.mayDraft(job.generated.length)) return [];
    const limit = Math.min(
      job.maxTokens - job.generated.length - 1,
      this.#nCtxSeq - job.pos - 1,
      this.#budget - 1,
      this.#guessCap,
    );
    const draft =
      spec.settings.type === 'ngram_simple'
        ? ngramDraft(spec.history, spec.settings, limit)
        : spec.drafter
          ? Array.from(spec.drafter.draft(job.slot, Int32Array.from(spec.history), limit))
          : (spec.next ?? []).slice(0, Math.max(0, limit));
    spec.next = undefined;
    spec.pending = draft.length;
    return draft;
  }

  /**
   * Takes the samples of a step whose entry carried a guess, one by one as if each had come from
   * its own step (a stop string, EOS, a cancel or the limit ends the job inside the run), then
   * drops the KV past the last token fed. Returns the samples taken.
   */
  #advanceRun(job: Job, run: Int32Array): number {
    const spec = job.spec!;
    // Every sample but the last confirmed a guess (the last corrects one, or follows them all).
    spec.tally.record(spec.pending, run.length - 1, job.generated.length + run.length);
    this.#counters.specAccepted += run.length - 1;
    this.#counters.specByType.accepted[spec.settings.type]! += run.length - 1;
    spec.drafter?.accept(job.slot, run.length - 1);
    spec.pending = 0;
    let taken = 0;
    for (const token of run) {
      if (this.#slots[job.slot] !== job) break;
      this.#advance(job, token);
      taken += 1;
    }
    // The guesses past the last token fed (rejected, or after the job ended) leave the KV; a
    // released job's sequence is either gone already or kept for cache_prompt up to job.pos.
    const ctx = this.#ctx;
    if (ctx && (this.#slots[job.slot] === job || (this.#cache[job.slot]?.length ?? 0) > 0)) {
      if (!ctx.removeSequence(job.slot, job.pos, -1)) {
        // The memory still holds rejected guesses (a recurrent one past its snapshots): what the
        // slot would generate next is wrong, so the job ends here and the sequence is read anew.
        const failure = new HydraError(
          'HYDRA_ERR_INTERNAL',
          `speculative rollback of slot ${job.slot} to position ${job.pos} was refused by the memory (n_rs_seq ${ctx.info.nRsSeq})`,
        );
        if (this.#slots[job.slot] === job) this.#release(job, failure);
        else {
          this.#cache[job.slot] = new Int32Array(0);
          this.#ckpts[job.slot]?.clear();
          const slot = job.slot;
          this.#afterStep(() => ctx.removeSequence(slot));
          this.#slotsChanged();
        }
      }
    }
    return taken;
  }

  /**
   * The draft model's guesses for every generating slot's next step (draft_simple), in one native
   * call on the draft context before the step is assembled. The draft's KV keeps each slot's tokens
   * (#draftKv), so only what it lacks is fed: the rejected guesses of the last step and a new
   * prompt's changed tail are dropped from it first, and a prefix it already holds is not read again.
   */
  async #draftStep(gen: number): Promise<void> {
    const draft = this.#draft!;
    const jobs: Job[] = [];
    const entries: { seq: number; pos: number; tokens: Int32Array; nMax: number }[] = [];
    let nMin = 0;
    let pMin = 0;
    for (const job of this.#slots) {
      const spec = job?.spec;
      if (!job || !spec || spec.settings.type !== 'draft_simple' || !job.promptFed) continue;
      if (job.failure || job.signal?.aborted || !spec.tally.mayDraft(job.generated.length)) continue;
      // As #draftFor limits the step: the token limit, the slot's context, one step's budget and
      // the rollback snapshots of a recurrent memory.
      const nMax = Math.min(
        spec.settings.nMax,
        job.maxTokens - job.generated.length - 1,
        this.#nCtxSeq - job.pos - 1,
        this.#budget - 1,
        this.#guessCap,
      );
      if (nMax < 1) continue;
      ({ nMin, pMin } = spec.settings);
      const history = spec.history;
      const held = this.#draftKv[job.slot] ?? [];
      // The last token (just sampled) is always fed: its logits give the first guess.
      const limit = Math.min(held.length, history.length - 1);
      let keep = 0;
      while (keep < limit && held[keep] === history[keep]) keep++;
      if (!draft.removeSequence(job.slot, keep, -1)) {
        draft.removeSequence(job.slot, -1, -1);
        keep = 0;
      }
      this.#draftKv[job.slot] = history.slice(0, keep);
      jobs.push(job);
      entries.push({ seq: job.slot, pos: keep, tokens: Int32Array.from(history.slice(keep)), nMax });
    }
    if (entries.length === 0) return;
    let out: { tokens: Int32Array; fed: number }[];
    try {
      out = await draft.draft(entries, nMin, pMin);
    } catch {
      if (gen !== this.#gen) return;
      // A failed draft costs this step's guesses only; these slots' draft KV is read again.
      for (const job of jobs) {
        this.#draftKv[job.slot] = [];
        draft.removeSequence(job.slot, -1, -1);
      }
      return;
    }
    if (gen !== this.#gen) return;
    for (let i = 0; i < jobs.length; i++) {
      const job = jobs[i]!;
      const r = out[i]!;
      this.#draftKv[job.slot] = job.spec!.history.concat(Array.from(r.tokens.subarray(0, r.fed)));
      if (this.#slots[job.slot] === job) job.spec!.next = Array.from(r.tokens);
    }
  }

  #send(job: Job, text: string): void {
    if (!job.params.probs) {
      if (text.length > 0) job.onText?.(text);
      return;
    }
    const probs = job.output.take();
    if (probs.length > 0) job.reported.push(...probs);
    if (text.length > 0 || probs.length > 0) job.onText?.(text, probs);
  }

  /** The sampled token's probabilities with the pieces of the `n` most likely tokens. */
  #tokenProb(job: Job, token: number, probs: TokenProbs): TokenProb {
    const n = Math.min(job.params.probs?.n ?? 0, probs.ids.length);
    const top: TokenProb['top'] = new Array(n);
    for (let k = 0; k < n; k++) {
      const id = probs.ids[k]!;
      top[k] = { id, bytes: this.#piece(id), prob: probs.probs[k]! };
    }
    return { id: token, bytes: this.#piece(token), prob: probs.prob, top, offset: job.output.decoded };
  }

  #release(job: Job, outcome: FinishReason | Error): void {
    if (job.slot >= 0 && this.#slots[job.slot] === job) {
      this.#slots[job.slot] = undefined;
      if (
        job.cachePrompt &&
        !(outcome instanceof Error) &&
        outcome !== 'cancelled' &&
        job.promptFed &&
        !job.shifted
      ) {
        // The KV holds the prompt and every generated token fed back (all but the last sampled).
        const fed = job.generated.slice(0, job.pos - job.prompt.length);
        const held = new Int32Array(job.prompt.length + fed.length);
        held.set(job.prompt);
        held.set(fed, job.prompt.length);
        this.#cache[job.slot] = held;
      } else {
        const ctx = this.#ctx;
        const slot = job.slot;
        this.#afterStep(() => ctx?.removeSequence(slot));
        this.#cache[job.slot] = new Int32Array(0);
        this.#ckpts[job.slot]?.clear();
      }
      this.#slotsChanged();
    }
    const sampler = job.sampler;
    job.sampler = undefined;
    this.#afterStep(() => sampler?.dispose());
    if (outcome instanceof Error) {
      this.#counters.requests.error += 1;
      job.reject(outcome);
    } else {
      this.#finish(job, outcome);
    }
  }

  /**
   * Runs `cleanup` now, or once no decode step is queued: a step queued ahead may still read this
   * slot's KV and sampler (see #chain). Cleanups of a context that was replaced meanwhile are moot.
   */
  #afterStep(cleanup: () => void): void {
    const run = (): void => {
      try {
        cleanup();
      } catch (err) {
        if ((err as { code?: string }).code !== 'HYDRA_ERR_DISPOSED') throw err;
      }
    };
    if (this.#stepsInFlight > 0) this.#afterSteps.push(run);
    else run();
  }

  #finish(job: Job, reason: FinishReason): void {
    this.#counters.requests[reason] += 1;
    job.resolve({
      text: job.output.text,
      cachedTokens: job.reuse,
      tokens: job.generated,
      finishReason: reason,
      promptTokens: job.prompt.length,
      completionTokens: job.generated.length,
      epoch: job.epoch,
      slot: job.slot,
      queueMs: job.queueMs,
      ...(job.params.probs ? { probs: job.reported } : {}),
    });
  }

  #idleSlot(slot: number): Context {
    const ctx = this.#ctx;
    if (!this.#model || !ctx) throw new HydraError('HYDRA_ERR_NO_MODEL', 'no model is loaded');
    if (!Number.isInteger(slot) || slot < 0 || slot >= this.#slots.length) {
      throw new HydraError('HYDRA_ERR_BAD_VALUE', `slot must be an integer in 0..${this.#slots.length - 1}`, {
        keys: ['slot'],
      });
    }
    if (this.#slots[slot]) throw new HydraError('HYDRA_ERR_SLOT_BUSY', `slot ${slot} is running a request`);
    return ctx;
  }

  /** See `Engine.eraseSlot`. */
  eraseSlot(slot: number): Promise<number> {
    return this.exclusive(async () => {
      const ctx = this.#idleSlot(slot);
      const held = this.#cache[slot]?.length ?? 0;
      ctx.removeSequence(slot);
      this.#cache[slot] = new Int32Array(0);
      this.#ckpts[slot]?.clear();
      return held;
    });
  }

  /** See `Engine.getSlotState`. */
  getSlotState(slot: number): Promise<Buffer> {
    return this.exclusive(async () => {
      const ctx = this.#idleSlot(slot);
      const tokens = this.#cache[slot] ?? new Int32Array(0);
      return encodeSlotState(tokens, await ctx.getSequenceState(slot));
    });
  }

  /** See `Engine.setSlotState`. */
  setSlotState(slot: number, data: Uint8Array): Promise<void> {
    return this.exclusive(async () => {
      const ctx = this.#idleSlot(slot);
      const { tokens, kv } = decodeSlotState(data, {
        nVocab: this.#model!.info.nVocab,
        nCtxSeq: this.#nCtxSeq,
      });
      ctx.removeSequence(slot);
      this.#cache[slot] = new Int32Array(0);
      this.#ckpts[slot]?.clear();
      const bad = (why: string) => new HydraError('HYDRA_ERR_STATE_INVALID', `slot state rejected: ${why}`);
      // The bytes are the client's: llama.cpp refusing them (another -np, whose KV streams differ,
      // other cache types, another model) is bad input, not an engine failure.
      const read = await ctx.setSequenceState(slot, kv).catch((err: unknown) => {
        if ((err as { code?: string }).code !== 'HYDRA_ERR_STATE_FAILED') throw err;
        throw bad(
          `llama.cpp refused the sequence state (${(err as Error).message}); it must come from an engine with the same model, -np, cache types and n_ctx per slot`,
        );
      });
      if (read === 0 && kv.length > 0) throw bad('llama.cpp did not accept the KV bytes');
      if (ctx.sequenceEnd(slot) !== tokens.length - 1) {
        ctx.removeSequence(slot);
        throw bad(`the KV holds ${ctx.sequenceEnd(slot) + 1} positions, the token list ${tokens.length}`);
      }
      this.#cache[slot] = tokens;
    });
  }
}
