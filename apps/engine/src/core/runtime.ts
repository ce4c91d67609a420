// The runtime: model and context lifecycle (load, context rebuilds, unload), the MoE standby
// placement and failover after a peer loss. It attaches what it builds to the scheduler and holds
// the scheduler (hold/whenIdle) around every rebuild.
import {
  type Context,
  type ContextMemoryRow,
  type Device,
  Model,
  type ModelLoadParams,
  probeRpcServer,
  rpcParkedInfo,
} from '@hydra-engine/native-ggml';
import type { ModelFacts, ModelRegistry } from '@hydra-engine/resolver';
import type { ConfigLayers, Params } from '@hydra-engine/tiering';
import {
  freshDevices,
  loadDevices,
  markPeerLost,
  peerDeviceNames,
  registerPeer,
  safeDevices,
} from '../combine/devices.js';
import { watchPeers } from '../combine/load-watch.js';
import { expertOverrides, moeLayout } from '../combine/moe.js';
import { tellPeersWeights } from '../combine/peer-weights.js';
import { PeerRejoin } from '../combine/rejoin.js';
import { HydraError } from '../errors.js';
import {
  checkContext,
  computePlacement,
  type FitSettings,
  modelFacts,
  type Placement,
  resolveAuto,
} from '../placement.js';
import { DraftRuntime } from './draft.js';
import { ConfigReader, contextParamsFrom, modelParamsFrom, stringsInForce } from './params.js';
import type { Scheduler } from './scheduler.js';
import type {
  Degraded,
  EngineCounters,
  EngineState,
  ExpertMode,
  FailoverAnswer,
  Logger,
  PeerEvents,
  PeerLossEvent,
} from './types.js';

/** How long a rejoin waits for a lost peer's registration. */
const REJOIN_REGISTER_MS = 15_000;

function withTimeout<T>(work: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => {
      const last = (() => {
        try {
          return rpcParkedInfo().last;
        } catch {
          return '';
        }
      })();
      reject(
        new HydraError(
          'HYDRA_ERR_PEER_UNREACHABLE',
          `${what} did not return in ${ms} ms` +
            (/Failed to connect|handshake failed/.test(last)
              ? ": a ggml-RPC thread parked while dialing holds llama.cpp's dispatcher lock; no peer can be dialled again until the head restarts"
              : ''),
        ),
      );
    }, ms);
    timer.unref();
  });
  return Promise.race([work, late]).finally(() => clearTimeout(timer));
}

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

/**
 * `params` with explicit devices once any ggml-RPC peer was registered in this process: the local
 * devices plus those of `peers` (see combine/devices.ts), overrides onto other peers dropped.
 */
function withDevices(params: ModelLoadParams, peers: readonly string[]): ModelLoadParams {
  const sel = loadDevices(peers, {
    devices: params.devices,
    overrides: params.overrides,
    tensorSplit: params.tensorSplit,
  });
  if (!sel) return params;
  const out: ModelLoadParams = { ...params, devices: sel.devices };
  if (sel.overrides && sel.overrides.length > 0) out.overrides = sel.overrides;
  else delete out.overrides;
  if (sel.dropped) delete out.tensorSplit;
  // A peer device added for the overrides' sake holds no layers (see loadDevices).
  if (sel.tensorSplit) out.tensorSplit = sel.tensorSplit;
  if (sel.noOffload) out.nGpuLayers = 0;
  return out;
}

export interface RuntimeOptions {
  layers: ConfigLayers;
  registry: ModelRegistry | undefined;
  log: Logger;
  counters: EngineCounters;
  scheduler: Scheduler;
  fit: FitSettings;
}

