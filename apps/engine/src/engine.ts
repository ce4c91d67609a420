import { TextDecoder } from 'node:util';
import {
  type Context,
  type ContextParams,
  type DecodeEntry,
  type Device,
  Model,
  type ModelLoadParams,
  type Sampler,
  type SamplerParams,
} from '@hydra-engine/native-ggml';
import type { ModelRegistry } from '@hydra-engine/resolver';
import type { ConfigLayers, Params } from '@hydra-engine/tiering';
import { loadDevices, markPeerLost, registerPeer, safeDevices } from './combine/devices.js';
import { expertOverrides, isMoe } from './combine/moe.js';
import { HydraError } from './errors.js';
import { computePlacement, type Placement } from './placement.js';

/** Lifecycle states, as `/health` and Hydra STATUS report them. */
export type EngineState = 'empty' | 'loading' | 'ready' | 'draining' | 'error';

export type FinishReason = 'stop' | 'length' | 'cancelled';

/** Per-request (T1) settings of one generation, already validated. */
export interface GenerationParams {
  /** Upper bound on generated tokens; clipped to the room left in the slot's context. */
  maxTokens: number;
  stop: string[];
  sampler: SamplerParams;
  ignoreEos: boolean;
}

export interface GenerationResult {
  text: string;
  /** Prompt tokens whose KV came from the slot's cache (`cachePrompt`). */
  cachedTokens: number;
  tokens: number[];
  finishReason: FinishReason;
  promptTokens: number;
  completionTokens: number;
  /** The configuration epoch that served the request. */
  epoch: number;
}

export interface SubmitOptions {
  /** Text as it becomes final (stop strings are never split across or leaked into it). */
  onText?: (text: string) => void;
  /** Aborting frees the slot at the next step; the promise resolves with `finishReason: 'cancelled'`. */
  signal?: AbortSignal;
  /** Run in this slot (waits for it); default: any free slot. */
  slot?: number;
  /**
   * Keep the slot's KV after the request and reuse the longest common token prefix of the slot's
   * cache for this prompt (llama.cpp server's `cache_prompt`); see {@link Engine.getSlotState}.
   */
  cachePrompt?: boolean;
}

/** Expert placement of an MoE model (protocol.md SET_EXPERT_MODE). */
export type ExpertMode = 'solo' | 'combined';

export interface EngineOptions {
  layers: ConfigLayers;
  /** Requests waiting for a slot before new ones get `HYDRA_ERR_QUEUE_FULL`. */
  maxQueue?: number;
  registry?: ModelRegistry;
  logger?: { info(msg: string): void; warn(msg: string): void };
}

/** Counters for `/metrics`. */
export interface EngineCounters {
  promptTokens: number;
  generatedTokens: number;
  requests: Record<FinishReason | 'error', number>;
  decodeSteps: number;
  /** Steps queued before the previous one ended (the pipelined loop, #chain). */
  decodeStepsAhead: number;
  /** Entries of steps queued ahead that were dropped: their request had ended meanwhile. */
  decodeEntriesWasted: number;
  decodeSeconds: number;
  loadSeconds: number;
  rejectedQueueFull: number;
}

interface Job {
  prompt: Int32Array;
  params: GenerationParams;
  onText: ((text: string) => void) | undefined;
  signal: AbortSignal | undefined;
  epoch: number;
  slotId: number | undefined;
  cachePrompt: boolean;
  reuse: number;
  /** Set by {@link Engine.endRunning}: the loop ends the job with it between steps. */
  failure: Error | undefined;
  resolve(r: GenerationResult): void;
  reject(err: unknown): void;
  // Slot-time state.
  slot: number;
  sampler: Sampler | undefined;
  promptFed: boolean;
  pos: number;
  last: number;
  generated: number[];
  decoder: TextDecoder;
  text: string;
  sent: number;
  maxTokens: number;
}

/** One queued decode step: the jobs of its entries, in entry order. */
interface Step {
  jobs: Job[];
  result: Promise<{ tokens: Int32Array }>;
  queuedAt: number;
}

const RATE_WINDOW_MS = 10_000;

/** A model and context pair that may serve decode steps. */
interface Serving {
  model: Model;
  ctx: Context;
}

/**
 * Models and contexts that used a lost ggml-RPC peer. Freeing them would talk to the dead peer
 * (its client dispatcher is parked: the free would wait forever), so they are kept referenced for
 * the life of the process on purpose: a deliberate, bounded leak per peer loss.
 */
const ABANDONED: unknown[] = [];

/** Why and since when the engine serves less than it was configured for (a lost peer). */
export interface Degraded {
  reason: string;
  since: string;
  peers: string[];
}

function withoutDefaults<T extends object>(obj: T): Partial<T> {
  const out: Partial<T> = {};
  for (const [k, v] of Object.entries(obj)) if (v !== undefined) (out as Record<string, unknown>)[k] = v;
  return out;
}

