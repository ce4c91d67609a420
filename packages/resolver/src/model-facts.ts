import { fail } from './errors.js';
import type { GgufFile, GgufValue } from './gguf/reader.js';
import { checkHparams } from './model-checks.js';

/** Mixture-of-experts or dense: the one model property the COMBINE table branches on. */
export type ModelClass = 'moe' | 'dense';

/** What a repeating layer keeps per token or per sequence (llama.cpp memory types). */
export type LayerKind = 'attention' | 'swa' | 'recurrent' | 'nextn';

/** One repeating layer (block) of the model. */
export interface LayerFacts {
  readonly index: number;
  readonly kind: LayerKind;
  /** Weight bytes of every `blk.<index>.*` tensor. */
  readonly weightBytes: number;
  /** n_embd_k_gqa / n_embd_v_gqa of the layer (0 for recurrent layers). */
  readonly nEmbdKGqa: number;
  readonly nEmbdVGqa: number;
  readonly nHead: number;
}

/** The model facts the planner and the COMBINE table need, read from GGUF metadata and the tensor table. */
export interface ModelFacts {
  readonly arch: string;
  readonly name?: string;
  readonly modelClass: ModelClass;
  readonly nExpert: number;
  /** block_count: every repeating layer, MTP/nextn layers included (llama.cpp n_layer_all). */
  readonly nLayerAll: number;
  /** MTP/nextn layers at the end of the block list. */
  readonly nLayerNextn: number;
  /** Whether the main context keeps KV for the nextn layers (llama.cpp filters them out for some archs). */
  readonly nextnHasKv: boolean;
  readonly nEmbd: number;
  /** `<arch>.context_length` (llama.cpp n_ctx_train; 0 when absent): what `n_ctx` 0 means. */
  readonly nCtxTrain: number;
  readonly nVocab: number;
  readonly nFfMax: number;
  /** Sliding window size (0 without SWA layers). */
  readonly nSwa: number;
  /** Recurrent state widths per layer in f32 elements (llama_hparams n_embd_r / n_embd_s). */
  readonly nEmbdR: number;
  readonly nEmbdS: number;
  readonly layers: readonly LayerFacts[];
  /** token_embd bytes: llama.cpp keeps the input layer on the CPU. */
  readonly inputBytes: number;
  /** output, output_norm and other non-block tensors, placed with the output layer. */
  readonly outputBytes: number;
  /** True when the model has no `output.weight` and llama.cpp duplicates token_embd as the output. */
  readonly tiedOutput: boolean;
  /** Facts the reader had to guess (architecture features it does not model exactly). */
  readonly warnings: readonly string[];
}

const RECURRENT_ARCHS = new Set(['mamba', 'mamba2', 'rwkv6', 'rwkv6qwen2', 'rwkv7', 'arwkv7']);
const INTERVAL_HYBRID_ARCHS = new Set(['qwen3next', 'qwen35', 'qwen35moe', 'qwen4exp', 'minimax-01']);
const HYBRID_ARCHS = new Set([
  'jamba',
  'falcon-h1',
  'plamo2',
  'granitehybrid',
  'lfm2',
  'lfm2moe',
  'nemotron_h',
  'nemotron_h_moe',
  'kimi-linear',
  'bailingmoe3',
  ...INTERVAL_HYBRID_ARCHS,
]);
// Architectures whose main-context KV cache filters out the nextn layers (llama_model::create_memory).
const NEXTN_NO_KV_ARCHS = new Set([
  'step35',
  'hy-v3',
  'glm-dsa',
  'mimo2',
  'deepseek32',
  'dots3note',
  'deepseek4',
]);
// Architectures whose SWA pattern llama.cpp hard-codes instead of reading it from the GGUF.
const SWA_PATTERN_DEFAULTS: Record<string, number> = { gemma2: 2, gemma3: 6, cohere2: 4 };

/**
 * Reads the {@link ModelFacts} of a parsed GGUF. Throws HYDRA_ERR_MODEL_METADATA when a key the
 * planner needs (architecture, block_count, embedding_length) is missing or malformed, or when
 * {@link checkHparams} refuses the file (before any per-layer array is sized by block_count).
 */