/** Model, context and placement lifecycle of one engine. */
export class Runtime {
  readonly #layers: ConfigLayers;
  readonly #registry: ModelRegistry | undefined;
  readonly #log: Logger;
  readonly #counters: EngineCounters;
  readonly #scheduler: Scheduler;
  readonly #fit: FitSettings;
  #state: EngineState = 'empty';
  #epoch = 0;
  #model: Model | undefined;
  #placement: Placement | undefined;
  // llama.cpp's allocation of the context in force, read when it was built: reading it while a
  // decode runs could race the scheduler reallocating its compute buffers.
  #memory: ContextMemoryRow[] | undefined;
  #modelPath: string | undefined;
  #lastError: string | undefined;
  #closing = false;
  #mode: ExpertMode | undefined;
  /** MoE + COMBINE: the other expert placement, resident and ready (see {@link setExpertMode}). */
  #standby: (Serving & { mode: ExpertMode }) | undefined;
  #degraded: Degraded | undefined;
  #failingOver = false;
  /** The rejoin of the loss that `degraded` reports. */
  #rejoin: { rejoin: PeerRejoin; degraded: Degraded } | undefined;
  /** Peers a load lost and that have not been registered again since. */
  readonly #lostInLoad = new Set<string>();
  /** The model facts and the configuration the context in force was built with (a failed rebuild restores it). */
  #built: { facts: ModelFacts | undefined; cfg: Params } | undefined;
  /** The facts of the model in force (read by load's GGUF checks). */
  #facts: ModelFacts | undefined;
  /** The draft model of speculative decoding (speculative.model) and its context. */
  readonly #draft = new DraftRuntime();
  #peerEvents: PeerEvents | undefined;

  constructor(options: RuntimeOptions) {
    this.#layers = options.layers;
    this.#registry = options.registry;
    this.#log = options.log;
    this.#counters = options.counters;
    this.#scheduler = options.scheduler;
    this.#fit = options.fit;
  }

  get state(): EngineState {
    return this.#state;
  }
  get epoch(): number {
    return this.#epoch;
  }
  get model(): Model | undefined {
    return this.#model;
  }
  get modelPath(): string | undefined {
    return this.#modelPath;
  }
  get builtConfig(): Params | undefined {
    return this.#built?.cfg;
  }
  get placement(): Placement | undefined {
    return this.#placement;
  }
  /** What llama.cpp allocated per buffer type for the model and context in force (none without one). */
  get memory(): ContextMemoryRow[] | undefined {
    return this.#scheduler.ctx ? this.#memory : undefined;
  }
  get lastError(): string | undefined {
    return this.#lastError;
  }
  get degraded(): Degraded | undefined {
    const d = this.#degraded;
    return d && this.#rejoin?.degraded === d ? { ...d, rejoin: this.#rejoin.rejoin.state } : d;
  }
  get dualPlacement(): boolean {
    return this.#standby !== undefined;
  }
  get mode(): ExpertMode {
    return this.#mode ?? (stringsInForce(this.#layers, 'rpc_servers').length > 0 ? 'combined' : 'solo');
  }

  devices(): Device[] {
    try {
      return safeDevices();
    } catch {
      return [];
    }
  }

