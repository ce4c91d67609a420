import { fail } from './errors.js';
import type { ModelClass } from './model-facts.js';
import { isPeerAddress, type ModelEntry, type ModelRegistry } from './registry.js';

/**
 * SOLO: the model on this engine's device alone. COMBINED: together with a peer engine's device
 * (the spelling of STATUS and SET_EXPERT_MODE on the wire).
 */
export type CombineMode = 'solo' | 'combined';

/** Inputs of {@link resolveCombine}. */
export interface CombineRequest {
  /** A registry alias or GGUF path (looked up in `registry` when given), or a registry entry. */
  readonly model: string | ModelEntry;
  readonly mode: CombineMode;
  /** The peer engine (`host:port`); defaults to the registry entry's `peer`. */
  readonly peer?: string;
  /** The model class, normally modelClassOf(gguf); defaults to the registry entry's `class`. */
  readonly modelClass?: ModelClass;
  readonly registry?: ModelRegistry;
  /** Split for a dense COMBINE (e.g. from the planner); defaults to the entry's `tensor_split`. */
  readonly tensorSplit?: readonly number[];
}

/** A CONFIGURE (0x40) params delta, keyed as protocol.md names the fields. */
export interface CombineDelta {
  model: string;
  n_gpu_layers: number;
  n_cpu_moe?: number;
  override_tensors?: string[];
  rpc_servers?: string[];
  split_mode?: 'none' | 'layer';
  tensor_split?: number[];
}

/** Host-side placements of an MoE model's embedding and output tensors: the COMBINE table's defaults. */
export const MOE_HOST_OVERRIDES: readonly string[] = ['token_embd=CPU', 'output=CPU', 'output_norm=CPU'];
// llama.cpp's LLM_FFN_EXPS_REGEX: merged gate_up and channel-wise (chexps) expert tensors included.
const FFN_EXPS = '\\.ffn_(up|down|gate|gate_up)_(ch|)exps';
/** Every expert FFN tensor of every block: the `-ot` pattern that moves a MoE model's experts. */
export const EXPERT_TENSOR_REGEX = `blk\\.\\d+${FFN_EXPS}`;
/** The expert tensors of block `layer` alone (llama.cpp's `llm_ffn_exps_block_regex`, as `--n-cpu-moe` builds them). */
export function expertBlockRegex(layer: number): string {
  return `blk\\.${layer}${FFN_EXPS}`;
}
const DEFAULT_N_GPU_LAYERS = 99;
const DEFAULT_N_CPU_MOE = 8;

/**
 * The unified COMBINE table: (MoE | dense) x (solo | combine) -> the stock-params CONFIGURE delta.
 *
 * | class | solo | combine |
 * | --- | --- | --- |
 * | moe | n_gpu_layers, n_cpu_moe, host overrides | solo + experts on the peer (override_tensors), rpc_servers |
 * | dense | n_gpu_layers, split_mode none | split_mode layer, tensor_split, rpc_servers |
 *
 * Registry defaults (n_gpu_layers, n_cpu_moe, override_tensors, tensor_split) replace the table's.
 * Errors: HYDRA_ERR_UNKNOWN_MODEL (alias not in the registry), HYDRA_ERR_BAD_VALUE (bad mode, no or
 * bad peer for combine, unknown model class, dense combine without a split).
 */
export function resolveCombine(req: CombineRequest): CombineDelta {
  if (req.mode !== 'solo' && req.mode !== 'combined') {
    fail('HYDRA_ERR_BAD_VALUE', 'mode must be "solo" or "combined"', { keys: ['mode'] });
  }
  let entry: ModelEntry;
  if (typeof req.model === 'string') {
    if (req.model === '')
      fail('HYDRA_ERR_BAD_VALUE', 'model must be a non-empty string', { keys: ['model'] });
    entry = req.registry
      ? req.registry.resolve(req.model)
      : { alias: req.model, path: req.model, defaults: {} };
  } else {
    entry = req.model;
  }
  const modelClass = req.modelClass ?? entry.class;
  if (modelClass !== 'moe' && modelClass !== 'dense') {
    fail(
      'HYDRA_ERR_BAD_VALUE',
      `model class of ${entry.alias} is unknown: pass modelClass (read from the GGUF)`,
      {
        keys: ['modelClass'],
      },
    );
  }
  const d = entry.defaults;
  const nGpuLayers = d.n_gpu_layers ?? DEFAULT_N_GPU_LAYERS;

  let peer: string | undefined;
  if (req.mode === 'combined') {
    peer = req.peer ?? entry.peer;
    if (!isPeerAddress(peer)) {
      fail('HYDRA_ERR_BAD_VALUE', 'combine needs a peer as host:port', { keys: ['peer'] });
    }
  }

  if (modelClass === 'moe') {
    const overrides = [...(d.override_tensors ?? MOE_HOST_OVERRIDES)];
    const delta: CombineDelta = {
      model: entry.alias,
      n_gpu_layers: nGpuLayers,
      n_cpu_moe: d.n_cpu_moe ?? DEFAULT_N_CPU_MOE,
      override_tensors: overrides,
    };
    if (peer !== undefined) {
      // The peer is the first (and only) RPC server, so its buffer type is RPC0[host:port].
      overrides.push(`${EXPERT_TENSOR_REGEX}=RPC0[${peer}]`);
      delta.rpc_servers = [peer];
    }
    return delta;
  }

  if (peer === undefined) return { model: entry.alias, n_gpu_layers: nGpuLayers, split_mode: 'none' };
  const split = req.tensorSplit ?? d.tensor_split;
  if (
    split === undefined ||
    split.length === 0 ||
    !split.every((x) => Number.isFinite(x) && x >= 0) ||
    !split.some((x) => x > 0)
  ) {
    fail('HYDRA_ERR_BAD_VALUE', `dense combine of ${entry.alias} needs tensor_split (request or registry)`, {
      keys: ['tensor_split'],
    });
  }
  return {
    model: entry.alias,
    n_gpu_layers: nGpuLayers,
    split_mode: 'layer',
    tensor_split: [...split],
    rpc_servers: [peer],
  };
}