export function modelFactsFromGguf(gguf: GgufFile): ModelFacts {
  checkHparams(gguf);
  const warnings: string[] = [];
  const arch = gguf.get('general.architecture');
  if (typeof arch !== 'string' || arch === '') {
    fail('HYDRA_ERR_MODEL_METADATA', 'GGUF has no general.architecture', { keys: ['general.architecture'] });
  }
  const key = (k: string) => `${arch}.${k}`;
  const uint = (k: string, fallback?: number): number => {
    const v = gguf.get(key(k));
    if (v === undefined && fallback !== undefined) return fallback;
    if (typeof v !== 'number' || !Number.isInteger(v) || v < 0) {
      return fail('HYDRA_ERR_MODEL_METADATA', `GGUF metadata ${key(k)} must be a non-negative integer`, {
        keys: [key(k)],
      });
    }
    return v;
  };

  const nLayerAll = uint('block_count');
  if (nLayerAll === 0)
    fail('HYDRA_ERR_MODEL_METADATA', `${key('block_count')} is 0`, { keys: [key('block_count')] });
  const nLayerNextn = uint('nextn_predict_layers', 0);
  if (nLayerNextn > nLayerAll) {
    fail('HYDRA_ERR_MODEL_METADATA', `${key('nextn_predict_layers')} exceeds block_count`, {
      keys: [key('nextn_predict_layers')],
    });
  }
  const nLayer = nLayerAll - nLayerNextn;
  const nEmbd = uint('embedding_length');
  const nCtxTrain = uint('context_length', 0);
  const nExpert = uint('expert_count', 0);
  const perLayer = (k: string, fallback: readonly number[] | number): number[] =>
    perLayerArray(gguf.get(key(k)), nLayerAll, key(k), fallback);

  const nHead = perLayer('attention.head_count', 0);
  const nHeadKv = perLayer('attention.head_count_kv', nHead);
  const nFf = perLayer('feed_forward_length', 0);
  const nHead0 = nHead[0] ?? 0;
  const headK = uint('attention.key_length', nHead0 > 0 ? Math.floor(nEmbd / nHead0) : 0);
  const headV = uint('attention.value_length', nHead0 > 0 ? Math.floor(nEmbd / nHead0) : 0);
  const headKSwa = uint('attention.key_length_swa', headK);
  const headVSwa = uint('attention.value_length_swa', headV);
  const nSwaRaw = uint('attention.sliding_window', 0);

  const recurrent = recurrentLayers(gguf, arch, nLayerAll, nLayer, nHeadKv, warnings);
  const swa =
    nSwaRaw > 0 ? swaLayers(gguf, arch, nLayerAll, nLayer, warnings) : new Array(nLayerAll).fill(false);
  const nSwa = swa.some(Boolean) ? nSwaRaw : 0;

  const dConv = uint('ssm.conv_kernel', 0);
  const dInner = uint('ssm.inner_size', 0);
  const dState = uint('ssm.state_size', 0);
  const nGroup = uint('ssm.group_count', 0);
  const nEmbdR = (dConv > 0 ? dConv - 1 : 0) * (dInner + 2 * nGroup * dState);
  const nEmbdS = dState * dInner;
  if (recurrent.some(Boolean) && nEmbdR + nEmbdS === 0) {
    warnings.push(`${arch}: recurrent state size not derivable from ssm.* metadata; counted as 0`);
  }

  const layerBytes = new Array<number>(nLayerAll).fill(0);
  let inputBytes = 0;
  let outputBytes = 0;
  let hasOutput = false;
  for (const t of gguf.tensors) {
    const m = /^blk\.(\d+)\./.exec(t.name);
    if (m) {
      const il = Number(m[1]);
      if (il < nLayerAll) {
        layerBytes[il] = (layerBytes[il] as number) + t.bytes;
      } else {
        warnings.push(`tensor ${t.name} names a block past block_count; placed with the output`);
        outputBytes += t.bytes;
      }
    } else if (t.name.startsWith('token_embd.')) {
      inputBytes += t.bytes;
    } else {
      if (t.name === 'output.weight') hasOutput = true;
      outputBytes += t.bytes;
    }
  }
  const tokenEmbd = gguf.tensors.find((t) => t.name === 'token_embd.weight');
  const tiedOutput = !hasOutput && tokenEmbd !== undefined;
  if (tiedOutput) outputBytes += tokenEmbd.bytes;

  const tokens = gguf.get('tokenizer.ggml.tokens');
  const nVocab =
    typeof gguf.get(key('vocab_size')) === 'number'
      ? (gguf.get(key('vocab_size')) as number)
      : Array.isArray(tokens)
        ? tokens.length
        : (tokenEmbd?.dims[1] ?? 0);

  const layers: LayerFacts[] = [];
  for (let il = 0; il < nLayerAll; il++) {
    const isNextn = il >= nLayer;
    const isRecr = recurrent[il] === true;
    const isSwa = swa[il] === true;
    const kind: LayerKind = isNextn ? 'nextn' : isRecr ? 'recurrent' : isSwa ? 'swa' : 'attention';
    const kvHeads = nHeadKv[il] ?? 0;
    layers.push({
      index: il,
      kind,
      weightBytes: layerBytes[il] as number,
      nEmbdKGqa: isRecr ? 0 : (isSwa ? headKSwa : headK) * kvHeads,
      nEmbdVGqa: isRecr ? 0 : (isSwa ? headVSwa : headV) * kvHeads,
      nHead: nHead[il] ?? 0,
    });
  }

  const name = gguf.get('general.name');
  return {
    arch,
    ...(typeof name === 'string' ? { name } : {}),
    modelClass: nExpert > 0 ? 'moe' : 'dense',
    nExpert,
    nLayerAll,
    nLayerNextn,
    nextnHasKv: !HYBRID_ARCHS.has(arch) && !RECURRENT_ARCHS.has(arch) && !NEXTN_NO_KV_ARCHS.has(arch),
    nEmbd,
    nCtxTrain,
    nVocab,
    nFfMax: Math.max(0, ...nFf),
    nSwa,
    nEmbdR,
    nEmbdS,
    layers,
    inputBytes,
    outputBytes,
    tiedOutput,
    warnings,
  };
}