  /** The loaded model when requests may be admitted; else the admission error. */
  requireModel(): Model {
    if (this.#state === 'loading') throw new HydraError('HYDRA_ERR_LOADING', 'the model is still loading');
    if (this.#closing) throw new HydraError('HYDRA_ERR_DRAINING', 'the engine is draining');
    if (!this.#model || (!this.#scheduler.ctx && !this.#scheduler.held)) {
      // The cause of a failed load goes with every refusal: "no model" alone hides it.
      const cause =
        this.#state === 'error' && this.#lastError ? `: the last load failed: ${this.#lastError}` : '';
      throw new HydraError(
        'HYDRA_ERR_NO_MODEL',
        `no model is loaded${cause || '; start with --model or CONFIGURE one'}`,
      );
    }
    return this.#model;
  }

  /** See `Engine.load`. */
  async load(options: { onProgress?: (p: number) => void; signal?: AbortSignal } = {}): Promise<void> {
    let cfg = this.#layers.effective();
    const name = new ConfigReader(cfg).str('model');
    if (!name) throw new HydraError('HYDRA_ERR_NO_MODEL', 'no model configured');
    if (this.#state === 'loading') throw new HydraError('HYDRA_ERR_LOADING', 'a model is already loading');
    const target = this.#registry ? this.#registry.resolve(name).path : name;
    // Checked before anything is unloaded: a malformed or hostile file leaves the model in force.
    const facts = await modelFacts(target).catch((err: unknown) => {
      const e =
        err instanceof HydraError
          ? err
          : new HydraError('HYDRA_ERR_LOAD_FAILED', `model ${target}: ${(err as Error).message}`, {
              cause: err,
            });
      // With no model in force the load the operator asked for failed: say so.
      if (!this.#model) {
        this.#state = 'error';
        this.#lastError = e.message;
      }
      throw e;
    });
    const samePath = target === this.#modelPath;
    const toTell = new ConfigReader(cfg).strs('rpc_servers') ?? [];
    if (toTell.length > 0) {
      // Hydra peers index the file first and then receive none of its large tensors.
      for (const r of await tellPeersWeights(toTell, target)) {
        if (r.error === undefined)
          this.#log.info(
            `hydra-engine: peer ${r.peer} indexed ${target} (${r.already ? 'already' : `${r.tensors} tensors`})`,
          );
        else this.#log.info(`hydra-engine: peer ${r.peer} not told to index ${target}: ${r.error}`);
      }
    }
    // Queued prompts stay valid across a reload of the same file (same vocabulary).
    await this.#unload(samePath);
    this.#state = 'loading';
    const started = performance.now();
    let stillLost: { peer: string; why: string } | undefined;
    try {
      const path = this.#registry ? this.#registry.resolve(name).path : name;
      const peers = new ConfigReader(cfg).strs('rpc_servers') ?? [];
      const peerBufts: string[] = [];
      for (const peer of peers) {
        try {
          // HELLO first: a peer that does not answer is unreachable; one that dies after it is lost.
          await probeRpcServer(peer);
          // Registration dials the peer from a native thread, which parks if the peer dies.
          const reg = await watchPeers([peer], 'the peer registration', registerPeer(peer), () => undefined);
          peerBufts.push(...reg.bufferTypes);
        } catch (err) {
          // The peer a load lost is still gone (the controller's restore of a COMBINE
          // configuration that used it): that is a failover, not a failed load.
          if (this.#lostInLoad.has(peer)) stillLost = { peer, why: (err as Error).message };
          const code = (err as { code?: string }).code;
          // It answered HELLO (the probe above) and then failed its registration: lost.
          const answered = !(err instanceof HydraError && err.message.startsWith(`ggml-RPC peer ${peer}:`));
          if (code !== 'HYDRA_ERR_PEER_LOST' && answered && !stillLost)
            throw new HydraError(
              'HYDRA_ERR_PEER_LOST',
              `the peer registration ended: ${(err as Error).message}`,
              {
                details: { peers: [peer] },
                cause: err,
              },
            );
          throw err;
        }
      }
      for (const peer of peers) this.#lostInLoad.delete(peer);
      // tensor_split/n_gpu_layers "auto": the planner's choice over the memory free after the unload.
      if (cfg.tensor_split === 'auto' || cfg.n_gpu_layers === 'auto') {
        cfg = resolveAuto(facts, cfg, {
          devices: await freshDevices(2000, false),
          peerDevices: peerDeviceNames,
          fit: this.#fit,
        }).cfg;
      }
      const configured = modelParamsFrom(cfg, path);
      // MoE + COMBINE: the experts (and the rest of their FFN) go to the first peer unless the
      // overrides already place them.
      const layout = peers.length > 0 ? await moeLayout(path) : undefined;
      const dual = layout !== undefined;
      if (dual) configured.overrides = expertOverrides(configured.overrides, peerBufts[0]!, layout);
      const params = withDevices(configured, peers);
      // After the unload and the peers' registration, so the free memory read is what this load gets.
      checkContext(
        facts,
        params.devices ? { ...cfg, devices: params.devices } : cfg,
        await freshDevices(2000, false),
      );
      const loadOpts: { onProgress?: (p: number) => void; signal?: AbortSignal } = {};
      if (options.onProgress) loadOpts.onProgress = options.onProgress;
      if (options.signal) loadOpts.signal = options.signal;
      // A peer lost during the load ends it (HYDRA_ERR_PEER_LOST) instead of hanging on it.
      this.#model = await watchPeers(peers, 'the model load', Model.load(params, loadOpts), (m) =>
        ABANDONED.push(m),
      );
      await this.#draft.load(cfg, this.#model);
      this.#modelPath = path;
      this.#facts = facts;
      await this.#createContext(cfg, facts, peers);
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
      this.#counters.loadSeconds = (performance.now() - started) / 1000;
      // Where layers went follows the device list the load used (peers first), not the listing order,
      // and the offload and split it used (loadDevices may add a peer device with no layers).
      const loaded = params.devices
        ? {
            ...cfg,
            devices: params.devices,
            ...(params.tensorSplit ? { tensor_split: params.tensorSplit } : {}),
            ...(params.nGpuLayers !== undefined ? { n_gpu_layers: params.nGpuLayers } : {}),
          }
        : cfg;
      this.#placement = await computePlacement(path, loaded, this.devices()).catch((err: Error) => {
        this.#log.warn(`hydra-engine: layer placement unavailable: ${err.message}`);
        return undefined;
      });
      this.#state = 'ready';
      this.#lastError = undefined;
      if (!this.#failingOver) this.#degraded = undefined;
      this.#epoch += 1;
      this.#scheduler.kick();
    } catch (err) {
      if (err instanceof HydraError && err.code === 'HYDRA_ERR_PEER_LOST') {
        // What was built holds buffers on the lost peer: freeing it would wait on it for good.
        const peers = new ConfigReader(cfg).strs('rpc_servers') ?? [];
        for (const p of peers) {
          markPeerLost(p);
          this.#lostInLoad.add(p);
        }
        ABANDONED.push(this.#model, this.#scheduler.detach(), this.#standby);
        this.#model = undefined;
        this.#standby = undefined;
        this.#log.warn(`hydra-engine: HYDRA_ERR_PEER_LOST during a load: ${err.message}`);
      }
      await this.#unload();
      this.#state = 'error';
      this.#lastError = (err as Error).message;
      if (stillLost && !this.#failingOver) {
        this.#facts = facts;
        await this.failOver(
          `peer ${stillLost.peer} lost during a load is still gone: ${stillLost.why}`,
          new ConfigReader(cfg).strs('rpc_servers') ?? [],
          'load',
        );
        return;
      }
      if (err instanceof HydraError && err.code !== 'HYDRA_ERR_INTERNAL') throw err;
      throw new HydraError('HYDRA_ERR_LOAD_FAILED', `model load failed: ${(err as Error).message}`, {
        cause: err,
      });
    }
  }

  async #createContext(
    cfg: Params,
    facts: ModelFacts | undefined,
    peers: readonly string[] = [],
  ): Promise<void> {
    const model = this.#model!;
    const ctx = await watchPeers(
      peers,
      'the context build',
      model.createContext(contextParamsFrom(cfg)),
      (c) => ABANDONED.push(c),
    );
    let draft: Context | undefined;
    try {
      draft = await this.#draft.createContext(cfg);
    } catch (err) {
      await ctx.dispose();
      throw err;
    }
    this.#scheduler.attach(model, ctx, draft);
    this.#memory = ctx.memory();
    this.#built = { facts, cfg };
  }

  async #unload(keepQueue = false): Promise<void> {
    if (!keepQueue)
      this.#scheduler.rejectQueued(new HydraError('HYDRA_ERR_NO_MODEL', 'the model was unloaded'));
    const release = this.#scheduler.hold('unload');
    try {
      await this.#scheduler.whenIdle();
    } finally {
      release();
    }
    await this.#scheduler.whenIdle();
    await this.#freeAll();
    this.#modelPath = undefined;
    this.#placement = undefined;
  }

