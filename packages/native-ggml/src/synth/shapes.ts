import { HydraError } from '../errors.js';
import { GgmlType, type GgmlTypeId, type GgufTensorInfo } from './gguf.js';

export const SYNTH_ARCHS = ['llama', 'moe', 'qwen35', 'qwen35moe'] as const;
export const SYNTH_SHAPES = ['tiny', '1b', '8b', '27b', 'small-wide', '35b-a3b'] as const;
export const SYNTH_QUANTS = ['f32', 'f16', 'q8_0', 'q4_0'] as const;
export type SynthArch = (typeof SYNTH_ARCHS)[number];
export type SynthShape = (typeof SYNTH_SHAPES)[number];
export type SynthQuant = (typeof SYNTH_QUANTS)[number];

/**
 * The linear-attention (gated delta-net) and hybrid-layout parameters of the `qwen35` /
 * `qwen35moe` archs (keys `<arch>.ssm.*`, `full_attention_interval`, `rope.dimension_sections`).
 */
export interface SynthHybridHparams {
  /** Head size of the full-attention blocks (`attention.key_length` = `value_length`). */
  headDim: number;
  /** Rotated dimensions per head (`rope.dimension_count`, a quarter of the head as in Qwen3.5). */
  nRot: number;
  /** Multi-axis RoPE sections (pairs per axis), summing to nRot / 2. */
  ropeSections: readonly [number, number, number, number];
  /** Every `fullAttentionInterval`-th block (3, 7, ... for 4) is full attention, the rest recurrent. */
  fullAttentionInterval: number;
  /** `ssm.conv_kernel`: taps of the causal conv over q/k/v. */
  ssmDConv: number;
  /** `ssm.state_size`: head size of the linear-attention keys and values. */
  ssmDState: number;
  /** `ssm.group_count`: linear-attention key heads. */
  ssmNGroup: number;
  /** `ssm.time_step_rank`: linear-attention value heads. */
  ssmDtRank: number;
  /** `ssm.inner_size` = ssmDState × ssmDtRank. */
  ssmDInner: number;
  /** Shared-expert FFN width (`expert_shared_feed_forward_length`); 0 for the dense qwen35. */
  nFfShexp: number;
}

/** The hyperparameters written into a synthetic model (keys `<arch>.*` of the GGUF). */
export interface SynthHparams {
  nVocab: number;
  nCtxTrain: number;
  nEmbd: number;
  nLayer: number;
  nHead: number;
  nHeadKv: number;
  /** Dense FFN width, or the width of each expert for MoE. */
  nFf: number;
  nExpert: number;
  nExpertUsed: number;
  ropeFreqBase: number;
  rmsEps: number;
  /**
   * Standard deviation of every weight matrix, 1/sqrt(n_embd): roughly variance-preserving, so the
   * residual stream keeps depending on the context (0.0625 for tiny, 0.014-0.022 for the others).
   */
  weightStd: number;
  /** Present for `qwen35` and `qwen35moe` only. */
  hybrid?: SynthHybridHparams;
}

interface DenseShape {
  nVocab: number;
  nCtxTrain: number;
  nEmbd: number;
  nLayer: number;
  nHead: number;
  nHeadKv: number;
  nFf: number;
  ropeFreqBase: number;
  rmsEps: number;
}

// tiny keeps a head size of 64: CUDA flash attention has no kernel for 32.
const DENSE: Readonly<Partial<Record<SynthShape, DenseShape>>> = {
  tiny: {
    nVocab: 1000,
    nCtxTrain: 4096,
    nEmbd: 256,
    nLayer: 4,
    nHead: 4,
    nHeadKv: 2,
    nFf: 512,
    ropeFreqBase: 10000,
    rmsEps: 1e-5,
  },
  '1b': {
    nVocab: 128256,
    nCtxTrain: 8192,
    nEmbd: 2048,
    nLayer: 16,
    nHead: 32,
    nHeadKv: 8,
    nFf: 8192,
    ropeFreqBase: 500000,
    rmsEps: 1e-5,
  },
  '8b': {
    nVocab: 128256,
    nCtxTrain: 8192,
    nEmbd: 4096,
    nLayer: 32,
    nHead: 32,
    nHeadKv: 8,
    nFf: 14336,
    ropeFreqBase: 500000,
    rmsEps: 1e-5,
  },
  '27b': {
    nVocab: 152064,
    nCtxTrain: 8192,
    nEmbd: 5120,
    nLayer: 64,
    nHead: 40,
    nHeadKv: 8,
    nFf: 25600,
    ropeFreqBase: 1000000,
    rmsEps: 1e-6,
  },
  // Every matrix above upstream ggml-RPC's 10 MiB hash threshold at f16 (2560x2560 = 12.5 MiB, no
  // GQA; embeddings 2560x2304 = 11.25 MiB) while the whole file stays ~255 MB: the model of the
  // no-weight-transfer test.
  'small-wide': {
    nVocab: 2304,
    nCtxTrain: 4096,
    nEmbd: 2560,
    nLayer: 2,
    nHead: 20,
    nHeadKv: 20,
    nFf: 4096,
    ropeFreqBase: 10000,
    rmsEps: 1e-5,
  },
};

