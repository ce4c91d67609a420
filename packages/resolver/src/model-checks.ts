import { fail } from './errors.js';
import type { GgufFile, GgufValue } from './gguf/reader.js';

/** llama.cpp's LLAMA_MAX_LAYERS (src/llama-hparams.h of the pinned version). */
export const LLAMA_MAX_LAYERS = 512;
/** llama.cpp's LLAMA_MAX_EXPERTS (src/llama-hparams.h of the pinned version). */
export const LLAMA_MAX_EXPERTS = 1024;
/** Rope scaling names llama_rope_scaling_type_from_string knows (LLAMA_ROPE_SCALING_TYPES). */
const ROPE_SCALING_TYPES = ['none', 'linear', 'yarn', 'longrope'];
// llama_model::load_hparams zeroes the experts of these when expert_count <= 1.
const EXPERTS_DROPPED_AT_ONE = new Set(['hunyuan-vl', 'hunyuan-dense']);

/**
 * Refuses a GGUF whose hyperparameters would trip a GGML_ASSERT in the pinned llama.cpp's
 * `llama_model::load_hparams`: such an assert aborts the whole process instead of failing the load.
 * Mirrors those asserts exactly (block count in 1..512, nextn layers within it, the expert and
 * expert-group counts, a known rope scaling type); values llama.cpp rejects by throwing (which
 * fails the load cleanly) are left to it. Throws HYDRA_ERR_MODEL_METADATA naming the key.
 */
export function checkHparams(gguf: GgufFile): void {
  const arch = gguf.get('general.architecture');
  if (typeof arch !== 'string' || arch === '') {
    fail('HYDRA_ERR_MODEL_METADATA', 'GGUF has no general.architecture', { keys: ['general.architecture'] });
  }
  const key = (k: string) => `${arch}.${k}`;
  const bad = (k: string, why: string): never =>
    fail('HYDRA_ERR_MODEL_METADATA', `GGUF metadata ${key(k)} ${why}`, { keys: [key(k)] });
  // llama.cpp refuses a value of the wrong GGUF type by throwing; only numbers reach its asserts.
  const num = (k: string): number | undefined => {
    const v = gguf.get(key(k));
    if (typeof v === 'number') return v;
    if (typeof v === 'bigint') return Number(v);
    return undefined;
  };

  const nLayerAll = num('block_count');
  if (nLayerAll !== undefined && !(nLayerAll > 0 && nLayerAll <= LLAMA_MAX_LAYERS)) {
    bad('block_count', `is ${nLayerAll}; llama.cpp loads 1..${LLAMA_MAX_LAYERS} blocks`);
  }
  const nLayer = nLayerAll ?? 0;
  const nextn = num('nextn_predict_layers') ?? 0;
  if (nextn > nLayer) bad('nextn_predict_layers', `(${nextn}) exceeds block_count (${nLayer})`);

  let nExpert = num('expert_count') ?? 0;
  let usedMax = maxOf(gguf.get(key('expert_used_count')), nLayer);
  if (EXPERTS_DROPPED_AT_ONE.has(arch) && nExpert <= 1) {
    nExpert = 0;
    usedMax = 0;
  }
  const groups = num('expert_group_count') ?? 0;
  const groupUsed = num('expert_group_used_count') ?? 0;
  if (nExpert > LLAMA_MAX_EXPERTS)
    bad('expert_count', `is ${nExpert}; llama.cpp allows ${LLAMA_MAX_EXPERTS}`);
  if (usedMax > nExpert) bad('expert_used_count', `(${usedMax}) exceeds expert_count (${nExpert})`);
  if (nExpert > 0) {
    if (usedMax <= 0) bad('expert_used_count', 'must be positive when the model has experts');
    if (groups >= nExpert) bad('expert_group_count', `(${groups}) must be below expert_count (${nExpert})`);
    if (groups > 1) {
      if (nExpert % groups !== 0)
        bad('expert_group_count', `(${groups}) must divide expert_count (${nExpert})`);
      if (!(groupUsed > 0 && groupUsed < groups)) {
        bad('expert_group_used_count', `(${groupUsed}) must be in 1..${groups - 1}`);
      }
    }
  } else {
    if (usedMax !== 0) bad('expert_used_count', 'must be 0 without experts');
    if (groups !== 0) bad('expert_group_count', 'must be 0 without experts');
  }

  const scaling = gguf.get(key('rope.scaling.type'));
  if (typeof scaling === 'string' && !ROPE_SCALING_TYPES.includes(scaling)) {
    bad(
      'rope.scaling.type',
      `is ${JSON.stringify(scaling)}; llama.cpp knows ${ROPE_SCALING_TYPES.join(', ')}`,
    );
  }
}

/** The largest of a scalar or the first `n` entries of an array (llama.cpp get_key_or_arr). */
function maxOf(v: GgufValue | undefined, n: number): number {
  if (typeof v === 'number') return v;
  if (typeof v === 'bigint') return Number(v);
  if (!Array.isArray(v)) return 0;
  let max = 0;
  for (const x of v.slice(0, n)) {
    const y = typeof x === 'number' ? x : typeof x === 'bigint' ? Number(x) : 0;
    if (y > max) max = y;
  }
  return max;
}