/** Model load parameters (T3 fields) from the configuration in force. */
export function modelParamsFrom(cfg: Params, path: string): ModelLoadParams {
  const overrides = [...((cfg.override_tensors as string[]) ?? [])];
  // llama.cpp --n-cpu-moe N: the experts of the first N layers stay in host memory.
  const nCpuMoe = (cfg.n_cpu_moe as number) ?? 0;
  for (let i = 0; i < nCpuMoe; i++) overrides.push(`blk\\.${i}\\.ffn_(up|down|gate)_exps=CPU`);
  const kvOverrides = ((cfg.kv_overrides as string[]) ?? []).map((spec) => {
    const m = /^([^=]+)=(int|float|bool|str):(.*)$/.exec(spec);
    if (!m)
      throw new HydraError('HYDRA_ERR_BAD_VALUE', `kv_overrides item must be KEY=TYPE:VALUE, got ${spec}`);
    const type = m[2] as 'int' | 'float' | 'bool' | 'str';
    const raw = m[3]!;
    const value = type === 'str' ? raw : type === 'bool' ? raw === 'true' : Number(raw);
    return { key: m[1]!, type, value };
  });
  const ngl = cfg.n_gpu_layers as number;
  const split = (cfg.tensor_split as number[]) ?? [];
  const devices = (cfg.devices as string[]) ?? [];
  return withoutDefaults({
    path,
    nGpuLayers: ngl === -1 ? undefined : ngl,
    splitMode: cfg.split_mode === 'tensor' ? 'layer' : (cfg.split_mode as 'none' | 'layer' | 'row'),
    mainGpu: cfg.main_gpu as number,
    tensorSplit: split.length > 0 ? split : undefined,
    devices: devices.length > 0 ? devices : undefined,
    overrides: overrides.length > 0 ? overrides : undefined,
    kvOverrides: kvOverrides.length > 0 ? kvOverrides : undefined,
    useMmap: cfg.use_mmap as boolean,
    useMlock: cfg.use_mlock as boolean,
    checkTensors: cfg.check_tensors as boolean,
  }) as ModelLoadParams;
}

/**
 * `params` with explicit devices once any ggml-RPC peer was registered in this process: the local
 * devices plus those of `peers` (see combine/devices.ts), overrides onto other peers dropped.
 */
function withDevices(params: ModelLoadParams, peers: readonly string[]): ModelLoadParams {
  const sel = loadDevices(peers, { devices: params.devices, overrides: params.overrides });
  if (!sel) return params;
  const out: ModelLoadParams = { ...params, devices: sel.devices };
  if (sel.overrides && sel.overrides.length > 0) out.overrides = sel.overrides;
  else delete out.overrides;
  if (sel.dropped) delete out.tensorSplit;
  return out;
}

/** Context parameters (T2 fields) from the configuration in force. */
export function contextParamsFrom(cfg: Params): ContextParams {
  const positive = (v: unknown) => (typeof v === 'number' && v > 0 ? v : undefined);
  const rope = cfg.rope_scaling_type as string;
  return withoutDefaults({
    nCtx: cfg.n_ctx as number,
    nBatch: cfg.n_batch as number,
    nUbatch: cfg.n_ubatch as number,
    nSeqMax: cfg.n_parallel as number,
    nThreads: positive(cfg['cpuparams.n_threads']),
    nThreadsBatch: positive(cfg['cpuparams_batch.n_threads']) ?? positive(cfg['cpuparams.n_threads']),
    flashAttn: cfg.flash_attn as 'auto' | 'on' | 'off',
    typeK: cfg.cache_type_k as string,
    typeV: cfg.cache_type_v as string,
    ropeFreqBase: positive(cfg.rope_freq_base),
    ropeFreqScale: positive(cfg.rope_freq_scale),
    ropeScalingType: rope === 'none' || rope === 'linear' || rope === 'yarn' ? rope : undefined,
    yarnOrigCtx: positive(cfg.yarn_orig_ctx),
    offloadKqv: !(cfg.no_kv_offload as boolean),
    opOffload: !(cfg.no_op_offload as boolean),
    swaFull: cfg.swa_full as boolean,
    kvUnified: cfg.kv_unified as boolean,
  }) as ContextParams;
}

/** Sampler parameters (T1 `sampling.*` and `seed`) from a configuration or request. */
export function samplerParamsFrom(cfg: Params): SamplerParams {
  return {
    temp: cfg['sampling.temp'] as number,
    topK: cfg['sampling.top_k'] as number,
    topP: cfg['sampling.top_p'] as number,
    minP: cfg['sampling.min_p'] as number,
    typP: cfg['sampling.typ_p'] as number,
    penaltyRepeat: cfg['sampling.penalty_repeat'] as number,
    penaltyFreq: cfg['sampling.penalty_freq'] as number,
    penaltyPresent: cfg['sampling.penalty_present'] as number,
    penaltyLastN: cfg['sampling.penalty_last_n'] as number,
    seed: cfg.seed as number,
  };
}

