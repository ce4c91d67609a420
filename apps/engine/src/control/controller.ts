import { stat } from 'node:fs/promises';
import { totalmem } from 'node:os';
import { probeRpcServer } from '@hydra-engine/native-ggml';
import type { ModelRegistry } from '@hydra-engine/resolver';
import { fitToWire, modelClassOf, resolveCombine } from '@hydra-engine/resolver';
import {
  type Decision,
  DeferralPolicy,
  normalize,
  type Params,
  type PlanResult,
  plan,
} from '@hydra-engine/tiering';
import { freshDevices, peerDeviceNames } from '../combine/devices.js';
import { decideFailover } from '../combine/failover.js';
import { ConfigReader, samplerParamsFrom, stringsInForce } from '../core/params.js';
import type { Engine, ExpertMode, FailoverAnswer, PeerLossEvent } from '../engine.js';
import { HydraError } from '../errors.js';
import type { LifecycleEvent } from '../log.js';
import {
  checkContext,
  type EngineFit,
  fitOf,
  hostFreeBytes,
  modelFacts,
  readGgufFile,
  wontFit,
} from '../placement.js';
import { checkSampler } from '../request-params.js';

const SAMPLER_KEYS = {
  grammar: 'sampling.grammar',
  logit_bias: 'sampling.logit_bias',
  samplers: 'sampling.samplers',
};

/** STATE_GET chunk when `state_chunk_size` was never set: 2 MiB, twice tiering's 1 MiB default, halving a state's round trips. */
export const DEFAULT_STATE_CHUNK = 2 * 1024 * 1024;
/** Largest slot state STATE_PUT accepts. */
export const MAX_STATE_BYTES = 1024 * 1024 * 1024;
const MAX_CHUNK = 64 * 1024 * 1024;

export interface ControllerOptions {
  engine: Engine;
  registry?: ModelRegistry | undefined;
  /** From `HYDRA_COORD_PROFILE_SWITCH_DRAIN_TIMEOUT` (tiering's parseDrainTimeout). */
  drainTimeoutMs: number;
  /** ggml-RPC HELLO probe of a peer; native-ggml's by default. */
  probe?: (endpoint: string) => Promise<unknown>;
  /** Where a failed rebuild is logged; stderr by default. */
  log?: (message: string) => void;
  /** Told of every reconfigure, model load, failover and rejoin it carries out, with the cause (log.ts). */
  lifecycle?: (event: LifecycleEvent) => void;
  /** An unfinished STATE_PUT upload or unread STATE_GET snapshot is dropped after this idle time (default 60000). */
  stateTimeoutMs?: number;
  /** Bytes all unfinished STATE_PUT uploads may declare (`total`) together (default 1 GiB). */
  maxStateUploadBytes?: number;
  /**
   * Indexes GGUF files for the merged port's SET_TENSOR_HASH (CONFIGURE `rpc_weights`); absent
   * without `--rpc-port` or with `--no-configure-rpc-weights`, and `rpc_weights` is then refused.
   */
  indexWeights?: (
    files: readonly string[],
  ) => Promise<{ file: string; indexed: number; bytes: number; already: boolean }[]>;
}

interface Transfer {
  timer: NodeJS.Timeout | undefined;
}
interface Upload extends Transfer {
  total: number;
  parts: Buffer[];
  received: number;
}
interface Snapshot extends Transfer {
  data: Buffer;
}

export interface ConfigureReply {
  tier: PlanResult['tier'];
  params_applied: Record<string, unknown>;
  deferred_keys: string[];
  epoch: number;
  state_chunk_size_applied?: number;
  /** A model, split or offload change (T3): the fit verdict it was admitted on (see PLAN's `fit`). */
  fit?: Record<string, unknown> | null;
  /** The split and offload count the load chose for `"auto"` values (after the load ran). */
  auto_chosen?: { tensor_split: unknown; n_gpu_layers: unknown };
  /** Keys taken from the registry entry of the model's alias (below the request's own keys). */
  defaults_applied?: Record<string, string>;
  /** `force_fit: true` loaded a configuration the planner predicted would not fit. */
  forced?: true;
  /** The `rpc_weights` files indexed for SET_TENSOR_HASH (tensors and bytes added; `already`: indexed before). */
  rpc_weights_indexed?: { file: string; tensors: number; bytes: number; already: boolean }[];
}

/** PLAN's reply: what CONFIGURE would do, and whether the result would fit. */
export interface PlanReply {
  tier: PlanResult['tier'];
  rebuild: PlanResult['rebuild'];
  changes: object[];
  /**
   * Per device predicted weights, KV, recurrent state, compute, free memory, headroom and `fits`
   * (resolver fitToWire), an overall `fits`; `{fits: null, reason}` when a device cannot be read
   * yet; null when no model is configured.
   */
  fit: Record<string, unknown> | null;
  defaults_applied?: Record<string, string>;
}

/** The Hydra-level CONFIGURE/PLAN key that loads a configuration predicted not to fit. */
export const FORCE_FIT_KEY = 'force_fit';

/** A T2/T3 rebuild that failed, as STATUS reports it (`last_rebuild_failure`). */
export interface RebuildFailure {
  /** ISO time of the failure. */
  at: string;
  rebuild: 'context' | 'model';
  /** The keys the rebuild was to apply. */
  keys: string[];
  code: string;
  message: string;
  /** True when it was deferred (applied once the slots were free), so no CONFIGURE reply carried it. */
  deferred: boolean;
  /** Whether the previous configuration serves again (engine state ready). */
  restored: boolean;
  /** The epoch in force after the failure. */
  epoch: number;
}