/** MoE: 8 experts of n_ff/8 each, 2 used, so the total size matches the dense shape. */
export const MOE_EXPERTS = 8;
export const MOE_EXPERTS_USED = 2;

interface HybridShape extends DenseShape {
  nExpert: number;
  nExpertUsed: number;
  hybrid: SynthHybridHparams;
}

// tiny: 8 blocks = 2 full-attention (3, 7) + 6 gated delta-net; head sizes of 64 (CUDA flash
// attention and the CUDA delta-net kernel both have 64). 27b is Qwen3.5-27B (H=5120,
// 64 blocks, FA at 3,7,...,63, 4 KV heads of 256 = 2048 B/token of f16 K per FA block);
// 35b-a3b is Qwen3.5-35B-A3B (256 experts of 512, 8 used, one shared expert of 512).
const TINY_HYBRID: SynthHybridHparams = {
  headDim: 64,
  nRot: 16,
  ropeSections: [3, 3, 2, 0],
  fullAttentionInterval: 4,
  ssmDConv: 4,
  ssmDState: 64,
  ssmNGroup: 2,
  ssmDtRank: 4,
  ssmDInner: 256,
  nFfShexp: 0,
};
const TINY_HYBRID_DENSE = {
  nVocab: 1000,
  nCtxTrain: 4096,
  nEmbd: 256,
  nLayer: 8,
  nHead: 4,
  nHeadKv: 2,
  ropeFreqBase: 10000000,
  rmsEps: 1e-6,
};
const QWEN35_27B_HYBRID: SynthHybridHparams = {
  headDim: 256,
  nRot: 64,
  ropeSections: [11, 11, 10, 0],
  fullAttentionInterval: 4,
  ssmDConv: 4,
  ssmDState: 128,
  ssmNGroup: 16,
  ssmDtRank: 48,
  ssmDInner: 6144,
  nFfShexp: 0,
};

const HYBRID: Readonly<Record<'qwen35' | 'qwen35moe', Partial<Record<SynthShape, HybridShape>>>> = {
  qwen35: {
    tiny: { ...TINY_HYBRID_DENSE, nFf: 512, nExpert: 0, nExpertUsed: 0, hybrid: TINY_HYBRID },
    '27b': {
      nVocab: 248320,
      nCtxTrain: 262144,
      nEmbd: 5120,
      nLayer: 64,
      nHead: 24,
      nHeadKv: 4,
      nFf: 17408,
      ropeFreqBase: 10000000,
      rmsEps: 1e-6,
      nExpert: 0,
      nExpertUsed: 0,
      hybrid: QWEN35_27B_HYBRID,
    },
  },
  qwen35moe: {
    tiny: {
      ...TINY_HYBRID_DENSE,
      nFf: 128,
      nExpert: 8,
      nExpertUsed: 2,
      hybrid: { ...TINY_HYBRID, nFfShexp: 128 },
    },
    '35b-a3b': {
      nVocab: 248320,
      nCtxTrain: 262144,
      nEmbd: 2048,
      nLayer: 40,
      nHead: 16,
      nHeadKv: 2,
      nFf: 512,
      ropeFreqBase: 10000000,
      rmsEps: 1e-6,
      nExpert: 256,
      nExpertUsed: 8,
      hybrid: { ...QWEN35_27B_HYBRID, ssmDtRank: 32, ssmDInner: 4096, nFfShexp: 512 },
    },
  },
};

/** The shapes each arch has. */
export const SYNTH_ARCH_SHAPES: Readonly<Record<SynthArch, readonly SynthShape[]>> = {
  llama: Object.keys(DENSE) as SynthShape[],
  moe: Object.keys(DENSE) as SynthShape[],
  qwen35: Object.keys(HYBRID.qwen35) as SynthShape[],
  qwen35moe: Object.keys(HYBRID.qwen35moe) as SynthShape[],
};

/** The GGUF `general.architecture` (and key prefix) of each arch. */
export function ggufArchName(arch: SynthArch): string {
  return arch === 'moe' ? 'llama' : arch;
}