/**
 * The engine core: model and context lifecycle, `n_parallel` slots and a bounded queue, and the
 * continuous-batching loop. Each step is one native decode for every active slot: prompts of
 * newly admitted requests and the next token of running ones go into the same call.
 *
 * Seams for the control plane: {@link state}, {@link epoch}, {@link layers} (the applied
 * configuration), {@link reconfigure} (applies planned changes once idle) and {@link whenIdle}.
 */
export class Engine {
  readonly layers: ConfigLayers;
  readonly #maxQueue: number;
  readonly #registry: ModelRegistry | undefined;
  readonly #log: { info(msg: string): void; warn(msg: string): void };
  #state: EngineState = 'empty';
  #epoch = 0;
  #model: Model | undefined;
  #ctx: Context | undefined;
  #nCtxSeq = 0;
  #slots: (Job | undefined)[] = [];
  readonly #queue: Job[] = [];
  #running = false;
  #idleWaiters: (() => void)[] = [];
  #placement: Placement | undefined;
  #modelPath: string | undefined;
  #lastError: string | undefined;
  /** Tokens whose KV each slot's sequence holds (kept only for `cachePrompt` requests). */
  #cache: Int32Array[] = [];
  #held = 0;
  #closing = false;
  #mode: ExpertMode | undefined;
  /** MoE + COMBINE: the other expert placement, resident and ready (see {@link setExpertMode}). */
  #standby: (Serving & { mode: ExpertMode }) | undefined;
  /** Bumped when a lost peer's model is abandoned: a decode loop of an older generation stops. */
  #gen = 0;
  #decodeSince: number | undefined;
  #degraded: Degraded | undefined;
  #failingOver = false;
  readonly #peerLostListeners: (() => void)[] = [];
  readonly #tasks: (() => Promise<void>)[] = [];
  /** Decode steps queued or running; KV and sampler cleanups wait for 0 (#afterStep). */
  #stepsInFlight = 0;
  readonly #afterSteps: (() => void)[] = [];
  #lastStepEnd = 0;
  /** Queue the next decode step before the current one ends (#chain); HYDRA_PIPELINE=0 turns it off. */
  readonly #pipeline = process.env.HYDRA_PIPELINE !== '0';
  readonly #slotListeners: ((busy: number) => void)[] = [];
  readonly #rate: { at: number; tokens: number }[] = [];
  readonly counters: EngineCounters = {
    promptTokens: 0,
    generatedTokens: 0,
    requests: { stop: 0, length: 0, cancelled: 0, error: 0 },
    decodeSteps: 0,
    decodeStepsAhead: 0,
    decodeEntriesWasted: 0,
    decodeSeconds: 0,
    loadSeconds: 0,
    rejectedQueueFull: 0,
  };

