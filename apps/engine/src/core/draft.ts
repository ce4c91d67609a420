// The draft model of speculative decoding (`speculative.model`, llama-server's -md): loaded beside
// the target once its vocabulary passed llama.cpp's compatibility check, with a context of its own
// that has one sequence per target slot and as many tokens per sequence as the target's, as
// llama-server builds it (common_speculative_init_result). The runtime owns it; the scheduler
// drafts with the context (see Scheduler #draftStep).
import { type Context, Model, type ModelLoadParams } from '@hydra-engine/native-ggml';
import type { Params } from '@hydra-engine/tiering';
import { loadDevices, safeDevices } from '../combine/devices.js';
import { HydraError } from '../errors.js';
import { contextParamsFrom } from './params.js';
import { speculativeFrom } from './speculative.js';

/** What the draft model was loaded with: a reload happens when any of it changes. */
function loadKey(p: ModelLoadParams): string {
  return JSON.stringify([p.path, p.nGpuLayers ?? null, p.devices ?? null]);
}

/** The draft model's load parameters of `cfg`, or undefined when no draft model is configured. */
export function draftLoadParams(cfg: Params): ModelLoadParams | undefined {
  const spec = speculativeFrom(cfg);
  if (spec?.type !== 'draft_simple') return undefined;
  const ngl = (cfg['speculative.n_gpu_layers'] as number | undefined) ?? -1;
  const devices = (cfg['speculative.devices'] as string[] | undefined) ?? [];
  const out: ModelLoadParams = { path: cfg['speculative.model'] as string };
  if (ngl !== -1) out.nGpuLayers = ngl;
  if (devices.length > 0) out.devices = devices;
  return out;
}

/** The draft model and its context, kept in step with the target's model and context. */
export class DraftRuntime {
  #model: Model | undefined;
  #key: string | undefined;
  #ctx: Context | undefined;

  get model(): Model | undefined {
    return this.#model;
  }

  /**
   * Loads the draft model `cfg` names for `target` (kept when already loaded with the same
   * parameters), or frees it when none is named. An unknown device is HYDRA_ERR_NO_DEVICE, a
   * vocabulary the target's tokens do not match HYDRA_ERR_DRAFT_INCOMPATIBLE (nothing stays loaded).
   */
  async load(cfg: Params, target: Model): Promise<void> {
    const params = draftLoadParams(cfg);
    if (!params) {
      await this.free();
      return;
    }
    if (params.devices) {
      // The names only, as the last registration read them: asking an RPC device for its memory
      // here, on the JS thread, would wait on a peer that may be this very process.
      const known = new Set(safeDevices().map((d) => d.name));
      const missing = params.devices.filter((d) => !known.has(d));
      if (missing.length > 0)
        throw new HydraError(
          'HYDRA_ERR_NO_DEVICE',
          `speculative.devices names no device of this host or its registered peers: ${missing.join(', ')} (have ${[...known].join(', ')})`,
          { keys: ['speculative.devices'] },
        );
    } else {
      // Once a peer was registered in this process llama.cpp's default placement would include
      // its devices (a peer that may be gone: the load would wait on it): local devices only.
      const local = loadDevices([], {});
      if (local) params.devices = local.devices;
    }
    const key = loadKey(params);
    if (this.#model && this.#key === key && !this.#model.disposed) {
      this.#check(target, this.#model);
      return;
    }
    await this.free();
    const model = await Model.load(params).catch((err: unknown) => {
      throw new HydraError('HYDRA_ERR_LOAD_FAILED', `draft model ${params.path}: ${(err as Error).message}`, {
        keys: ['speculative.model'],
        cause: err,
      });
    });
    try {
      this.#check(target, model);
    } catch (err) {
      model.dispose();
      throw err;
    }
    this.#model = model;
    this.#key = key;
  }

  #check(target: Model, draft: Model): void {
    const why = target.draftVocabMismatch(draft);
    if (why !== '')
      throw new HydraError(
        'HYDRA_ERR_DRAFT_INCOMPATIBLE',
        `the draft model ${draft.path} cannot draft for ${target.path}: ${why}`,
        { keys: ['speculative.model'] },
      );
    if (draft.info.recurrent)
      throw new HydraError(
        'HYDRA_ERR_DRAFT_INCOMPATIBLE',
        `the draft model ${draft.path} is recurrent: its KV cannot drop rejected guesses`,
        { keys: ['speculative.model'] },
      );
  }

  /**
   * A fresh draft context for the target context `cfg` builds (the previous one is freed), or
   * undefined without a draft model. Sampling runs on the host: a draft reads the top candidates.
   */
  async createContext(cfg: Params): Promise<Context | undefined> {
    await this.#ctx?.dispose();
    this.#ctx = undefined;
    if (!this.#model) return undefined;
    const params = contextParamsFrom(cfg);
    delete params.nOutputsMaxPerSeq;
    // The draft model is never recurrent (#check): it keeps no rollback snapshots.
    delete params.nRsSeq;
    this.#ctx = await this.#model.createContext({ ...params, backendSampling: false });
    return this.#ctx;
  }

  /** Frees the context and the model. */
  async free(): Promise<void> {
    await this.#ctx?.dispose();
    this.#ctx = undefined;
    this.#model?.dispose();
    this.#model = undefined;
    this.#key = undefined;
  }
}