/** Throws HYDRA_ERR_BAD_ARGUMENT (key `shape`) for an arch/shape pair that does not exist. */
export function synthHparams(arch: SynthArch, shape: SynthShape): SynthHparams {
  if (arch === 'qwen35' || arch === 'qwen35moe') {
    const h = HYBRID[arch][shape];
    if (h === undefined) throw noShape(arch, shape);
    return { ...h, hybrid: { ...h.hybrid }, weightStd: 1 / Math.sqrt(h.nEmbd) };
  }
  const d = DENSE[shape];
  if (d === undefined) throw noShape(arch, shape);
  const weightStd = 1 / Math.sqrt(d.nEmbd);
  if (arch === 'moe') {
    return { ...d, nFf: d.nFf / MOE_EXPERTS, nExpert: MOE_EXPERTS, nExpertUsed: MOE_EXPERTS_USED, weightStd };
  }
  return { ...d, nExpert: 0, nExpertUsed: 0, weightStd };
}

function noShape(arch: SynthArch, shape: SynthShape): HydraError {
  return new HydraError(
    'HYDRA_ERR_BAD_ARGUMENT',
    `shape ${shape} does not exist for arch ${arch} (it has ${SYNTH_ARCH_SHAPES[arch].join(', ')})`,
    { keys: ['shape'] },
  );
}

/**
 * How a tensor's bytes are generated: `weight` N(0, std), `norm` 1 + N(0, 0.02), `decay`
 * −(1 + N(0, 0.02)) (the delta-net `ssm_a` = −exp(A_log), which must be negative or the recurrent
 * state grows without bound).
 */
export type TensorFill = 'norm' | 'weight' | 'decay';

export interface SynthTensor extends GgufTensorInfo {
  fill: TensorFill;
  /** Standard deviation of a `weight` tensor when it is not the model's weightStd. */
  std?: number;
}

const QUANT_TYPE: Readonly<Record<SynthQuant, GgmlTypeId>> = {
  f32: GgmlType.F32,
  f16: GgmlType.F16,
  q8_0: GgmlType.Q8_0,
  q4_0: GgmlType.Q4_0,
};

/** llama_ftype written as general.file_type. */
export const FILE_TYPE: Readonly<Record<SynthQuant, number>> = { f32: 0, f16: 1, q8_0: 7, q4_0: 2 };

/**
 * The tensor list of LLM_ARCH_LLAMA (src/models/llama.cpp load_arch_tensors), in the order
 * convert_hf_to_gguf.py writes it. Norms and the MoE router stay f32 as llama-quantize keeps them.
 */
export function synthTensors(h: SynthHparams, quant: SynthQuant): SynthTensor[] {
  if (h.hybrid !== undefined) return hybridTensors(h, h.hybrid, quant);
  const q = QUANT_TYPE[quant];
  const headDim = h.nEmbd / h.nHead;
  const nEmbdKv = headDim * h.nHeadKv;
  const out: SynthTensor[] = [];
  const add = (name: string, dims: number[], type: GgmlTypeId, fill: TensorFill = 'weight'): void => {
    out.push({ name, dims, type, fill });
  };
  add('token_embd.weight', [h.nEmbd, h.nVocab], q);
  for (let i = 0; i < h.nLayer; i++) {
    const b = `blk.${i}`;
    add(`${b}.attn_norm.weight`, [h.nEmbd], GgmlType.F32, 'norm');
    add(`${b}.attn_q.weight`, [h.nEmbd, h.nEmbd], q);
    add(`${b}.attn_k.weight`, [h.nEmbd, nEmbdKv], q);
    add(`${b}.attn_v.weight`, [h.nEmbd, nEmbdKv], q);
    add(`${b}.attn_output.weight`, [h.nEmbd, h.nEmbd], q);
    add(`${b}.ffn_norm.weight`, [h.nEmbd], GgmlType.F32, 'norm');
    if (h.nExpert === 0) {
      add(`${b}.ffn_gate.weight`, [h.nEmbd, h.nFf], q);
      add(`${b}.ffn_up.weight`, [h.nEmbd, h.nFf], q);
      add(`${b}.ffn_down.weight`, [h.nFf, h.nEmbd], q);
    } else {
      add(`${b}.ffn_gate_inp.weight`, [h.nEmbd, h.nExpert], GgmlType.F32);
      add(`${b}.ffn_gate_exps.weight`, [h.nEmbd, h.nFf, h.nExpert], q);
      add(`${b}.ffn_up_exps.weight`, [h.nEmbd, h.nFf, h.nExpert], q);
      add(`${b}.ffn_down_exps.weight`, [h.nFf, h.nEmbd, h.nExpert], q);
    }
  }
  add('output_norm.weight', [h.nEmbd], GgmlType.F32, 'norm');
  add('output.weight', [h.nEmbd, h.nVocab], q);
  return out;
}

