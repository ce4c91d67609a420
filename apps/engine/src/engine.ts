import { TextDecoder } from 'node:util';
import {
  addRpcServer,
  type Context,
  type ContextParams,
  type DecodeEntry,
  type Device,
  listDevices,
  Model,
  type ModelLoadParams,
  type Sampler,
  type SamplerParams,
} from '@hydra-engine/native-ggml';
import type { ModelRegistry } from '@hydra-engine/resolver';
import type { ConfigLayers, Params } from '@hydra-engine/tiering';
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
}

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

const RATE_WINDOW_MS = 10_000;

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
  readonly #rate: { at: number; tokens: number }[] = [];
  readonly counters: EngineCounters = {
    promptTokens: 0,
    generatedTokens: 0,
    requests: { stop: 0, length: 0, cancelled: 0, error: 0 },
    decodeSteps: 0,
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
  devices(): Device[] {
    try {
      return listDevices();
    } catch {
      return [];
    }
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
    await this.#unload();
    this.#state = 'loading';
    const started = performance.now();
    try {
      const path = this.#registry ? this.#registry.resolve(name).path : name;
      for (const peer of (cfg.rpc_servers as string[]) ?? []) await addRpcServer(peer);
      const params = modelParamsFrom(cfg, path);
      const loadOpts: { onProgress?: (p: number) => void; signal?: AbortSignal } = {};
      if (options.onProgress) loadOpts.onProgress = options.onProgress;
      if (options.signal) loadOpts.signal = options.signal;
      this.#model = await Model.load(params, loadOpts);
      this.#modelPath = path;
      await this.#createContext(cfg);
      this.counters.loadSeconds = (performance.now() - started) / 1000;
      this.#placement = await computePlacement(path, cfg, this.devices()).catch((err: Error) => {
        this.#log.warn(`hydra-engine: layer placement unavailable: ${err.message}`);
        return undefined;
      });
      this.#state = 'ready';
      this.#lastError = undefined;
      this.#epoch += 1;
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
  }

  async #unload(): Promise<void> {
    for (const job of this.#queue.splice(0))
      job.reject(new HydraError('HYDRA_ERR_NO_MODEL', 'the model was unloaded'));
    await this.whenIdle();
    await this.#ctx?.dispose();
    this.#ctx = undefined;
    this.#model?.dispose();
    this.#model = undefined;
    this.#modelPath = undefined;
    this.#placement = undefined;
    this.#slots = [];
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
      const prev = this.#state;
      this.#state = 'draining';
      await this.whenIdle();
      await this.#ctx?.dispose();
      this.#ctx = undefined;
      try {
        await this.#createContext(this.layers.effective());
        this.#state = prev === 'draining' ? 'ready' : prev;
      } catch (err) {
        this.#state = 'error';
        this.#lastError = (err as Error).message;
        throw err;
      }
    }
    this.#epoch += 1;
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
    if (this.#state === 'draining') throw new HydraError('HYDRA_ERR_DRAINING', 'the engine is draining');
    if (!this.#model || !this.#ctx)
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
    const freeSlot = this.#slots.some((s) => !s);
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

  #admit(): void {
    const model = this.#model!;
    for (let i = 0; i < this.#slots.length && this.#queue.length > 0; i++) {
      if (this.#slots[i]) continue;
      const job = this.#queue.shift()!;
      if (job.maxTokens === 0) {
        this.#finish(job, 'length');
        i--;
        continue;
      }
      job.slot = i;
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
  }

  async #run(): Promise<void> {
    if (this.#running) return;
    this.#running = true;
    try {
      for (;;) {
        if (!this.#ctx) break;
        this.#admit();
        const batch: Job[] = [];
        const entries: DecodeEntry[] = [];
        for (const job of this.#slots) {
          if (!job) continue;
          if (job.signal?.aborted) {
            this.#release(job, 'cancelled');
            continue;
          }
          batch.push(job);
          entries.push(
            job.promptFed
              ? { seq: job.slot, pos: job.pos, tokens: [job.last], sampler: job.sampler! }
              : { seq: job.slot, pos: 0, tokens: job.prompt, sampler: job.sampler! },
          );
        }
        if (entries.length === 0) {
          if (this.#queue.length === 0) break;
          continue;
        }
        const t0 = performance.now();
        let out: { tokens: Int32Array };
        try {
          out = await this.#ctx.decode(entries);
        } catch (err) {
          const failure = new HydraError(
            'HYDRA_ERR_DECODE_FAILED',
            `decode failed: ${(err as Error).message}`,
            { cause: err },
          );
          for (const job of batch) this.#release(job, failure);
          continue;
        }
        const t1 = performance.now();
        this.counters.decodeSteps += 1;
        this.counters.decodeSeconds += (t1 - t0) / 1000;
        this.#rate.push({ at: t1, tokens: batch.length });
        for (let i = 0; i < batch.length; i++) this.#advance(batch[i]!, out.tokens[i]!);
      }
    } finally {
      this.#running = false;
      if (this.#slots.every((s) => !s)) for (const w of this.#idleWaiters.splice(0)) w();
    }
  }

  #advance(job: Job, token: number): void {
    if (!job.promptFed) {
      job.promptFed = true;
      job.pos = job.prompt.length;
      this.counters.promptTokens += job.prompt.length;
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
      this.#ctx?.removeSequence(job.slot);
    }
    job.sampler?.dispose();
    job.sampler = undefined;
    if (outcome instanceof Error) {
      this.counters.requests.error += 1;
      job.reject(outcome);
    } else {
      this.#finish(job, outcome);
    }
  }

  #finish(job: Job, reason: FinishReason): void {
    this.counters.requests[reason] += 1;
    job.resolve({
      text: job.text.slice(0, job.sent),
      tokens: job.generated,
      finishReason: reason,
      promptTokens: job.prompt.length,
      completionTokens: job.generated.length,
      epoch: job.epoch,
    });
  }

  /** Stops admitting, cancels queued and running requests, frees the model. */
  async close(): Promise<void> {
    this.#state = 'draining';
    for (const job of this.#queue.splice(0)) this.#finish(job, 'cancelled');
    for (const job of this.#slots) if (job) job.signal = AbortSignal.abort();
    await this.whenIdle();
    await this.#ctx?.dispose();
    this.#ctx = undefined;
    this.#model?.dispose();
    this.#model = undefined;
    this.#slots = [];
  }
}