/** Facts of a GGUF that quant parity compares. */
export interface ShapeFacts {
  arch: string;
  n_layer: number;
  n_embd: number;
  n_vocab: number;
  n_expert: number;
}

function badValue(message: string, key: string): HydraError {
  return new HydraError('HYDRA_ERR_BAD_VALUE', message, { keys: [key] });
}

function intField(
  req: Record<string, unknown>,
  key: string,
  dflt: number | undefined,
  min: number,
  max: number,
): number {
  let v = req[key] ?? dflt;
  // MessagePack encoders may send any integer as int64/uint64, which msgpackr decodes to a BigInt
  // (CONFIGURE takes them through tiering the same way).
  if (typeof v === 'bigint' && v >= BigInt(min) && v <= BigInt(max)) v = Number(v);
  if (typeof v !== 'number' || !Number.isSafeInteger(v) || v < min || v > max) {
    throw badValue(`${key} must be an integer in ${min}..${max}`, key);
  }
  return v;
}

/** The Hydra-level CONFIGURE key naming GGUFs this engine's merged port serves weights from. */
export const RPC_WEIGHTS_KEY = 'rpc_weights';

/** Splits `rpc_weights` (1..64 file paths) off a CONFIGURE delta. */
function takeWeights(delta: unknown): { delta: unknown; files: string[] | undefined } {
  if (typeof delta !== 'object' || delta === null || Array.isArray(delta) || !(RPC_WEIGHTS_KEY in delta))
    return { delta, files: undefined };
  const { [RPC_WEIGHTS_KEY]: files, ...rest } = delta as Record<string, unknown>;
  if (
    !Array.isArray(files) ||
    files.length === 0 ||
    files.length > 64 ||
    !files.every((f) => typeof f === 'string' && f.length > 0 && f.length <= 4096)
  )
    throw badValue(`${RPC_WEIGHTS_KEY} must be a list of 1 to 64 file paths`, RPC_WEIGHTS_KEY);
  return { delta: rest, files: files as string[] };
}

/** Splits the Hydra-level `force_fit` flag off a CONFIGURE/PLAN delta (refused unless a boolean). */
function takeForce(delta: unknown): { delta: unknown; force: boolean } {
  if (typeof delta !== 'object' || delta === null || Array.isArray(delta) || !(FORCE_FIT_KEY in delta))
    return { delta, force: false };
  const { [FORCE_FIT_KEY]: force, ...rest } = delta as Record<string, unknown>;
  if (typeof force !== 'boolean') throw badValue(`${FORCE_FIT_KEY} must be true or false`, FORCE_FIT_KEY);
  return { delta: rest, force };
}

function fitReply(fit: EngineFit | undefined): Record<string, unknown> | null {
  if (!fit) return null;
  if (!('report' in fit)) return { fits: null, reason: fit.unknown };
  const wire = fitToWire(fit.report);
  return fit.approximate ? { ...wire, fits: null, predicted_fits: wire.fits, reason: fit.approximate } : wire;
}

/** Reads arch, block count, embedding width and vocabulary size from a GGUF header. */
export async function shapeOf(
  path: string,
): Promise<ShapeFacts & { tensors: { name: string; bytes: number }[] }> {
  const g = await readGgufFile(path);
  const arch = String(g.get('general.architecture'));
  const num = (k: string) => Number(g.get(k) ?? 0);
  const tokens = g.get('tokenizer.ggml.tokens');
  const nVocab = Array.isArray(tokens) ? tokens.length : num(`${arch}.vocab_size`);
  return {
    arch,
    n_layer: num(`${arch}.block_count`),
    n_embd: num(`${arch}.embedding_length`),
    n_vocab: nVocab,
    n_expert: num(`${arch}.expert_count`),
    tensors: g.tensors.map((t) => ({ name: t.name, bytes: Number(t.bytes) })),
  };
}

/**
 * The control plane over one {@link Engine}: CONFIGURE/PLAN on tiering's planner and
 * {@link DeferralPolicy} (T1 at once; T2/T3 at once when idle, otherwise when every slot is free or
 * the drain timeout ends the running requests), slot state transfer in chunks, expert mode and
 * quantization swaps. Transport-free: the Hydra port and the `/control` routes call it.
 */
export class Controller {
  readonly engine: Engine;
  readonly #registry: ModelRegistry | undefined;
  #lastTick = 0;
  readonly #drainTimeoutMs: number;
  readonly #probe: (endpoint: string) => Promise<unknown>;
  readonly #indexWeights: ControllerOptions['indexWeights'];
  readonly #log: (message: string) => void;
  readonly #lifecycle: (event: LifecycleEvent) => void;
  #lastFailure: RebuildFailure | undefined;
  #policy: DeferralPolicy;
  #chain: Promise<void> = Promise.resolve();
  #timer: NodeJS.Timeout | undefined;
  /** The drain's hold of admission (past the drain timeout), until the waiting changes are applied or withdrawn. */
  #drainRelease: (() => void) | undefined;
  /** The COMBINE keys the last peer loss replaced, and the failover's, for its rejoin. */
  #loss: { previous: Params; fallback: Params } | undefined;
  #appliedWaiters: (() => void)[] = [];
  readonly #snapshots = new Map<number, Snapshot>();
  readonly #uploads = new Map<number, Upload>();
  readonly #stateTimeoutMs: number;
  readonly #maxUploadBytes: number;
  // Slots whose transfer was dropped for idling, so the next chunk says so instead of "offset".
  readonly #expired = { get: new Set<number>(), put: new Set<number>() };