/**
 * The tensor list of LLM_ARCH_QWEN35 / QWEN35MOE (src/models/qwen35.cpp, qwen35moe.cpp
 * load_arch_tensors) without MTP blocks: full-attention blocks carry a joint query+gate
 * projection and q/k norms; the others the gated delta-net tensors. The 1-D-ish tensors (conv
 * taps, dt bias, A, norms, the routers) stay f32 as llama-quantize keeps them.
 */
function hybridTensors(h: SynthHparams, y: SynthHybridHparams, quant: SynthQuant): SynthTensor[] {
  const q = QUANT_TYPE[quant];
  const F32 = GgmlType.F32;
  const nEmbdKv = y.headDim * h.nHeadKv;
  const keyDim = y.ssmDState * y.ssmNGroup;
  const valueDim = y.ssmDState * y.ssmDtRank;
  const out: SynthTensor[] = [];
  const add = (
    name: string,
    dims: number[],
    type: GgmlTypeId,
    fill: TensorFill = 'weight',
    std?: number,
  ): void => {
    out.push(std === undefined ? { name, dims, type, fill } : { name, dims, type, fill, std });
  };
  add('token_embd.weight', [h.nEmbd, h.nVocab], q);
  for (let i = 0; i < h.nLayer; i++) {
    const b = `blk.${i}`;
    add(`${b}.attn_norm.weight`, [h.nEmbd], F32, 'norm');
    if ((i + 1) % y.fullAttentionInterval === 0) {
      add(`${b}.attn_q.weight`, [h.nEmbd, y.headDim * h.nHead * 2], q);
      add(`${b}.attn_k.weight`, [h.nEmbd, nEmbdKv], q);
      add(`${b}.attn_v.weight`, [h.nEmbd, nEmbdKv], q);
      add(`${b}.attn_output.weight`, [y.headDim * h.nHead, h.nEmbd], q);
      add(`${b}.attn_q_norm.weight`, [y.headDim], F32, 'norm');
      add(`${b}.attn_k_norm.weight`, [y.headDim], F32, 'norm');
    } else {
      add(`${b}.attn_qkv.weight`, [h.nEmbd, keyDim * 2 + valueDim], q);
      add(`${b}.attn_gate.weight`, [h.nEmbd, valueDim], q);
      // Four taps of sd 0.5 keep the conv output near the input's scale.
      add(
        `${b}.ssm_conv1d.weight`,
        [y.ssmDConv, keyDim * 2 + valueDim],
        F32,
        'weight',
        1 / Math.sqrt(y.ssmDConv),
      );
      add(`${b}.ssm_dt.bias`, [y.ssmDtRank], F32);
      add(`${b}.ssm_a`, [y.ssmDtRank], F32, 'decay');
      add(`${b}.ssm_beta.weight`, [h.nEmbd, y.ssmDtRank], F32);
      add(`${b}.ssm_alpha.weight`, [h.nEmbd, y.ssmDtRank], F32);
      add(`${b}.ssm_norm.weight`, [y.ssmDState], F32, 'norm');
      add(`${b}.ssm_out.weight`, [valueDim, h.nEmbd], q);
    }
    add(`${b}.post_attention_norm.weight`, [h.nEmbd], F32, 'norm');
    if (h.nExpert === 0) {
      add(`${b}.ffn_gate.weight`, [h.nEmbd, h.nFf], q);
      add(`${b}.ffn_up.weight`, [h.nEmbd, h.nFf], q);
      add(`${b}.ffn_down.weight`, [h.nFf, h.nEmbd], q);
    } else {
      add(`${b}.ffn_gate_inp.weight`, [h.nEmbd, h.nExpert], F32);
      add(`${b}.ffn_gate_exps.weight`, [h.nEmbd, h.nFf, h.nExpert], q);
      add(`${b}.ffn_up_exps.weight`, [h.nEmbd, h.nFf, h.nExpert], q);
      add(`${b}.ffn_down_exps.weight`, [h.nFf, h.nEmbd, h.nExpert], q);
      add(`${b}.ffn_gate_inp_shexp.weight`, [h.nEmbd], F32);
      add(`${b}.ffn_gate_shexp.weight`, [h.nEmbd, y.nFfShexp], q);
      add(`${b}.ffn_up_shexp.weight`, [h.nEmbd, y.nFfShexp], q);
      add(`${b}.ffn_down_shexp.weight`, [y.nFfShexp, h.nEmbd], q);
    }
  }
  add('output_norm.weight', [h.nEmbd], F32, 'norm');
  add('output.weight', [h.nEmbd, h.nVocab], q);
  return out;
}