  async #freeAll(): Promise<void> {
    this.#built = undefined;
    this.#facts = undefined;
    await this.#scheduler.detach()?.dispose();
    await this.#draft.free();
    this.#model?.dispose();
    this.#model = undefined;
    await this.#standby?.ctx.dispose();
    this.#standby?.model.dispose();
    this.#standby = undefined;
  }

  /** See `Engine.reconfigure`. */
  async reconfigure(rebuild: 'none' | 'sampler' | 'context' | 'model'): Promise<void> {
    if (rebuild === 'model') {
      await this.load();
      return;
    }
    if (rebuild === 'context' && this.#model) {
      const built = this.#built;
      // The model keys stay as the load resolved them (an "auto" split is the one chosen then).
      const cfg = built
        ? {
            ...this.#layers.effective(),
            tensor_split: built.cfg.tensor_split,
            n_gpu_layers: built.cfg.n_gpu_layers,
          }
        : this.#layers.effective();
      const facts = this.#facts;
      // Refused before the context in force is touched (its memory counts as free: it goes first).
      if (facts) {
        checkContext(facts, cfg, await freshDevices(), built ? { facts, cfg: built.cfg } : undefined);
      }
      // New requests queue (not rejected) while the context is rebuilt.
      const release = this.#scheduler.hold('context rebuild');
      try {
        await this.#scheduler.whenIdle();
        try {
          await this.#rebuildContexts(cfg, facts);
        } catch (err) {
          if (err instanceof HydraError && err.code === 'HYDRA_ERR_PEER_LOST') {
            // The model's weights are on the lost peer too: no context can be built on it again.
            // The failover runs once the caller has put the configuration back (its own catch).
            const peers = stringsInForce(this.#layers, 'rpc_servers');
            setTimeout(() => {
              // Unless the watchdog saw the loss first and has failed over already.
              if (peers.length > 0 && stringsInForce(this.#layers, 'rpc_servers').join() === peers.join())
                void this.failOver(err.message, peers, 'context').catch(() => undefined);
            }, 0);
            throw err;
          }
          // Atomic: the context the previous configuration built comes back, or the state says error.
          if (!built) throw err;
          try {
            await this.#rebuildContexts(built.cfg, facts);
          } catch (again) {
            this.#state = 'error';
            this.#lastError = `${(err as Error).message}; restoring the previous context failed too: ${(again as Error).message}`;
          }
          throw err;
        }
        // A context built again after one that was lost ends the error state.
        if (this.#state === 'error') {
          this.#state = 'ready';
          this.#lastError = undefined;
        }
      } finally {
        release();
      }
    }
    this.#epoch += 1;
    this.#scheduler.kick();
  }

  /** Frees the context in force (and the standby's) and builds them for `cfg`. */
  async #rebuildContexts(cfg: Params, facts: ModelFacts | undefined): Promise<void> {
    await this.#scheduler.detach()?.dispose();
    this.#built = undefined;
    await this.#createContext(cfg, facts, stringsInForce(this.#layers, 'rpc_servers'));
    if (this.#standby) {
      await this.#standby.ctx.dispose();
      this.#standby.ctx = await this.#standby.model.createContext(contextParamsFrom(cfg));
    }
  }

  /** See `Engine.setExpertMode`. */
  async setExpertMode(mode: ExpertMode): Promise<{ reloaded: false; moved: number }> {
    if (!this.#standby) {
      this.#mode = mode;
      return { reloaded: false, moved: 0 };
    }
    return this.#scheduler.exclusive(async () => {
      const sb = this.#standby;
      const ctx = this.#scheduler.ctx;
      if (!sb || !ctx || !this.#model || sb.mode !== mode) return { reloaded: false as const, moved: 0 };
      let moved = 0;
      for (const i of this.#scheduler.slotsInUse()) {
        const bytes = await ctx.getSequenceState(i);
        sb.ctx.removeSequence(i);
        await sb.ctx.setSequenceState(i, bytes);
        ctx.removeSequence(i);
        moved++;
      }
      const current = { model: this.#model, ctx, mode: this.mode };
      this.#model = sb.model;
      this.#scheduler.swap(sb.model, sb.ctx);
      this.#memory = sb.ctx.memory();
      this.#standby = current;
      this.#mode = mode;
      return { reloaded: false as const, moved };
    });
  }

  /** Sets the one listener of peer losses and rejoins (the controller); see {@link PeerEvents}. */
  setPeerEvents(events: PeerEvents): void {
    if (this.#peerEvents)
      throw new HydraError('HYDRA_ERR_BAD_ARGUMENT', 'peer events already have a listener');
    this.#peerEvents = events;
  }

  /** See `Engine.failOver`. */
  async failOver(reason: string, peers: string[], cause: PeerLossEvent['cause'] = 'watchdog'): Promise<void> {
    if (this.#failingOver) return;
    this.#failingOver = true;
    this.#rejoin?.rejoin.stop();
    this.#rejoin = undefined;
    try {
      const degraded: Degraded = { reason, since: new Date().toISOString(), peers };
      this.#degraded = degraded;
      for (const p of peers) markPeerLost(p);
      const err = new HydraError('HYDRA_ERR_PEER_LOST', `the request ended: ${reason}`, {
        details: { peers },
      });
      const standby = this.#standby;
      const held = [
        `the COMBINE model's weights on this host's devices (${this.#modelPath ?? 'unknown'})`,
        "the COMBINE context's KV cache and compute buffers on this host's devices",
      ];
      // Asked before the requests end: the owner of the configuration drops what waited for the
      // slots to be free (it was meant for the configuration that is lost) before they are.
      let answer: FailoverAnswer = { build: 'none', decision: undefined, rejoin: false };
      try {
        answer =
          this.#peerEvents?.lost({
            peers: [...peers],
            reason,
            cause,
            atOnce: { endRequests: this.#scheduler.busy, abandon: held, freeStandby: standby !== undefined },
            facts: this.#facts,
          }) ?? answer;
      } catch (e) {
        // What must happen at once still happens; nothing is rebuilt on an answer that failed.
        this.#log.warn(`hydra-engine: the peer loss listener failed: ${(e as Error).message}`);
      }
      // Freeing the COMBINE model or its context frees their buffers on the dead peer too
      // (FREE_BUFFER over a parked dispatcher: it would never return), so both stay referenced.
      // The MoE standby was loaded on local devices only: it is freed.
      ABANDONED.push(this.#model, this.#scheduler.ctx);
      this.#scheduler.abandon(err);
      this.#model = undefined;
      this.#standby = undefined;
      if (standby) {
        await standby.ctx.dispose();
        standby.model.dispose();
      }
      degraded.held = {
        what: held,
        why: "llama.cpp frees a model's or context's buffers on every backend together, the peer's included; a free sent to the lost peer's parked ggml-RPC dispatcher never returns",
      };
      if (answer.decision) degraded.failover = answer.decision;
      const policy = answer.build;
      this.#log.warn(
        `hydra-engine: HYDRA_ERR_PEER_LOST: ${reason}; failover ${policy}` +
          (policy === 'offload' ? ` with n_gpu_layers ${this.#layers.get('n_gpu_layers')}` : ''),
      );
      if (answer.rejoin) this.#startRejoin(degraded, peers);
      else degraded.rejoin = { enabled: false, probes: 0 };
      if (policy === 'none') {
        this.#scheduler.rejectQueued(err);
        this.#state = 'error';
        this.#lastError = `peer lost (${reason}) and failover_policy is none: nothing was reloaded`;
        return;
      }
      if (this.#state === 'loading') return;
      await this.load();
    } finally {
      this.#failingOver = false;
    }
  }

  /** Probes the lost peers and has their COMBINE configuration restored when they answer. */
  #startRejoin(degraded: Degraded, peers: string[]): void {
    const events = this.#peerEvents!;
    const rejoin = new PeerRejoin({
      peers,
      probe: (p, t) => probeRpcServer(p, t),
      idle: () => this.#state !== 'loading' && this.#scheduler.busy === 0 && this.#scheduler.queueDepth === 0,
      active: () => this.#degraded === degraded && !this.#closing,
      log: (line) => this.#log.info(line),
      restore: async () => {
        // Registered (HELLO-probed) before anything is unloaded: a peer that went away again
        // leaves the failover model serving. Bounded: a ggml-RPC thread parked while dialing
        // holds llama.cpp's dispatcher mutex (get_dispatcher), and no registration returns again.
        for (const p of peers) await withTimeout(registerPeer(p), REJOIN_REGISTER_MS, `registering ${p}`);
        events.rejoined({ peers: [...peers] });
        try {
          await this.load();
        } catch (err) {
          events.rejoinFailed({ peers: [...peers], error: err as Error });
          this.#failingOver = true;
          try {
            await this.load();
          } finally {
            this.#failingOver = false;
          }
          throw err;
        }
      },
    });
    this.#rejoin = { rejoin, degraded };
  }

  /** See `Engine.close`. */
  async close(): Promise<void> {
    this.#closing = true;
    this.#rejoin?.rejoin.stop();
    this.#state = 'draining';
    this.#scheduler.cancelAll();
    await this.#scheduler.whenIdle();
    await this.#freeAll();
  }
}