  constructor(options: ControllerOptions) {
    if (!options || typeof options !== 'object')
      throw new HydraError('HYDRA_ERR_BAD_ARGUMENT', 'options must be an object');
    const { engine, drainTimeoutMs } = options;
    if (typeof drainTimeoutMs !== 'number' || !Number.isFinite(drainTimeoutMs) || drainTimeoutMs < 0) {
      throw new HydraError('HYDRA_ERR_BAD_ARGUMENT', 'options.drainTimeoutMs must be a finite number >= 0');
    }
    this.engine = engine;
    this.#registry = options.registry;
    this.#drainTimeoutMs = drainTimeoutMs;
    this.#probe = options.probe ?? ((e) => probeRpcServer(e));
    if (options.indexWeights !== undefined && typeof options.indexWeights !== 'function')
      throw new HydraError('HYDRA_ERR_BAD_ARGUMENT', 'options.indexWeights must be a function');
    this.#indexWeights = options.indexWeights;
    if (options.log !== undefined && typeof options.log !== 'function')
      throw new HydraError('HYDRA_ERR_BAD_ARGUMENT', 'options.log must be a function');
    this.#log = options.log ?? ((m) => process.stderr.write(`${m}\n`));
    if (options.lifecycle !== undefined && typeof options.lifecycle !== 'function')
      throw new HydraError('HYDRA_ERR_BAD_ARGUMENT', 'options.lifecycle must be a function');
    this.#lifecycle = options.lifecycle ?? (() => undefined);
    const positive = (key: 'stateTimeoutMs' | 'maxStateUploadBytes', dflt: number) => {
      const v = options[key] ?? dflt;
      if (typeof v !== 'number' || !Number.isSafeInteger(v) || v < 1)
        throw new HydraError('HYDRA_ERR_BAD_ARGUMENT', `options.${key} must be a positive integer`);
      return v;
    };
    this.#stateTimeoutMs = positive('stateTimeoutMs', 60_000);
    this.#maxUploadBytes = positive('maxStateUploadBytes', MAX_STATE_BYTES);
    this.#policy = this.#freshPolicy();
    engine.setPeerEvents({
      lost: (event) => this.#peerLost(event),
      rejoined: (e) => {
        this.#lifecycle({ event: 'rejoin', cause: 'peer_answered', peers: e.peers });
        this.#adopt(this.#loss?.previous);
      },
      rejoinFailed: (e) => {
        this.#lifecycle({
          event: 'rejoin_failed',
          cause: 'peer_answered',
          peers: e.peers,
          message: e.error.message,
        });
        this.#adopt(this.#loss?.fallback);
      },
    });
    engine.onSlotsChanged((busy) => {
      // Called from inside the decode loop: a policy error must not unwind into it. A failed
      // deferred rebuild was already rolled back; its error has no caller to reach.
      let decision: Decision;
      try {
        decision = this.#policy.setBusySlots(busy, this.#clock());
      } catch (err) {
        process.emitWarning(`hydra: deferral policy rejected a slot event: ${(err as Error).message}`);
        return;
      }
      this.#carry(decision).catch(() => undefined);
    });
  }

  /**
   * A peer loss (the runtime asks before it acts): the waiting changes are dropped (they were meant
   * for the configuration that is lost, as after a failed reload), the peers leave the layers and
   * the policy, and `failover_policy` is decided by the planner over the local devices.
   */
  #peerLost(event: PeerLossEvent): FailoverAnswer {
    this.#snapshots.clear();
    this.#uploads.clear();
    this.#withdrawPending();
    const layers = this.engine.layers;
    const previous: Params = {
      rpc_servers: layers.get('rpc_servers'),
      n_gpu_layers: layers.get('n_gpu_layers'),
    };
    const cfg: Params = { ...layers.effective(), rpc_servers: [] };
    const decision = event.facts
      ? decideFailover(event.facts, cfg, this.engine.devices(), hostFreeBytes())
      : undefined;
    const build = decision?.policy ?? (cfg.failover_policy === 'none' ? 'none' : 'solo');
    this.#adopt(
      build === 'offload' ? { rpc_servers: [], n_gpu_layers: decision!.n_gpu_layers } : { rpc_servers: [] },
    );
    this.#loss = { previous, fallback: { rpc_servers: [], n_gpu_layers: layers.get('n_gpu_layers') } };
    this.#lifecycle({
      event: 'failover',
      cause: event.cause,
      reason: event.reason,
      peers: event.peers,
      action: build,
      ended_requests: event.atOnce.endRequests,
      rejoin: cfg.peer_rejoin !== false,
    });
    return { build, decision, rejoin: cfg.peer_rejoin !== false };
  }

  /** Drops every waiting change from the policy (each set back to its applied value). */
  #withdrawPending(): void {
    const pending = this.#policy.pending;
    if (pending.length === 0) return;
    this.#policy.submit({ changes: pending.map((c) => ({ ...c, to: c.from })) }, this.#clock());
    this.#settleDrain();
  }

  /** Re-arms the drain timer and ends the drain's hold once nothing waits any more. */
  #settleDrain(): void {
    this.#arm();
    if (this.#drainRelease && !this.#policy.draining) {
      this.#drainRelease();
      this.#drainRelease = undefined;
    }
  }

  /**
   * Puts `delta` in force at once, in the policy and the layers alike, whatever the slots: the
   * runtime builds it next (a failover or a rejoin). Changes still waiting come along (that load
   * rebuilds everything anyway).
   */
  #adopt(delta: Params | undefined): void {
    if (!delta) return;
    const policy = this.#policy;
    const now = this.#clock();
    const busy = policy.busySlots;
    const waiting = policy.setBusySlots(0, now).apply;
    const d = policy.submit(plan(policy.target, delta), now);
    policy.setBusySlots(busy, now);
    this.engine.layers.record([...waiting, ...d.apply]);
    this.#settleDrain();
  }

  /** The deferral policy's epoch: each applied change set (CONFIGURE, a deferred rebuild, a failover, a rejoin) bumps it once. */
  get policyEpoch(): number {
    return this.#policy.epoch;
  }

  #freshPolicy(): DeferralPolicy {
    const p = new DeferralPolicy({
      drainTimeoutMs: this.#drainTimeoutMs,
      applied: this.engine.layers.effective(),
    });
    p.setBusySlots(this.engine.slots.busy, this.#clock());
    return p;
  }

  get drainTimeoutMs(): number {
    return this.#drainTimeoutMs;
  }

  /**
   * The last T2/T3 rebuild that failed (at once or deferred), until a later rebuild succeeds:
   * what was asked, the error, and whether the previous configuration serves again.
   */
  get lastRebuildFailure(): RebuildFailure | undefined {
    return this.#lastFailure;
  }

  /** Keys waiting for every slot to be free. */
  get deferredKeys(): string[] {
    return this.#policy.deferredKeys;
  }

  /** The STATE_GET chunk size in force. */
  get stateChunkSize(): number {
    const layers = this.engine.layers;
    return layers.sourceOf('state_chunk_size') === 'default'
      ? DEFAULT_STATE_CHUNK
      : (layers.get('state_chunk_size') as number);
  }

  /** PLAN: what CONFIGURE would do and whether it would fit, applying nothing. */
  async plan(delta: unknown): Promise<PlanReply> {
    const { delta: own } = takeForce(delta);
    const { delta: full, applied } = this.#withDefaults(await this.#expandCombine(own));
    const r = plan(this.#policy.target, full);
    const model = this.engine.model;
    if (model && r.changes.some((c) => c.via === 'sampler'))
      checkSampler(model, samplerParamsFrom(r.next), SAMPLER_KEYS);
    const fit = await this.#fitOf(r);
    return {
      tier: r.tier,
      changes: r.changes.map(({ key, from, to, tier }) => ({ key, from, to, tier })),
      rebuild: r.rebuild,
      fit: fitReply(fit),
      ...(applied ? { defaults_applied: applied } : {}),
    };
  }

  /**
   * The fit verdict of the configuration `r` leads to: its model over the devices it loads to,
   * counting what the configuration in force frees first (all of it for a reload, its context for
   * a context rebuild). Undefined when no model is configured.
   */
  async #fitOf(r: PlanResult): Promise<EngineFit | undefined> {
    const name = r.next.model as string;
    if (!name) return undefined;
    const facts = await modelFacts(await this.resolveModel(name));
    const engine = this.engine;
    const loaded = engine.model !== undefined;
    const devices = await freshDevices(2000, loaded);
    const built = engine.builtConfig;
    let current: { facts: typeof facts; cfg: typeof built & object; frees: 'model' | 'context' } | undefined;
    if (loaded && built && engine.modelPath) {
      current = {
        facts: await modelFacts(engine.modelPath),
        cfg: built,
        frees: r.rebuild === 'context' ? 'context' : 'model',
      };
    }
    // A context rebuild keeps the model as loaded, "auto" choices included.
    const next =
      r.rebuild !== 'model' && built
        ? { ...r.next, tensor_split: built.tensor_split, n_gpu_layers: built.n_gpu_layers }
        : r.next;
    return fitOf(facts, next, { devices, peerDevices: peerDeviceNames, fit: engine.fitSettings, current });
  }

  /**
   * Registry defaults of the entry a `model` alias names (n_ctx, cache types, offload, overrides,
   * split) under the request's own keys; the keys taken and their alias for the reply.
   */
  #withDefaults(delta: unknown): { delta: unknown; applied: Record<string, string> | undefined } {
    if (!this.#registry || typeof delta !== 'object' || delta === null || Array.isArray(delta))
      return { delta, applied: undefined };
    const model = (delta as Record<string, unknown>).model;
    const entry = typeof model === 'string' ? this.#registry.get(model) : undefined;
    if (!entry) return { delta, applied: undefined };
    let named: Record<string, unknown>;
    try {
      named = normalize(delta);
    } catch {
      // plan() reports what is wrong with the delta itself.
      return { delta, applied: undefined };
    }
    const out: Record<string, unknown> = { ...(delta as Record<string, unknown>) };
    const applied: Record<string, string> = {};
    for (const [key, value] of Object.entries(entry.defaults)) {
      if (value === undefined || key in named) continue;
      out[key] = Array.isArray(value) ? [...value] : value;
      applied[key] = `registry:${entry.alias}`;
    }
    return { delta: out, applied: Object.keys(applied).length > 0 ? applied : undefined };
  }

  /**
   * CONFIGURE: validates the whole delta (and that a new model exists and named peers answer)
   * before changing anything, then applies T1 at once and T2/T3 at once when idle (awaited, so a
   * failed load is this request's error) or deferred.
   */
  async configure(delta: unknown): Promise<ConfigureReply> {
    const { delta: withoutWeights, files } = takeWeights(delta);
    let indexed: ConfigureReply['rpc_weights_indexed'];
    if (files) {
      if (!this.#indexWeights)
        throw new HydraError(
          'HYDRA_ERR_UNSUPPORTED_FIELD',
          `${RPC_WEIGHTS_KEY} is not taken here (no --rpc-port, or --no-configure-rpc-weights)`,
          {
            keys: [RPC_WEIGHTS_KEY],
          },
        );
      // Before the rest of the delta: a head names the file it is about to load over this port.
      indexed = (await this.#indexWeights(files)).map((r) => ({
        file: r.file,
        tensors: r.indexed,
        bytes: r.bytes,
        already: r.already,
      }));
    }
    const { delta: own, force } = takeForce(withoutWeights);
    const { delta: full, applied } = this.#withDefaults(await this.#expandCombine(own));
    const r = plan(this.#policy.target, full);
    await this.#precheck(r);
    // T3: the whole new configuration (weights, KV, compute per device) against the memory it
    // would have once the model in force is unloaded, refused before anything is unloaded.
    let fit: EngineFit | undefined;
    if (r.rebuild === 'model') {
      fit = await this.#fitOf(r);
      // An "auto" choice that fits nowhere has nothing to force: the load would refuse it after the unload.
      const auto = r.next.tensor_split === 'auto' || r.next.n_gpu_layers === 'auto';
      if (fit && 'report' in fit && !fit.approximate && !fit.report.fits && (!force || auto))
        throw wontFit(fit.report, auto ? 'no split or offload count' : 'the configuration');
    }
    const decision = this.#policy.submit(r, this.#clock());
    const done = this.#carry(decision, false);
    await done;
    const reply: ConfigureReply = {
      tier: r.tier,
      params_applied: r.paramsApplied,
      deferred_keys: this.#policy.deferredKeys,
      epoch: this.engine.epoch,
    };
    if (r.stateChunkSizeApplied !== undefined) reply.state_chunk_size_applied = r.stateChunkSizeApplied;
    if (r.rebuild === 'model') reply.fit = fitReply(fit);
    if (force && fit && 'report' in fit && !fit.approximate && !fit.report.fits) reply.forced = true;
    const built = this.engine.builtConfig;
    const asked = r.next;
    if (
      built &&
      !reply.deferred_keys.includes('model') &&
      (asked.tensor_split === 'auto' || asked.n_gpu_layers === 'auto')
    ) {
      reply.auto_chosen = { tensor_split: built.tensor_split, n_gpu_layers: built.n_gpu_layers };
    }
    if (applied) reply.defaults_applied = applied;
    if (indexed) reply.rpc_weights_indexed = indexed;
    return reply;
  }

  /**
   * The minimal COMBINE request, `{model, mode: "solo"|"combined", peer?}`, becomes
   * the stock parameters of the resolver's unified table for the model's class (read from its
   * GGUF); keys the request also names win. Without `mode` the delta passes unchanged.
   */
  async #expandCombine(delta: unknown): Promise<unknown> {
    if (typeof delta !== 'object' || delta === null || Array.isArray(delta) || !('mode' in delta))
      return delta;
    const { mode, peer, ...rest } = delta as Record<string, unknown>;
    if (typeof rest.model !== 'string' || rest.model === '') {
      throw badValue('"mode" needs "model" (a path or registry alias) in the same request', 'model');
    }
    if (peer !== undefined && typeof peer !== 'string') throw badValue('peer must be "host:port"', 'peer');
    const path = await this.resolveModel(rest.model);
    const modelClass = modelClassOf(await readGgufFile(path));
    const resolved: Record<string, unknown> = {
      ...resolveCombine({
        model: rest.model,
        mode: mode as 'solo' | 'combined',
        peer,
        registry: this.#registry,
        modelClass,
      }),
    };
    // Leaving COMBINE must also drop the peer and its split, or the old ones would stay applied.
    if (mode === 'solo') {
      resolved.rpc_servers ??= [];
      resolved.tensor_split ??= [];
    }
    return { ...resolved, ...rest };
  }

  /** Resolves once nothing is deferred and no rebuild is running. */
  async settled(): Promise<void> {
    for (;;) {
      await this.#chain;
      if (this.#policy.deferredKeys.length === 0) return;
      await new Promise<void>((resolve) => this.#appliedWaiters.push(resolve));
    }
  }

  async #precheck(r: PlanResult): Promise<void> {
    const changed = new Map(r.changes.map((c) => [c.key, c.to]));
    const model = changed.get('model');
    const engine = this.engine;
    // A new model's GGUF is checked now, before anything is recorded or deferred.
    if (typeof model === 'string' && model !== '') {
      const facts = await modelFacts(await this.resolveModel(model));
      if ((new ConfigReader(r.next).strs('rpc_servers') ?? []).length === 0) {
        // Its context against the whole memory of the devices (what the old model frees is only
        // known after the unload, where the load checks again): refuses what can never fit.
        const whole = (await freshDevices(2000, false)).map((d) => ({ ...d, free: d.total }));
        checkContext(facts, r.next, whole, undefined, totalmem());
      }
    }
    // A grammar that does not parse or a bias past the vocabulary is refused now, not per request.
    if (engine.model && r.changes.some((c) => c.via === 'sampler')) {
      checkSampler(engine.model, samplerParamsFrom(r.next), SAMPLER_KEYS);
    }
    if ((r.rebuild === 'context' || r.rebuild === 'model') && !changed.has('model') && engine.modelPath) {
      // Sizes (n_ctx, n_batch, n_parallel, cache types) against device memory before allocation;
      // the context in force counts as freed, as the rebuild frees it first.
      const facts = await modelFacts(engine.modelPath);
      checkContext(facts, r.next, await freshDevices(), { facts, cfg: engine.layers.effective() });
    }
    const peers = new ConfigReader(r.next).strs('rpc_servers') ?? [];
    if (changed.has('rpc_servers') || (changed.has('model') && peers.length > 0)) {
      for (const peer of peers) {
        try {
          await this.#probe(peer);
        } catch (err) {
          throw new HydraError(
            'HYDRA_ERR_PEER_UNREACHABLE',
            `rpc peer ${peer} did not answer: ${(err as Error).message}`,
            {
              keys: ['rpc_servers'],
              details: { peer },
              cause: err,
            },
          );
        }
      }
    }
  }

  /** A `model` value (path or registry alias) to a readable file path. */
  async resolveModel(model: string): Promise<string> {
    let path = model;
    if (this.#registry) {
      try {
        path = this.#registry.resolve(model).path;
      } catch (err) {
        throw new HydraError('HYDRA_ERR_UNKNOWN_MODEL', (err as Error).message, {
          keys: ['model'],
          cause: err,
        });
      }
    }
    const st = await stat(path).catch(() => undefined);
    if (!st?.isFile()) {
      throw new HydraError(
        'HYDRA_ERR_UNKNOWN_MODEL',
        `model ${JSON.stringify(model)} is neither a registry alias nor a readable file`,
        { keys: ['model'] },
      );
    }
    return path;
  }

  /** Carries out a decision; returns when its rebuild (if any) ends. */
  #carry(d: Decision, deferred = true): Promise<void> {
    if (d.endRunning) {
      // Past the drain deadline: admit nothing new, end what runs; queued requests wait.
      this.#drainRelease ??= this.engine.hold('drain timeout');
      this.engine.endRunning(
        new HydraError(
          'HYDRA_ERR_DRAIN_TIMEOUT',
          `ended by a configuration change (${d.deferredKeys.join(', ')}) after the ${this.#drainTimeoutMs} ms drain timeout`,
        ),
      );
    }
    this.#arm();
    if (d.apply.length === 0) {
      if (this.#drainRelease && !this.#policy.draining) {
        // The waiting changes were withdrawn by a later CONFIGURE.
        this.#drainRelease();
        this.#drainRelease = undefined;
      }
      return this.#chain;
    }
    const engine = this.engine;
    const previous = d.apply.map((c) => ({ ...c, from: c.to, to: c.from }));
    engine.layers.record(d.apply);
    // Holding now (synchronously) keeps the next admission off the old context or model.
    const release = engine.hold(`${d.rebuild} rebuild of ${d.apply.map((c) => c.key).join(', ')}`);
    const releaseDrain = this.#drainRelease;
    this.#drainRelease = undefined;
    const run = async () => {
      try {
        const started = performance.now();
        await this.#rebuild(d.rebuild);
        if (d.rebuild === 'context' || d.rebuild === 'model') this.#lastFailure = undefined;
        this.#applied(d, deferred, performance.now() - started);
      } catch (err) {
        engine.layers.record(previous);
        this.#policy = this.#freshPolicy();
        // A load refused before the unload (its GGUF checks) left the previous model serving.
        if (d.rebuild === 'model' && engine.layers.get('model') && engine.state !== 'ready') {
          await engine.load().catch(() => undefined);
        }
        this.#failed(d, err, deferred);
        throw err;
      } finally {
        release();
        releaseDrain?.();
        for (const w of this.#appliedWaiters.splice(0)) w();
      }
    };
    const step = this.#chain.then(run);
    this.#chain = step.catch(() => undefined);
    return step;
  }

  /** Tells the lifecycle listener of an applied change set (and of the model load it made). */
  #applied(d: Decision, deferred: boolean, ms: number): void {
    const cause = deferred ? 'deferred' : 'configure';
    const { engine } = this;
    if (d.rebuild === 'model' && engine.model)
      this.#lifecycle({
        event: 'load',
        cause,
        model: engine.modelPath ?? '',
        seconds: engine.counters.loadSeconds,
        epoch: engine.epoch,
      });
    this.#lifecycle({
      event: 'reconfigure',
      cause,
      rebuild: d.rebuild,
      keys: d.apply.map((c) => c.key),
      epoch: engine.epoch,
      ms: Math.round(ms * 10) / 10,
    });
  }

  /** Records, logs and counts a failed rebuild; a deferred one has no caller to hear of it otherwise. */
  #failed(d: Decision, err: unknown, deferred: boolean): void {
    const e = err instanceof HydraError ? err : undefined;
    const rebuild = d.rebuild === 'model' ? 'model' : 'context';
    this.#lastFailure = {
      at: new Date().toISOString(),
      rebuild,
      keys: d.apply.map((c) => c.key),
      code: e?.code ?? 'HYDRA_ERR_INTERNAL',
      message: (err as Error)?.message ?? String(err),
      deferred,
      restored: this.engine.state === 'ready',
      epoch: this.engine.epoch,
    };
    this.engine.counters.rebuildFailures[rebuild] += 1;
    const f = this.#lastFailure;
    this.#lifecycle({
      event: 'reconfigure_failed',
      cause: deferred ? 'deferred' : 'configure',
      rebuild,
      keys: f.keys,
      code: f.code,
      message: f.message,
      restored: f.restored,
    });
    this.#log(
      `hydra-engine: ${f.deferred ? 'deferred ' : ''}${rebuild} rebuild of ${f.keys.join(', ')} failed: ${f.code}: ${f.message}; ` +
        (f.restored ? `the previous configuration serves (epoch ${f.epoch})` : `state ${this.engine.state}`),
    );
  }

  async #rebuild(rebuild: Decision['rebuild']): Promise<void> {
    if (rebuild === 'model') {
      if (this.engine.layers.get('model')) {
        this.#snapshots.clear();
        await this.engine.load();
        return;
      }
      rebuild = 'none';
    }
    if (rebuild === 'context') this.#snapshots.clear();
    await this.engine.reconfigure(rebuild);
  }

  /**
   * The policy's clock: performance.now(), but never below what the policy already saw. A drain
   * timer may fire a fraction of a millisecond before its deadline and is then reported as the
   * deadline itself; a slot event right after must not look like time going back.
   */
  #clock(atLeast = 0): number {
    this.#lastTick = Math.max(this.#lastTick, atLeast, performance.now());
    return this.#lastTick;
  }

  #arm(): void {
    clearTimeout(this.#timer);
    this.#timer = undefined;
    const deadline = this.#policy.deadlineMs;
    if (deadline === null || this.#policy.draining) return;
    this.#timer = setTimeout(
      () => {
        this.#timer = undefined;
        this.#carry(this.#policy.tick(this.#clock(deadline))).catch(() => undefined);
      },
      Math.max(0, deadline - performance.now()),
    );
    this.#timer.unref();
  }

  /** Unfinished state transfers and the bytes they hold. */
  get stateTransfers(): { uploads: number; snapshots: number; bytes: number } {
    let bytes = 0;
    for (const u of this.#uploads.values()) bytes += u.received;
    for (const t of this.#snapshots.values()) bytes += t.data.length;
    return { uploads: this.#uploads.size, snapshots: this.#snapshots.size, bytes };
  }

  // (Re)arms the idle timer of a transfer; the entry goes only if it is still the slot's one.
  #touch<T extends Transfer>(map: Map<number, T>, expired: Set<number>, slot: number, entry: T): void {
    clearTimeout(entry.timer);
    entry.timer = setTimeout(() => {
      if (map.get(slot) !== entry) return;
      map.delete(slot);
      expired.add(slot);
    }, this.#stateTimeoutMs);
    entry.timer.unref();
  }

  #drop<T extends Transfer>(map: Map<number, T>, slot: number): void {
    clearTimeout(map.get(slot)?.timer);
    map.delete(slot);
  }

  #expiredError(slot: number, what: string): HydraError {
    return new HydraError(
      'HYDRA_ERR_STATE_EXPIRED',
      `the ${what} of slot ${slot} was dropped after ${this.#stateTimeoutMs} ms without a chunk; start again at offset 0`,
      { keys: ['offset'] },
    );
  }

  /** STATE_GET: a chunk of a slot's state; offset 0 takes a fresh snapshot. */
  async stateGet(req: Record<string, unknown>): Promise<{ total: number; offset: number; data: Buffer }> {
    const slot = intField(req, 'slot', 0, 0, 1 << 20);
    const offset = intField(req, 'offset', 0, 0, Number.MAX_SAFE_INTEGER);
    const chunk = intField(req, 'chunk_size', this.stateChunkSize, 1, MAX_CHUNK);
    let snap = offset === 0 ? undefined : this.#snapshots.get(slot);
    if (!snap && offset > 0 && this.#expired.get.has(slot)) throw this.#expiredError(slot, 'snapshot');
    if (!snap) {
      snap = { data: await this.engine.getSlotState(slot), timer: undefined };
      this.#drop(this.#snapshots, slot);
      this.#snapshots.set(slot, snap);
      this.#expired.get.delete(slot);
    }
    const state = snap.data;
    if (offset > state.length)
      throw badValue(`offset ${offset} is past the state's ${state.length} bytes`, 'offset');
    const data = state.subarray(offset, Math.min(state.length, offset + chunk));
    if (offset + data.length >= state.length) {
      if (this.#snapshots.get(slot) === snap) this.#drop(this.#snapshots, slot);
    } else this.#touch(this.#snapshots, this.#expired.get, slot, snap);
    return { total: state.length, offset, data };
  }

  /** STATE_PUT: chunks in order (offset 0 restarts); the last one restores the slot. */
  async statePut(req: Record<string, unknown>): Promise<{ received: number; complete: boolean }> {
    const slot = intField(req, 'slot', 0, 0, 1 << 20);
    const offset = intField(req, 'offset', undefined, 0, MAX_STATE_BYTES);
    const total = intField(req, 'total', undefined, 1, MAX_STATE_BYTES);
    const data = req.data;
    if (!(data instanceof Uint8Array)) throw badValue('data must be bytes', 'data');
    if (slot >= this.engine.slots.total) {
      throw badValue(`slot must be an integer in 0..${this.engine.slots.total - 1}`, 'slot');
    }
    let up = this.#uploads.get(slot);
    if (offset === 0) {
      let declared = total;
      for (const [s, u] of this.#uploads) if (s !== slot) declared += u.total;
      if (declared > this.#maxUploadBytes) {
        throw new HydraError(
          'HYDRA_ERR_STATE_UPLOADS_FULL',
          `unfinished uploads would declare ${declared} bytes; the limit is ${this.#maxUploadBytes}`,
          { keys: ['total'] },
        );
      }
      this.#drop(this.#uploads, slot);
      this.#expired.put.delete(slot);
      up = { total, parts: [], received: 0, timer: undefined };
    } else if (!up && this.#expired.put.has(slot)) throw this.#expiredError(slot, 'upload');
    else if (!up || up.received !== offset) {
      throw badValue(`offset ${offset} does not follow the ${up?.received ?? 0} bytes received`, 'offset');
    }
    if (up.total !== total) throw badValue(`total changed from ${up.total} to ${total}`, 'total');
    if (offset + data.length > total)
      throw badValue(`offset + data (${offset + data.length}) is past total ${total}`, 'data');
    up.parts.push(Buffer.from(data));
    up.received += data.length;
    if (up.received < total) {
      this.#uploads.set(slot, up);
      this.#touch(this.#uploads, this.#expired.put, slot, up);
      return { received: up.received, complete: false };
    }
    this.#drop(this.#uploads, slot);
    await this.engine.setSlotState(slot, Buffer.concat(up.parts, total));
    return { received: up.received, complete: true };
  }

  /** SET_EXPERT_MODE through the engine's hook. */
  async setExpertMode(req: Record<string, unknown>): Promise<{
    mode: ExpertMode;
    previous: ExpertMode;
    switch_ms: number;
    reloaded: false;
  }> {
    const mode = req.mode;
    if (mode !== 'solo' && mode !== 'combined') throw badValue('mode must be "solo" or "combined"', 'mode');
    const model = this.engine.model;
    if (!model) throw new HydraError('HYDRA_ERR_NO_MODEL', 'no model is loaded');
    if (!(model.info.nExpert > 0)) {
      throw new HydraError(
        'HYDRA_ERR_NOT_MOE',
        `the loaded model (${model.info.arch}) is dense: it has no experts to place`,
      );
    }
    if (stringsInForce(this.engine.layers, 'rpc_servers').length === 0) {
      throw new HydraError('HYDRA_ERR_NO_PEER', 'no rpc_servers peer is configured to hold experts', {
        keys: ['rpc_servers'],
      });
    }
    const previous = this.engine.mode;
    const t0 = performance.now();
    await this.engine.setExpertMode(mode);
    return { mode, previous, switch_ms: performance.now() - t0, reloaded: false };
  }

  /** SWAP_QUANT: CONFIGURE `{model}` after checking the new file has the loaded model's shape. */
  async swapQuant(req: Record<string, unknown>): Promise<ConfigureReply> {
    if (typeof req.model !== 'string' || req.model === '')
      throw badValue('model must be a non-empty string', 'model');
    const loaded = this.engine.model;
    if (!loaded || !this.engine.modelPath)
      throw new HydraError('HYDRA_ERR_NO_MODEL', 'no model is loaded to swap');
    const path = await this.resolveModel(req.model);
    const next = await shapeOf(path);
    const cur = loaded.info;
    const want: ShapeFacts = {
      arch: cur.arch,
      n_layer: cur.nLayer,
      n_embd: cur.nEmbd,
      n_vocab: cur.nVocab,
      n_expert: cur.nExpert,
    };
    const differ = (Object.keys(want) as (keyof ShapeFacts)[]).filter((k) => want[k] !== next[k]);
    if (differ.length > 0) {
      throw new HydraError(
        'HYDRA_ERR_QUANT_PARITY',
        `${req.model} is not a quantization of the loaded model: ${differ.map((k) => `${k} ${next[k]} vs ${want[k]}`).join(', ')}`,
        { keys: differ, details: { loaded: want, offered: { ...next, tensors: undefined } } },
      );
    }
    return this.configure({ model: req.model });
  }

  /**
   * `POST /control/load_model`: loads `model` (CONFIGURE `{model}`; waits for a deferred load).
   * @throws HydraError `HYDRA_ERR_UNSUPPORTED_FIELD` for `keep_layer_range`, `HYDRA_ERR_UNKNOWN_KEY`
   * for any other key but `model`, and CONFIGURE's errors.
   */
  async loadModel(req: Record<string, unknown>): Promise<{
    loaded: true;
    n_tensors: number;
    size_mb: number;
    tier: ConfigureReply['tier'];
    epoch: number;
  }> {
    // Refused rather than approximated: the pinned llama.cpp cannot load only some blocks within the
    // patch budget (docs/decisions.md), and pinning the other blocks to host memory saved nothing.
    if (req.keep_layer_range !== undefined) {
      throw new HydraError(
        'HYDRA_ERR_UNSUPPORTED_FIELD',
        'keep_layer_range is not supported: llama.cpp loads every layer of the model',
        { keys: ['keep_layer_range'] },
      );
    }
    const extra = Object.keys(req).filter((k) => k !== 'model');
    if (extra.length > 0) {
      throw new HydraError('HYDRA_ERR_UNKNOWN_KEY', `load_model takes only model, not ${extra.join(', ')}`, {
        keys: extra,
      });
    }
    if (typeof req.model !== 'string' || req.model === '')
      throw badValue('model must be a non-empty string', 'model');
    const path = await this.resolveModel(req.model);
    // The GGUF checks (bounded counts) before shapeOf walks the tensor table.
    await modelFacts(path);
    const shape = await shapeOf(path);
    const reply = await this.configure({ model: req.model });
    await this.settled();
    if (this.engine.state !== 'ready' || this.engine.modelPath !== path) {
      throw new HydraError(
        'HYDRA_ERR_LOAD_FAILED',
        `model ${req.model} is not loaded (state ${this.engine.state})`,
      );
    }
    const bytes = shape.tensors.reduce((s, t) => s + t.bytes, 0);
    return {
      loaded: true,
      n_tensors: shape.tensors.length,
      size_mb: Math.round((bytes / (1024 * 1024)) * 100) / 100,
      tier: reply.tier,
      epoch: this.engine.epoch,
    };
  }

  close(): void {
    clearTimeout(this.#timer);
    for (const slot of [...this.#uploads.keys()]) this.#drop(this.#uploads, slot);
    for (const slot of [...this.#snapshots.keys()]) this.#drop(this.#snapshots, slot);
  }
}