/** MoE when `<arch>.expert_count` > 0, as llama.cpp reads n_expert. */
export function modelClassOf(gguf: GgufFile): ModelClass {
  const arch = gguf.get('general.architecture');
  const n = typeof arch === 'string' ? gguf.get(`${arch}.expert_count`) : undefined;
  return typeof n === 'number' && n > 0 ? 'moe' : 'dense';
}

function perLayerArray(
  v: GgufValue | undefined,
  n: number,
  k: string,
  fallback: readonly number[] | number,
): number[] {
  if (v === undefined) return typeof fallback === 'number' ? new Array(n).fill(fallback) : [...fallback];
  if (typeof v === 'number' && Number.isInteger(v) && v >= 0) return new Array(n).fill(v);
  if (
    Array.isArray(v) &&
    v.length >= n &&
    v.every((x) => typeof x === 'number' && Number.isInteger(x) && x >= 0)
  ) {
    return (v as number[]).slice(0, n);
  }
  return fail('HYDRA_ERR_MODEL_METADATA', `GGUF metadata ${k} must be an integer or one per layer`, {
    keys: [k],
  });
}

function recurrentLayers(
  gguf: GgufFile,
  arch: string,
  nLayerAll: number,
  nLayer: number,
  nHeadKv: readonly number[],
  warnings: string[],
): boolean[] {
  const out = new Array<boolean>(nLayerAll).fill(false);
  if (RECURRENT_ARCHS.has(arch)) return out.map((_, il) => il < nLayer);
  if (!HYBRID_ARCHS.has(arch)) return out;
  const listed = gguf.get(`${arch}.attention.recurrent_layers`);
  if (Array.isArray(listed)) {
    for (let il = 0; il < nLayer; il++) out[il] = listed[il] === true || listed[il] === 1;
    return out;
  }
  if (INTERVAL_HYBRID_ARCHS.has(arch)) {
    const v = gguf.get(`${arch}.full_attention_interval`);
    const interval = typeof v === 'number' && v > 0 ? v : 4;
    for (let il = 0; il < nLayer; il++) out[il] = (il + 1) % interval !== 0;
    return out;
  }
  // Other hybrids mark their recurrent layers by having no KV heads.
  warnings.push(`${arch}: recurrent layers taken as those with head_count_kv = 0`);
  for (let il = 0; il < nLayer; il++) out[il] = (nHeadKv[il] ?? 0) === 0;
  return out;
}

function swaLayers(
  gguf: GgufFile,
  arch: string,
  nLayerAll: number,
  nLayer: number,
  warnings: string[],
): boolean[] {
  const out = new Array<boolean>(nLayerAll).fill(false);
  const pattern = gguf.get(`${arch}.attention.sliding_window_pattern`);
  if (Array.isArray(pattern)) {
    for (let il = 0; il < nLayer; il++) out[il] = pattern[il] === true || pattern[il] === 1;
    return out;
  }
  const n = typeof pattern === 'number' ? pattern : SWA_PATTERN_DEFAULTS[arch];
  if (n === undefined) {
    warnings.push(`${arch}: sliding_window set without a pattern; every layer taken as full attention`);
    return out;
  }
  // llama_hparams::set_swa_pattern(n, dense_first = false): the last layer of each group is dense.
  for (let il = 0; il < nLayer; il++) out[il] = n === 0 || il % n < n - 1;
  return out;
}
