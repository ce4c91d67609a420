import { GgmlType, type GgmlTypeId, type GgufTensorInfo } from './gguf.js';

export const SYNTH_ARCHS = ['llama', 'moe'] as const;
export const SYNTH_SHAPES = ['tiny', '1b', '8b', '27b', 'small-wide'] as const;
export const SYNTH_QUANTS = ['f32', 'f16', 'q8_0', 'q4_0'] as const;
export type SynthArch = (typeof SYNTH_ARCHS)[number];
export type SynthShape = (typeof SYNTH_SHAPES)[number];
export type SynthQuant = (typeof SYNTH_QUANTS)[number];

/** The hyperparameters written into a synthetic model (keys `llama.*` of the GGUF). */
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
const DENSE: Readonly<Record<SynthShape, DenseShape>> = {
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

export function synthHparams(arch: SynthArch, shape: SynthShape): SynthHparams {
  const d = DENSE[shape];
  const weightStd = 1 / Math.sqrt(d.nEmbd);
  if (arch === 'moe') {
    return { ...d, nFf: d.nFf / MOE_EXPERTS, nExpert: MOE_EXPERTS, nExpertUsed: MOE_EXPERTS_USED, weightStd };
  }
  return { ...d, nExpert: 0, nExpertUsed: 0, weightStd };
}

/** How a tensor's bytes are generated. */
export type TensorFill = 'norm' | 'weight';

export interface SynthTensor extends GgufTensorInfo {
  fill: TensorFill;
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