  constructor(options: EngineOptions) {
    if (!options || typeof options !== 'object')
      throw new HydraError('HYDRA_ERR_BAD_ARGUMENT', 'options must be an object');
    const maxQueue = options.maxQueue ?? 64;
    if (!Number.isInteger(maxQueue) || maxQueue < 0) {
      throw new HydraError('HYDRA_ERR_BAD_ARGUMENT', 'options.maxQueue must be a non-negative integer');
    }
    this.layers = options.layers;
    this.#maxQueue = maxQueue;
    this.#registry = options.registry;
    this.#log = options.logger ?? {
      info: (m) => process.stderr.write(`${m}\n`),
      warn: (m) => process.stderr.write(`${m}\n`),
    };
  }

  get state(): EngineState {
    return this.#state;
  }
  /** Bumped each time a configuration (model, context or settings) takes effect. */
  get epoch(): number {
    return this.#epoch;
  }
  get model(): Model | undefined {
    return this.#model;
  }
  get modelPath(): string | undefined {
    return this.#modelPath;
  }
  get placement(): Placement | undefined {
    return this.#placement;
  }
  get lastError(): string | undefined {
    return this.#lastError;
  }
  get slots(): { total: number; busy: number; nCtxSeq: number } {
    return { total: this.#slots.length, busy: this.#slots.filter(Boolean).length, nCtxSeq: this.#nCtxSeq };
  }
  get queueDepth(): number {
    return this.#queue.length;
  }
  /** Generated tokens per second over the last 10 s of decoding. */
  tokensPerSecond(now = performance.now()): number {
    while (this.#rate.length > 0 && this.#rate[0]!.at < now - RATE_WINDOW_MS) this.#rate.shift();
    if (this.#rate.length === 0) return 0;
    const tokens = this.#rate.reduce((s, r) => s + r.tokens, 0);
    const span = Math.max(now - this.#rate[0]!.at, 1);
    return (tokens * 1000) / span;
  }
  /** This process's devices; never dials a lost peer (see combine/devices.ts). */
  devices(): Device[] {
    try {
      return safeDevices();
    } catch {
      return [];
    }
  }
  /** Set after a peer loss until the next model load the operator asks for. */
  get degraded(): Degraded | undefined {
    return this.#degraded;
  }
  /** How long the decode step in flight has run (ms), or undefined between steps. */
  decodeStalledMs(now = performance.now()): number | undefined {
    return this.#decodeSince === undefined ? undefined : now - this.#decodeSince;
  }
  /** True when MoE + COMBINE keeps both expert placements loaded. */
  get dualPlacement(): boolean {
    return this.#standby !== undefined;
  }

  /**
   * Loads the model named by the configuration in force (`model`: a path or registry alias),
   * registering `rpc_servers` first, then creates the context and slots. Bumps the epoch.
   */
  async load(options: { onProgress?: (p: number) => void; signal?: AbortSignal } = {}): Promise<void> {
    const cfg = this.layers.effective();
    const name = cfg.model as string;
    if (!name) throw new HydraError('HYDRA_ERR_NO_MODEL', 'no model configured');
    if (this.#state === 'loading') throw new HydraError('HYDRA_ERR_LOADING', 'a model is already loading');
    const samePath = (this.#registry ? this.#registry.resolve(name).path : name) === this.#modelPath;
    // Queued prompts stay valid across a reload of the same file (same vocabulary).
    await this.#unload(samePath);
    this.#state = 'loading';
    const started = performance.now();
    try {
      const path = this.#registry ? this.#registry.resolve(name).path : name;
      const peers = (cfg.rpc_servers as string[]) ?? [];
      const peerBufts: string[] = [];
      for (const peer of peers) peerBufts.push(...(await registerPeer(peer)).bufferTypes);
      const configured = modelParamsFrom(cfg, path);
      // MoE + COMBINE: the experts go to the first peer unless the overrides already place them.
      const dual = peers.length > 0 && (await isMoe(path));
      if (dual) configured.overrides = expertOverrides(configured.overrides, peerBufts[0]!);
      const params = withDevices(configured, peers);
      const loadOpts: { onProgress?: (p: number) => void; signal?: AbortSignal } = {};
      if (options.onProgress) loadOpts.onProgress = options.onProgress;
      if (options.signal) loadOpts.signal = options.signal;
      this.#model = await Model.load(params, loadOpts);
      this.#modelPath = path;
      await this.#createContext(cfg);
      this.#mode = undefined;
      if (dual) {
        // The SOLO placement stays resident beside the COMBINED one, with its own context, so
        // SET_EXPERT_MODE only switches which pair serves the next step. With mmap on the CPU both
        // models share the file's pages; on GPUs the non-expert weights are held twice.
        const model = await Model.load(withDevices(configured, []), loadOpts);
        try {
          const ctx = await model.createContext(contextParamsFrom(cfg));
          this.#standby = { model, ctx, mode: 'solo' };
        } catch (err) {
          model.dispose();
          throw err;
        }
      }
      this.counters.loadSeconds = (performance.now() - started) / 1000;
      // Where layers went follows the device list the load used (peers first), not the listing order.
      const loaded = params.devices ? { ...cfg, devices: params.devices } : cfg;
      this.#placement = await computePlacement(path, loaded, this.devices()).catch((err: Error) => {
        this.#log.warn(`hydra-engine: layer placement unavailable: ${err.message}`);
        return undefined;
      });
      this.#state = 'ready';
      this.#lastError = undefined;
      if (!this.#failingOver) this.#degraded = undefined;
      this.#epoch += 1;
      void this.#run();
    } catch (err) {
      await this.#unload();
      this.#state = 'error';
      this.#lastError = (err as Error).message;
      if (err instanceof HydraError && err.code !== 'HYDRA_ERR_INTERNAL') throw err;
      throw new HydraError('HYDRA_ERR_LOAD_FAILED', `model load failed: ${(err as Error).message}`, {
        cause: err,
      });
    }
  }

  async #createContext(cfg: Params): Promise<void> {
    const model = this.#model!;
    this.#ctx = await model.createContext(contextParamsFrom(cfg));
    const info = this.#ctx.info;
    this.#nCtxSeq = info.nCtxSeq;
    this.#slots = new Array(info.nSeqMax).fill(undefined);
    this.#cache = this.#slots.map(() => new Int32Array(0));
  }

  async #unload(keepQueue = false): Promise<void> {
    if (!keepQueue)
      for (const job of this.#queue.splice(0))
        job.reject(new HydraError('HYDRA_ERR_NO_MODEL', 'the model was unloaded'));
    this.#held += 1;
    try {
      await this.whenIdle();
    } finally {
      this.#held -= 1;
    }
    await this.whenIdle();
    await this.#ctx?.dispose();
    this.#ctx = undefined;
    this.#model?.dispose();
    this.#model = undefined;
    await this.#standby?.ctx.dispose();
    this.#standby?.model.dispose();
    this.#standby = undefined;
    this.#modelPath = undefined;
    this.#placement = undefined;
    this.#slots = [];
    this.#cache = [];
  }

  /** Resolves when no slot is busy and the decode loop has stopped. */
  whenIdle(): Promise<void> {
    if (!this.#running && this.#slots.every((s) => !s)) return Promise.resolve();
    return new Promise((resolve) => this.#idleWaiters.push(resolve));
  }

  /**
   * Applies configuration changes already recorded in {@link layers} (the control plane plans and
   * records them): `sampler`/`none` only bump the epoch; `context` waits for idle slots and
   * rebuilds the context; `model` reloads.
   */
  async reconfigure(rebuild: 'none' | 'sampler' | 'context' | 'model'): Promise<void> {
    if (rebuild === 'model') {
      await this.load();
      return;
    }
    if (rebuild === 'context' && this.#model) {
      // New requests queue (not rejected) while the context is rebuilt.
      this.#held += 1;
      try {
        await this.whenIdle();
        await this.#ctx?.dispose();
        this.#ctx = undefined;
        await this.#createContext(this.layers.effective());
        if (this.#standby) {
          await this.#standby.ctx.dispose();
          this.#standby.ctx = await this.#standby.model.createContext(
            contextParamsFrom(this.layers.effective()),
          );
        }
      } catch (err) {
        this.#state = 'error';
        this.#lastError = (err as Error).message;
        throw err;
      } finally {
        this.#held -= 1;
      }
    }
    this.#epoch += 1;
    void this.#run();
  }

  /** Stops admitting queued requests (running ones continue) until {@link resume}. */
  hold(): void {
    this.#held += 1;
  }

  resume(): void {
    if (this.#held > 0) this.#held -= 1;
    void this.#run();
  }

  /** Ends every running request with `err`; queued requests stay queued. */
  endRunning(err: Error): void {
    for (const job of this.#slots) if (job) job.failure = err;
    void this.#run();
  }

  /** Runs `fn` between decode steps (KV sequence operations must not race a decode). */
  #exclusive<T>(fn: () => Promise<T>): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      this.#tasks.push(() => fn().then(resolve, reject));
      void this.#run();
    });
  }

  /** Called with the busy slot count each time a slot is taken or freed. */
  onSlotsChanged(listener: (busy: number) => void): void {
    this.#slotListeners.push(listener);
  }

  #slotsChanged(): void {
    const busy = this.#slots.filter(Boolean).length;
    for (const l of this.#slotListeners) l(busy);
  }

  /** The expert placement in force: set by {@link setExpertMode}, else `combined` when peers are configured. */
  get mode(): ExpertMode {
    return this.#mode ?? ((this.layers.get('rpc_servers') as string[]).length > 0 ? 'combined' : 'solo');
  }

  /**
   * The MoE expert placement switch (SET_EXPERT_MODE). With both placements resident (a MoE model
   * loaded with peers) the other model and context serve from the next decode step on: between
   * two steps, the KV of every busy or cached slot is copied into the other context
   * (getSequenceState/setSequenceState, no re-prefill), then the pairs swap. Without a standby
   * placement it only records the mode. Callers validate (MoE model, peer configured) first.
   * @returns whether weights were reloaded (never, by protocol) and how many slots moved.
   */
  async setExpertMode(mode: ExpertMode): Promise<{ reloaded: false; moved: number }> {
    if (!this.#standby) {
      this.#mode = mode;
      return { reloaded: false, moved: 0 };
    }
    return this.#exclusive(async () => {
      const sb = this.#standby;
      if (!sb || !this.#ctx || !this.#model || sb.mode !== mode)
        return { reloaded: false as const, moved: 0 };
      let moved = 0;
      for (let i = 0; i < this.#slots.length; i++) {
        if (!this.#slots[i] && (this.#cache[i]?.length ?? 0) === 0) continue;
        const bytes = await this.#ctx.getSequenceState(i);
        sb.ctx.removeSequence(i);
        await sb.ctx.setSequenceState(i, bytes);
        this.#ctx.removeSequence(i);
        moved++;
      }
      const current = { model: this.#model, ctx: this.#ctx, mode: this.mode };
      this.#model = sb.model;
      this.#ctx = sb.ctx;
      this.#standby = current;
      this.#mode = mode;
      return { reloaded: false as const, moved };
    });
  }

  /** Called after a lost peer was dropped from the configuration (the control plane resyncs). */
  onPeerLost(listener: () => void): void {
    this.#peerLostListeners.push(listener);
  }

  /**
   * Peer loss: ends the running requests with `HYDRA_ERR_PEER_LOST`, abandons (never frees) the
   * models and contexts that used the peers, drops `rpc_servers` from the configuration and loads
   * the same model SOLO; queued requests run on it. `degraded` says why until the next load the
   * operator asks for. A decode step stuck on the peer is left parked in its native thread.
   */
  async failOver(reason: string, peers: string[]): Promise<void> {
    if (this.#failingOver) return;
    this.#failingOver = true;
    try {
      this.#degraded = { reason, since: new Date().toISOString(), peers };
      for (const p of peers) markPeerLost(p);
      this.#gen += 1;
      this.#running = false;
      this.#decodeSince = undefined;
      this.#stepsInFlight = 0;
      this.#afterSteps.length = 0;
      const err = new HydraError('HYDRA_ERR_PEER_LOST', `the request ended: ${reason}`, {
        details: { peers },
      });
      for (const job of this.#slots) {
        if (!job) continue;
        // Its sampler may be in use by the parked decode: not freed either.
        this.counters.requests.error += 1;
        job.reject(err);
      }
      ABANDONED.push(this.#model, this.#ctx, this.#standby);
      this.#model = undefined;
      this.#ctx = undefined;
      this.#standby = undefined;
      this.#slots = [];
      this.#cache = [];
      this.#slotsChanged();
      for (const w of this.#idleWaiters.splice(0)) w();
      this.layers.configure({ rpc_servers: [] });
      for (const l of this.#peerLostListeners) l();
      this.#log.warn(`hydra-engine: HYDRA_ERR_PEER_LOST: ${reason}; reloading SOLO`);
      if (this.#state === 'loading') return;
      await this.load();
    } finally {
      this.#failingOver = false;
    }
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

  /**
   * A slot's saved state: `HYST` magic, version 1, token count (u32 LE each), the tokens (i32 LE)
   * whose KV the slot holds, then llama.cpp's sequence state. {@link setSlotState} restores it; a
   * `cachePrompt` request on that slot whose prompt starts with those tokens reuses the KV.
   */
  getSlotState(slot: number): Promise<Buffer> {
    return this.#exclusive(() => this.#getSlotState(slot));
  }

  async #getSlotState(slot: number): Promise<Buffer> {
    const ctx = this.#idleSlot(slot);
    const tokens = this.#cache[slot] ?? new Int32Array(0);
    const kv = await ctx.getSequenceState(slot);
    const head = Buffer.alloc(12 + tokens.length * 4);
    head.write('HYST', 0, 'latin1');
    head.writeUInt32LE(1, 4);
    head.writeUInt32LE(tokens.length, 8);
    for (let i = 0; i < tokens.length; i++) head.writeInt32LE(tokens[i]!, 12 + i * 4);
    return Buffer.concat([head, kv]);
  }

  /** Restores a slot from {@link getSlotState} output (this engine or another with the same model). */
  setSlotState(slot: number, data: Uint8Array): Promise<void> {
    return this.#exclusive(() => this.#setSlotState(slot, data));
  }

  async #setSlotState(slot: number, data: Uint8Array): Promise<void> {
    const ctx = this.#idleSlot(slot);
    const buf = Buffer.from(data.buffer, data.byteOffset, data.byteLength);
    const bad = (why: string) => new HydraError('HYDRA_ERR_STATE_INVALID', `slot state rejected: ${why}`);
    if (buf.length < 12 || buf.toString('latin1', 0, 4) !== 'HYST') throw bad('not a hydra slot state');
    if (buf.readUInt32LE(4) !== 1) throw bad(`version ${buf.readUInt32LE(4)} is not 1`);
    const n = buf.readUInt32LE(8);
    if (12 + n * 4 > buf.length) throw bad('truncated token list');
    if (n >= this.#nCtxSeq) throw bad(`${n} tokens do not fit a slot of ${this.#nCtxSeq}`);
    const nVocab = this.#model!.info.nVocab;
    const tokens = new Int32Array(n);
    for (let i = 0; i < n; i++) {
      const t = buf.readInt32LE(12 + i * 4);
      if (t < 0 || t >= nVocab) throw bad(`token ${t} is outside the vocabulary`);
      tokens[i] = t;
    }
    ctx.removeSequence(slot);
    this.#cache[slot] = new Int32Array(0);
    const read = await ctx.setSequenceState(slot, buf.subarray(12 + n * 4));
    if (read === 0 && buf.length > 12 + n * 4) throw bad('llama.cpp did not accept the KV bytes');
    if (ctx.sequenceEnd(slot) !== n - 1) {
      ctx.removeSequence(slot);
      throw bad(`the KV holds ${ctx.sequenceEnd(slot) + 1} positions, the token list ${n}`);
    }
    this.#cache[slot] = tokens;
  }

  /** Tokenizes a prompt the way the completion routes do (BOS per the model, specials parsed). */
  tokenize(text: string): Int32Array {
    return this.#requireModel().tokenize(text);
  }

  /** Formats chat messages with the model's template. */
  chatPrompt(messages: { role: string; content: string }[]): string {
    return this.#requireModel().applyChatTemplate(messages);
  }

  #requireModel(): Model {
    if (this.#state === 'loading') throw new HydraError('HYDRA_ERR_LOADING', 'the model is still loading');
    if (this.#closing) throw new HydraError('HYDRA_ERR_DRAINING', 'the engine is draining');
    if (!this.#model || (!this.#ctx && this.#held === 0))
      throw new HydraError('HYDRA_ERR_NO_MODEL', 'no model is loaded; start with --model or CONFIGURE one');
    return this.#model;
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
    this.#requireModel();
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
    const freeSlot = this.#held === 0 && this.#slots.some((s) => !s);
    if (!freeSlot && this.#queue.length >= this.#maxQueue) {
      this.counters.rejectedQueueFull += 1;
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
        signal: options.signal,
        epoch: this.#epoch,
        slotId: options.slot,
        cachePrompt: options.cachePrompt === true,
        reuse: 0,
        failure: undefined,
        resolve,
        reject,
        slot: -1,
        sampler: undefined,
        promptFed: false,
        pos: 0,
        last: -1,
        generated: [],
        decoder: new TextDecoder('utf-8'),
        text: '',
        sent: 0,
        maxTokens: Math.max(0, Math.min(params.maxTokens, this.#nCtxSeq - prompt.length)),
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
      this.#queue.push(job);
      void this.#run();
    });
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
    if (this.#held > 0) return;
    const model = this.#model!;
    const ctx = this.#ctx!;
    let changed = false;
    for (let q = 0; q < this.#queue.length; q++) {
      const job = this.#queue[q]!;
      const i = this.#slotFor(job);
      if (i < 0) continue;
      this.#queue.splice(q--, 1);
      if (job.maxTokens === 0) {
        this.#finish(job, 'length');
        continue;
      }
      const cached = this.#cache[i] ?? new Int32Array(0);
      let reuse = 0;
      if (job.cachePrompt) {
        const limit = Math.min(cached.length, job.prompt.length - 1);
        while (reuse < limit && cached[reuse] === job.prompt[reuse]) reuse++;
      }
      ctx.removeSequence(i, reuse, -1);
      this.#cache[i] = cached.subarray(0, reuse);
      job.reuse = reuse;
      job.slot = i;
      // The configuration that serves it is the one in force at admission, not at submission.
      job.epoch = this.#epoch;
      changed = true;
      job.sampler = model.createSampler(job.params.sampler);
      if (
        (job.params.sampler.penaltyRepeat ?? 1) !== 1 ||
        job.params.sampler.penaltyFreq ||
        job.params.sampler.penaltyPresent
      ) {
        job.sampler.accept(job.prompt);
      }
      this.#slots[i] = job;
    }
    if (changed) this.#slotsChanged();
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
          const jobs: Job[] = [];
          const entries: DecodeEntry[] = [];
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
            jobs.push(job);
            entries.push(
              job.promptFed
                ? { seq: job.slot, pos: job.pos, tokens: [job.last], sampler: job.sampler! }
                : {
                    seq: job.slot,
                    pos: job.reuse,
                    tokens: job.prompt.subarray(job.reuse),
                    sampler: job.sampler!,
                  },
            );
          }
          if (entries.length === 0) {
            if (this.#tasks.length === 0 && (this.#queue.length === 0 || this.#held > 0)) break;
            continue;
          }
          step = this.#decode(this.#ctx, jobs, entries);
        }
        ahead = this.#chain(step);
        let out: { tokens: Int32Array };
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
            { cause: err },
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
        this.counters.decodeSteps += 1;
        this.counters.decodeSeconds += (t1 - started) / 1000;
        this.#lastStepEnd = t1;
        let served = 0;
        for (let i = 0; i < step.jobs.length; i++) {
          const job = step.jobs[i]!;
          // A job that ended at the step before (stop, EOS) still had an entry in this one: dropped.
          if (this.#slots[job.slot] !== job) {
            this.counters.decodeEntriesWasted += 1;
            continue;
          }
          served += 1;
          if (job.failure) this.#release(job, job.failure);
          else this.#advance(job, out.tokens[i]!);
        }
        this.#rate.push({ at: t1, tokens: served });
      }
    } finally {
      if (gen === this.#gen) {
        this.#running = false;
        if (this.#slots.every((s) => !s)) for (const w of this.#idleWaiters.splice(0)) w();
      }
    }
  }

  #decode(ctx: Context, jobs: Job[], entries: DecodeEntry[]): Step {
    this.#stepsInFlight += 1;
    const gen = this.#gen;
    const result = ctx.decode(entries);
    const settled = (): void => {
      // A step parked on a lost peer never settles; failOver starts the count again.
      if (gen !== this.#gen) return;
      this.#stepsInFlight -= 1;
      if (this.#stepsInFlight === 0) for (const cleanup of this.#afterSteps.splice(0)) cleanup();
    };
    result.then(settled, settled);
    return { jobs, result, queuedAt: performance.now() };
  }

  /**
   * Queues the next step before `step` ends when its make-up is already known: every job goes on
   * generating and nothing waits to be admitted or run between steps. Each entry feeds the token
   * its sequence samples in `step` (`follow`), so the device starts the next step the moment the
   * current one ends instead of waiting for the JS thread to see the result and answer. A job that
   * stops early (EOS, a stop string, a cancel) wastes that one entry; its KV position is dropped.
   */
  #chain(step: Step): Step | undefined {
    if (!this.#pipeline || !this.#ctx || this.#tasks.length > 0) return undefined;
    if (this.#queue.length > 0 && this.#held === 0 && this.#slots.some((s) => !s)) return undefined;
    let active = 0;
    for (const s of this.#slots) if (s) active += 1;
    if (active !== step.jobs.length) return undefined;
    const entries: DecodeEntry[] = [];
    for (const job of step.jobs) {
      if (this.#slots[job.slot] !== job || job.failure || job.signal?.aborted || !job.sampler)
        return undefined;
      // Tokens generated once `step` ends: one more than now.
      if (job.generated.length + 1 >= job.maxTokens) return undefined;
      const pos = job.promptFed ? job.pos + 1 : job.prompt.length;
      if (pos >= this.#nCtxSeq) return undefined;
      entries.push({ seq: job.slot, pos, follow: true, sampler: job.sampler });
    }
    this.counters.decodeStepsAhead += 1;
    return this.#decode(this.#ctx, step.jobs, entries);
  }

  #advance(job: Job, token: number): void {
    if (!job.promptFed) {
      job.promptFed = true;
      job.pos = job.prompt.length;
      this.counters.promptTokens += job.prompt.length - job.reuse;
    } else {
      job.pos += 1;
    }
    if (job.signal?.aborted) {
      this.#release(job, 'cancelled');
      return;
    }
    const model = this.#model!;
    if (!job.params.ignoreEos && model.isEndOfGeneration(token)) {
      this.#flush(job, true);
      this.#release(job, 'stop');
      return;
    }
    job.generated.push(token);
    job.last = token;
    this.counters.generatedTokens += 1;
    job.text += job.decoder.decode(model.tokenBytes(token), { stream: true });
    if (this.#emit(job)) {
      this.#release(job, 'stop');
      return;
    }
    if (job.generated.length >= job.maxTokens) {
      this.#flush(job, true);
      this.#release(job, 'length');
    }
  }

  /** Sends the final part of the text; returns true when a stop string ended the generation. */
  #emit(job: Job): boolean {
    const stops = job.params.stop;
    if (stops.length > 0) {
      const longest = Math.max(...stops.map((s) => s.length));
      const from = Math.max(0, job.sent - longest);
      let cut = -1;
      for (const s of stops) {
        const at = job.text.indexOf(s, from);
        if (at >= 0 && (cut < 0 || at < cut)) cut = at;
      }
      if (cut >= 0) {
        job.text = job.text.slice(0, cut);
        if (cut > job.sent) job.onText?.(job.text.slice(job.sent));
        job.sent = job.text.length;
        return true;
      }
      // Hold back a tail that could still grow into a stop string.
      let hold = 0;
      for (const s of stops) {
        for (let n = Math.min(s.length - 1, job.text.length); n > hold; n--) {
          if (job.text.endsWith(s.slice(0, n))) {
            hold = n;
            break;
          }
        }
      }
      this.#sendUpTo(job, job.text.length - hold);
      return false;
    }
    this.#sendUpTo(job, job.text.length);
    return false;
  }

  #flush(job: Job, final: boolean): void {
    if (final) job.text += job.decoder.decode();
    this.#sendUpTo(job, job.text.length);
  }

  #sendUpTo(job: Job, end: number): void {
    if (end > job.sent) {
      job.onText?.(job.text.slice(job.sent, end));
      job.sent = end;
    }
  }

  #release(job: Job, outcome: FinishReason | Error): void {
    if (job.slot >= 0 && this.#slots[job.slot] === job) {
      this.#slots[job.slot] = undefined;
      if (job.cachePrompt && !(outcome instanceof Error) && outcome !== 'cancelled' && job.promptFed) {
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
      }
      this.#slotsChanged();
    }
    const sampler = job.sampler;
    job.sampler = undefined;
    this.#afterStep(() => sampler?.dispose());
    if (outcome instanceof Error) {
      this.counters.requests.error += 1;
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
    this.counters.requests[reason] += 1;
    job.resolve({
      text: job.text.slice(0, job.sent),
      cachedTokens: job.reuse,
      tokens: job.generated,
      finishReason: reason,
      promptTokens: job.prompt.length,
      completionTokens: job.generated.length,
      epoch: job.epoch,
    });
  }

  /** Stops admitting, cancels queued and running requests, frees the model. */
  async close(): Promise<void> {
    this.#closing = true;
    this.#state = 'draining';
    for (const job of this.#queue.splice(0)) this.#finish(job, 'cancelled');
    for (const job of this.#slots) if (job) job.signal = AbortSignal.abort();
    await this.whenIdle();
    await this.#ctx?.dispose();
    this.#ctx = undefined;
    this.#model?.dispose();
    this.#model = undefined;
    await this.#standby?.ctx.dispose();
    this.#standby?.model.dispose();
    this.#standby = undefined;
    this.#slots = [];
  }
}
