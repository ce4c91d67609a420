import { createHash } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import fc from 'fast-check';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  parseSynthArgs,
  planSyntheticModel,
  runSynthCli,
  type SynthProgress,
  writeSyntheticModel,
} from '../src/synth/index.js';

// An independent GGUF v3 reader: the expectations below come from the format and from llama.cpp,
// not from the generator's own tables.

type Kv = number | bigint | boolean | string | unknown[];
interface TensorInfo {
  name: string;
  dims: number[];
  type: number;
  offset: number;
}
interface Gguf {
  version: number;
  kv: Map<string, Kv>;
  kvTypes: Map<string, number>;
  tensors: TensorInfo[];
  dataStart: number;
  buf: Buffer;
}

// ggml.c type_traits: [block size, bytes per block].
const TRAITS: Record<number, [number, number]> = { 0: [1, 4], 1: [1, 2], 2: [32, 18], 8: [32, 34] };
const TYPE_OF_QUANT: Record<string, number> = { f32: 0, f16: 1, q4_0: 2, q8_0: 8 };

function readGguf(path: string): Gguf {
  const buf = readFileSync(path);
  let p = 0;
  const u32 = (): number => {
    const v = buf.readUInt32LE(p);
    p += 4;
    return v;
  };
  const u64 = (): number => {
    const v = Number(buf.readBigUInt64LE(p));
    p += 8;
    return v;
  };
  const str = (): string => {
    const n = u64();
    const s = buf.toString('utf8', p, p + n);
    p += n;
    return s;
  };
  const value = (type: number): Kv => {
    switch (type) {
      case 0:
        return buf.readUInt8(p++);
      case 1:
        return buf.readInt8(p++);
      case 4:
        return u32();
      case 5: {
        const v = buf.readInt32LE(p);
        p += 4;
        return v;
      }
      case 6: {
        const v = buf.readFloatLE(p);
        p += 4;
        return v;
      }
      case 7:
        return buf.readUInt8(p++) !== 0;
      case 8:
        return str();
      case 9: {
        const itemType = u32();
        const n = u64();
        const items: unknown[] = [];
        for (let i = 0; i < n; i++) items.push(value(itemType));
        return items;
      }
      case 10: {
        const v = buf.readBigUInt64LE(p);
        p += 8;
        return v;
      }
      default:
        throw new Error(`unexpected gguf type ${type}`);
    }
  };
  expect(buf.toString('latin1', 0, 4)).toBe('GGUF');
  p = 4;
  const version = u32();
  const nTensors = u64();
  const nKv = u64();
  const kv = new Map<string, Kv>();
  const kvTypes = new Map<string, number>();
  for (let i = 0; i < nKv; i++) {
    const key = str();
    const type = u32();
    kvTypes.set(key, type === 9 ? 900 + buf.readUInt32LE(p) : type);
    expect(kv.has(key)).toBe(false);
    kv.set(key, value(type));
  }
  const tensors: TensorInfo[] = [];
  for (let i = 0; i < nTensors; i++) {
    const name = str();
    const nDims = u32();
    const dims: number[] = [];
    for (let d = 0; d < nDims; d++) dims.push(u64());
    tensors.push({ name, dims, type: u32(), offset: u64() });
  }
  const alignment = (kv.get('general.alignment') as number | undefined) ?? 32;
  const dataStart = Math.ceil(p / alignment) * alignment;
  expect(buf.subarray(p, dataStart).every((b) => b === 0)).toBe(true);
  return { version, kv, kvTypes, tensors, dataStart, buf };
}

function nbytes(t: TensorInfo): number {
  const [block, size] = TRAITS[t.type]!;
  const n = t.dims.reduce((a, b) => a * b, 1);
  expect(t.dims[0]! % block).toBe(0);
  return (n / block) * size;
}

function f16(bits: number): number {
  const exp = (bits >>> 10) & 0x1f;
  const mant = bits & 0x3ff;
  const sign = bits & 0x8000 ? -1 : 1;
  if (exp === 0) return sign * mant * 2 ** -24;
  if (exp === 31) return Number.NaN;
  return sign * (1 + mant / 1024) * 2 ** (exp - 15);
}

/** Mean and standard deviation of a tensor's values, dequantized as ggml does. */
function stats(g: Gguf, t: TensorInfo): { mean: number; std: number; finite: boolean } {
  const start = g.dataStart + t.offset;
  const values: number[] = [];
  const n = t.dims.reduce((a, b) => a * b, 1);
  const buf = g.buf;
  if (t.type === 0) for (let i = 0; i < n; i++) values.push(buf.readFloatLE(start + 4 * i));
  if (t.type === 1) for (let i = 0; i < n; i++) values.push(f16(buf.readUInt16LE(start + 2 * i)));
  if (t.type === 8) {
    for (let b = 0; b < n / 32; b++) {
      const d = f16(buf.readUInt16LE(start + 34 * b));
      for (let j = 0; j < 32; j++) values.push(d * buf.readInt8(start + 34 * b + 2 + j));
    }
  }
  if (t.type === 2) {
    for (let b = 0; b < n / 32; b++) {
      const d = f16(buf.readUInt16LE(start + 18 * b));
      for (let j = 0; j < 16; j++) {
        const q = buf[start + 18 * b + 2 + j]!;
        values.push(d * ((q & 0x0f) - 8), d * ((q >> 4) - 8));
      }
    }
  }
  const mean = values.reduce((a, b) => a + b, 0) / values.length;
  const std = Math.sqrt(values.reduce((a, b) => a + (b - mean) ** 2, 0) / values.length);
  return { mean, std, finite: values.every(Number.isFinite) };
}

/** The tensors llama.cpp's LLM_ARCH_LLAMA loader requires, with their shapes, from the metadata. */
function expectedTensors(kv: Map<string, Kv>, quant: number): Map<string, { dims: number[]; type: number }> {
  const embd = kv.get('llama.embedding_length') as number;
  const layers = kv.get('llama.block_count') as number;
  const head = kv.get('llama.attention.head_count') as number;
  const headKv = kv.get('llama.attention.head_count_kv') as number;
  const ff = kv.get('llama.feed_forward_length') as number;
  const vocab = (kv.get('tokenizer.ggml.tokens') as string[]).length;
  const experts = (kv.get('llama.expert_count') as number | undefined) ?? 0;
  const kvDim = (embd / head) * headKv;
  const m = new Map<string, { dims: number[]; type: number }>();
  m.set('token_embd.weight', { dims: [embd, vocab], type: quant });
  m.set('output_norm.weight', { dims: [embd], type: 0 });
  m.set('output.weight', { dims: [embd, vocab], type: quant });
  for (let i = 0; i < layers; i++) {
    m.set(`blk.${i}.attn_norm.weight`, { dims: [embd], type: 0 });
    m.set(`blk.${i}.attn_q.weight`, { dims: [embd, embd], type: quant });
    m.set(`blk.${i}.attn_k.weight`, { dims: [embd, kvDim], type: quant });
    m.set(`blk.${i}.attn_v.weight`, { dims: [embd, kvDim], type: quant });
    m.set(`blk.${i}.attn_output.weight`, { dims: [embd, embd], type: quant });
    m.set(`blk.${i}.ffn_norm.weight`, { dims: [embd], type: 0 });
    if (experts === 0) {
      m.set(`blk.${i}.ffn_gate.weight`, { dims: [embd, ff], type: quant });
      m.set(`blk.${i}.ffn_up.weight`, { dims: [embd, ff], type: quant });
      m.set(`blk.${i}.ffn_down.weight`, { dims: [ff, embd], type: quant });
    } else {
      m.set(`blk.${i}.ffn_gate_inp.weight`, { dims: [embd, experts], type: 0 });
      m.set(`blk.${i}.ffn_gate_exps.weight`, { dims: [embd, ff, experts], type: quant });
      m.set(`blk.${i}.ffn_up_exps.weight`, { dims: [embd, ff, experts], type: quant });
      m.set(`blk.${i}.ffn_down_exps.weight`, { dims: [ff, embd, experts], type: quant });
    }
  }
  return m;
}

const sha256 = (path: string): string => createHash('sha256').update(readFileSync(path)).digest('hex');

let dir: string;
beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), 'hydra-synth-'));
});
afterAll(() => {
  rmSync(dir, { recursive: true, force: true });
});

const VARIANTS = [
  { arch: 'llama', quant: 'f32' },
  { arch: 'llama', quant: 'f16' },
  { arch: 'llama', quant: 'q8_0' },
  { arch: 'llama', quant: 'q4_0' },
  { arch: 'moe', quant: 'f16' },
  { arch: 'moe', quant: 'q8_0' },
  { arch: 'moe', quant: 'q4_0' },
] as const;

describe.each(VARIANTS)('tiny $arch $quant', ({ arch, quant }) => {
  let g: Gguf;
  let path: string;
  let result: Awaited<ReturnType<typeof writeSyntheticModel>>;
  const progress: SynthProgress[] = [];

  beforeAll(async () => {
    path = join(dir, `tiny-${arch}-${quant}.gguf`);
    result = await writeSyntheticModel({
      arch,
      shape: 'tiny',
      quant,
      seed: 1234,
      out: path,
      onProgress: (p) => progress.push(p),
    });
    g = readGguf(path);
  });

  it('has a GGUF v3 header with the llama hyperparameters llama.cpp reads', () => {
    expect(g.version).toBe(3);
    expect(g.kv.get('general.architecture')).toBe('llama');
    expect(g.kv.get('general.alignment')).toBe(32);
    expect(g.kv.get('general.file_type')).toBe({ f32: 0, f16: 1, q8_0: 7, q4_0: 2 }[quant]);
    // llama_model_loader checks value types strictly: u32 for counts, f32 for floats.
    for (const key of [
      'general.alignment',
      'general.file_type',
      'llama.context_length',
      'llama.embedding_length',
      'llama.block_count',
      'llama.feed_forward_length',
      'llama.attention.head_count',
      'llama.attention.head_count_kv',
      'llama.rope.dimension_count',
      'tokenizer.ggml.bos_token_id',
      'tokenizer.ggml.eos_token_id',
    ]) {
      expect(g.kvTypes.get(key), key).toBe(4);
    }
    expect(g.kvTypes.get('llama.attention.layer_norm_rms_epsilon')).toBe(6);
    expect(g.kvTypes.get('llama.rope.freq_base')).toBe(6);
    const embd = g.kv.get('llama.embedding_length') as number;
    const head = g.kv.get('llama.attention.head_count') as number;
    expect(g.kv.get('llama.rope.dimension_count')).toBe(embd / head);
    expect(embd / head).toBe(64);
    expect(head % (g.kv.get('llama.attention.head_count_kv') as number)).toBe(0);
    if (arch === 'moe') {
      expect(g.kv.get('llama.expert_count')).toBe(8);
      expect(g.kv.get('llama.expert_used_count')).toBe(2);
    } else {
      expect(g.kv.has('llama.expert_count')).toBe(false);
    }
    expect(result.hparams.nEmbd).toBe(embd);
  });

  it('has exactly the llama tensor layout, consecutive aligned offsets and ggml sizes', () => {
    const expected = expectedTensors(g.kv, TYPE_OF_QUANT[quant]!);
    expect(g.tensors.map((t) => t.name).sort()).toEqual([...expected.keys()].sort());
    let offset = 0;
    let params = 0;
    for (const t of g.tensors) {
      const want = expected.get(t.name)!;
      expect({ name: t.name, dims: t.dims, type: t.type }).toEqual({ name: t.name, ...want });
      expect(t.offset).toBe(offset);
      expect((g.dataStart + t.offset) % 32).toBe(0);
      offset += Math.ceil(nbytes(t) / 32) * 32;
      params += t.dims.reduce((a, b) => a * b, 1);
    }
    expect(statSync(path).size).toBe(g.dataStart + offset);
    expect(result.bytes).toBe(statSync(path).size);
    expect(result.nParams).toBe(params);
    expect(result.tensors).toBe(g.tensors.length);
    expect(progress.at(-1)?.bytesWritten).toBe(result.bytes);
    expect(planSyntheticModel({ arch, shape: 'tiny', quant })).toEqual({
      bytes: result.bytes,
      headerBytes: g.dataStart,
      nParams: params,
      tensors: g.tensors.length,
      hparams: result.hparams,
    });
    expect(g.kv.get('hydra.synth.seed')).toBe(1234);
  });

  it('holds finite weights of sd 1/sqrt(n_embd), norm gains about 1 and valid block scales', () => {
    const std = 1 / Math.sqrt(g.kv.get('llama.embedding_length') as number);
    expect(result.hparams.weightStd).toBeCloseTo(std, 12);
    const names = ['token_embd.weight', 'blk.0.attn_q.weight', 'blk.3.attn_norm.weight', 'output.weight'];
    names.push(arch === 'moe' ? 'blk.1.ffn_down_exps.weight' : 'blk.1.ffn_down.weight');
    for (const name of names) {
      const t = g.tensors.find((x) => x.name === name)!;
      const s = stats(g, t);
      expect(s.finite).toBe(true);
      if (name.includes('norm')) {
        expect(Math.abs(s.mean - 1)).toBeLessThan(0.01);
        expect(s.std).toBeLessThan(0.05);
      } else {
        expect(Math.abs(s.mean), name).toBeLessThan(0.05 * std);
        expect(s.std, name).toBeGreaterThan(0.9 * std);
        expect(s.std, name).toBeLessThan(1.1 * std);
      }
    }
  });
});

/**
 * The tensors llama.cpp's LLM_ARCH_QWEN35 / QWEN35MOE loaders (src/models/qwen35*.cpp) require,
 * from the metadata: block i is full attention when (i + 1) % full_attention_interval == 0.
 */
function expectedHybridTensors(
  kv: Map<string, Kv>,
  quant: number,
): Map<string, { dims: number[]; type: number }> {
  const a = kv.get('general.architecture') as string;
  const k = (key: string): number => kv.get(`${a}.${key}`) as number;
  const embd = k('embedding_length');
  const head = k('attention.head_count');
  const headKv = k('attention.head_count_kv');
  const headDim = k('attention.key_length');
  const interval = k('full_attention_interval');
  const dState = k('ssm.state_size');
  const keyDim = dState * k('ssm.group_count');
  const vHeads = k('ssm.time_step_rank');
  const valueDim = dState * vHeads;
  const vocab = (kv.get('tokenizer.ggml.tokens') as string[]).length;
  const experts = (kv.get(`${a}.expert_count`) as number | undefined) ?? 0;
  const m = new Map<string, { dims: number[]; type: number }>();
  const set = (name: string, dims: number[], type = quant): void => {
    m.set(name, { dims, type });
  };
  set('token_embd.weight', [embd, vocab]);
  set('output_norm.weight', [embd], 0);
  set('output.weight', [embd, vocab]);
  for (let i = 0; i < k('block_count'); i++) {
    const b = `blk.${i}`;
    set(`${b}.attn_norm.weight`, [embd], 0);
    set(`${b}.post_attention_norm.weight`, [embd], 0);
    if ((i + 1) % interval === 0) {
      set(`${b}.attn_q.weight`, [embd, headDim * head * 2]);
      set(`${b}.attn_k.weight`, [embd, headDim * headKv]);
      set(`${b}.attn_v.weight`, [embd, headDim * headKv]);
      set(`${b}.attn_output.weight`, [headDim * head, embd]);
      set(`${b}.attn_q_norm.weight`, [headDim], 0);
      set(`${b}.attn_k_norm.weight`, [headDim], 0);
    } else {
      set(`${b}.attn_qkv.weight`, [embd, keyDim * 2 + valueDim]);
      set(`${b}.attn_gate.weight`, [embd, valueDim]);
      set(`${b}.ssm_conv1d.weight`, [k('ssm.conv_kernel'), keyDim * 2 + valueDim], 0);
      set(`${b}.ssm_dt.bias`, [vHeads], 0);
      set(`${b}.ssm_a`, [vHeads], 0);
      set(`${b}.ssm_beta.weight`, [embd, vHeads], 0);
      set(`${b}.ssm_alpha.weight`, [embd, vHeads], 0);
      set(`${b}.ssm_norm.weight`, [dState], 0);
      set(`${b}.ssm_out.weight`, [valueDim, embd]);
    }
    if (experts === 0) {
      const ff = k('feed_forward_length');
      set(`${b}.ffn_gate.weight`, [embd, ff]);
      set(`${b}.ffn_up.weight`, [embd, ff]);
      set(`${b}.ffn_down.weight`, [ff, embd]);
    } else {
      const ff = k('expert_feed_forward_length');
      const sh = k('expert_shared_feed_forward_length');
      set(`${b}.ffn_gate_inp.weight`, [embd, experts], 0);
      set(`${b}.ffn_gate_exps.weight`, [embd, ff, experts]);
      set(`${b}.ffn_up_exps.weight`, [embd, ff, experts]);
      set(`${b}.ffn_down_exps.weight`, [ff, embd, experts]);
      set(`${b}.ffn_gate_inp_shexp.weight`, [embd], 0);
      set(`${b}.ffn_gate_shexp.weight`, [embd, sh]);
      set(`${b}.ffn_up_shexp.weight`, [embd, sh]);
      set(`${b}.ffn_down_shexp.weight`, [sh, embd]);
    }
  }
  return m;
}

const HYBRID_VARIANTS = [
  { arch: 'qwen35', quant: 'f32' },
  { arch: 'qwen35', quant: 'q4_0' },
  { arch: 'qwen35moe', quant: 'f16' },
  { arch: 'qwen35moe', quant: 'q8_0' },
] as const;

describe.each(HYBRID_VARIANTS)('tiny $arch $quant', ({ arch, quant }) => {
  let g: Gguf;
  let path: string;
  let result: Awaited<ReturnType<typeof writeSyntheticModel>>;

  beforeAll(async () => {
    path = join(dir, `tiny-${arch}-${quant}.gguf`);
    result = await writeSyntheticModel({ arch, shape: 'tiny', quant, seed: 99, out: path });
    g = readGguf(path);
  });

  it('has the hybrid hyperparameters the qwen35 loaders read, with their strict types', () => {
    expect(g.kv.get('general.architecture')).toBe(arch);
    const u32Keys = [
      'context_length',
      'embedding_length',
      'block_count',
      'feed_forward_length',
      'attention.head_count',
      'attention.head_count_kv',
      'attention.key_length',
      'attention.value_length',
      'rope.dimension_count',
      'full_attention_interval',
      'ssm.conv_kernel',
      'ssm.inner_size',
      'ssm.state_size',
      'ssm.time_step_rank',
      'ssm.group_count',
    ];
    if (arch === 'qwen35moe') {
      u32Keys.push(
        'expert_count',
        'expert_used_count',
        'expert_feed_forward_length',
        'expert_shared_feed_forward_length',
      );
    } else {
      expect(g.kv.has(`${arch}.expert_count`)).toBe(false);
    }
    for (const key of u32Keys) expect(g.kvTypes.get(`${arch}.${key}`), key).toBe(4);
    expect(g.kvTypes.get(`${arch}.attention.layer_norm_rms_epsilon`)).toBe(6);
    const k = (key: string): number => g.kv.get(`${arch}.${key}`) as number;
    // Two full-attention blocks (3, 7) and six recurrent ones.
    expect(k('block_count')).toBe(8);
    expect(k('full_attention_interval')).toBe(4);
    expect(k('attention.key_length')).toBe(64);
    // MRoPE sections count rotated pairs: they sum to n_rot / 2.
    const sections = g.kv.get(`${arch}.rope.dimension_sections`) as number[];
    expect(sections.length).toBe(4);
    expect(sections.reduce((x, y) => x + y, 0) * 2).toBe(k('rope.dimension_count'));
    expect(k('ssm.inner_size')).toBe(k('ssm.state_size') * k('ssm.time_step_rank'));
    expect(k('ssm.time_step_rank') % k('ssm.group_count')).toBe(0);
    expect(g.kv.has(`${arch}.nextn_predict_layers`)).toBe(false);
  });

  it('has exactly the qwen35 tensor layout, consecutive aligned offsets and ggml sizes', () => {
    const expected = expectedHybridTensors(g.kv, TYPE_OF_QUANT[quant]!);
    expect(g.tensors.map((t) => t.name).sort()).toEqual([...expected.keys()].sort());
    let offset = 0;
    for (const t of g.tensors) {
      expect({ name: t.name, dims: t.dims, type: t.type }).toEqual({
        name: t.name,
        ...expected.get(t.name)!,
      });
      expect(t.offset).toBe(offset);
      offset += Math.ceil(nbytes(t) / 32) * 32;
    }
    expect(statSync(path).size).toBe(g.dataStart + offset);
    expect(planSyntheticModel({ arch, shape: 'tiny', quant }).bytes).toBe(result.bytes);
  });

  it('keeps every delta-net decay negative and the other weights at their spread', () => {
    for (const t of g.tensors.filter((x) => x.name.endsWith('.ssm_a'))) {
      const s = stats(g, t);
      expect(s.mean, t.name).toBeLessThan(-0.95);
      expect(s.std, t.name).toBeLessThan(0.05);
    }
    const conv = stats(g, g.tensors.find((x) => x.name === 'blk.0.ssm_conv1d.weight')!);
    expect(conv.std).toBeGreaterThan(0.45);
    expect(conv.std).toBeLessThan(0.55);
    const std = result.hparams.weightStd;
    for (const name of ['blk.0.attn_qkv.weight', 'blk.3.attn_q.weight', 'blk.1.ssm_out.weight']) {
      const s = stats(g, g.tensors.find((x) => x.name === name)!);
      expect(s.finite).toBe(true);
      expect(s.std, name).toBeGreaterThan(0.9 * std);
      expect(s.std, name).toBeLessThan(1.1 * std);
    }
  });
});

describe('hybrid shapes', () => {
  it('plans the Qwen3.5 27B and 35B-A3B shapes without writing them', () => {
    const dense = planSyntheticModel({ arch: 'qwen35', shape: '27b', quant: 'q4_0' });
    expect(dense.hparams).toMatchObject({ nEmbd: 5120, nLayer: 64, nHead: 24, nHeadKv: 4 });
    expect(dense.hparams.hybrid).toMatchObject({ headDim: 256, fullAttentionInterval: 4 });
    expect(dense.nParams / 1e9).toBeGreaterThan(26);
    expect(dense.nParams / 1e9).toBeLessThan(28);
    const moe = planSyntheticModel({ arch: 'qwen35moe', shape: '35b-a3b', quant: 'q4_0' });
    expect(moe.hparams).toMatchObject({ nEmbd: 2048, nLayer: 40, nExpert: 256, nExpertUsed: 8 });
    expect(moe.nParams / 1e9).toBeGreaterThan(33);
    expect(moe.nParams / 1e9).toBeLessThan(37);
  });

  it.each([
    ['qwen35', '8b'],
    ['qwen35moe', '27b'],
    ['llama', '35b-a3b'],
    ['moe', '35b-a3b'],
  ] as const)('refuses %s with shape %s (HYDRA_ERR_BAD_ARGUMENT, key shape)', async (arch, shape) => {
    expect(() => planSyntheticModel({ arch, shape, quant: 'q4_0' })).toThrow(
      expect.objectContaining({ code: 'HYDRA_ERR_BAD_ARGUMENT', keys: ['shape'] }),
    );
    expect(() => parseSynthArgs(['--arch', arch, '--shape', shape, '--out', 'm'])).toThrow(
      expect.objectContaining({ code: 'HYDRA_ERR_BAD_ARGUMENT', keys: ['shape'] }),
    );
    await expect(
      writeSyntheticModel({ arch, shape, quant: 'q4_0', seed: 0, out: join(dir, 'never-hybrid.gguf') }),
    ).rejects.toMatchObject({ code: 'HYDRA_ERR_BAD_ARGUMENT', keys: ['shape'] });
  });
});

describe('vocabulary', () => {
  let g: Gguf;
  beforeAll(async () => {
    const out = join(dir, 'vocab.gguf');
    await writeSyntheticModel({ arch: 'llama', shape: 'tiny', quant: 'q4_0', seed: 1, out });
    g = readGguf(out);
  });

  it('is an SPM vocabulary with specials, 256 byte tokens and unique pieces', () => {
    expect(g.kv.get('tokenizer.ggml.model')).toBe('llama');
    const tokens = g.kv.get('tokenizer.ggml.tokens') as string[];
    const types = g.kv.get('tokenizer.ggml.token_type') as number[];
    const scores = g.kv.get('tokenizer.ggml.scores') as number[];
    expect(g.kv.get('llama.vocab_size')).toBe(tokens.length);
    expect(types).toHaveLength(tokens.length);
    expect(scores).toHaveLength(tokens.length);
    expect(new Set(tokens).size).toBe(tokens.length);
    expect(tokens.slice(0, 3)).toEqual(['<unk>', '<s>', '</s>']);
    expect(g.kv.get('tokenizer.ggml.bos_token_id')).toBe(1);
    expect(g.kv.get('tokenizer.ggml.eos_token_id')).toBe(2);
    for (let b = 0; b < 256; b++) {
      const id = tokens.indexOf(`<0x${b.toString(16).toUpperCase().padStart(2, '0')}>`);
      expect(id).toBeGreaterThan(2);
      expect(types[id]).toBe(6);
    }
    expect(types[tokens.indexOf('<|im_end|>')]).toBe(3);
    expect(scores.every(Number.isFinite)).toBe(true);
  });

  it('covers ordinary English with pieces whose prefixes are all tokens', () => {
    const tokens = new Set(g.kv.get('tokenizer.ggml.tokens') as string[]);
    for (const piece of ['\u2581', '\u2581the', '\u2581hello', '\u2581world', 'e', 'Z', '7', '.', ',', '?']) {
      expect(tokens.has(piece), piece).toBe(true);
    }
    for (const piece of tokens) {
      if (piece.startsWith('<')) continue;
      const chars = [...piece];
      for (let n = 1; n < chars.length; n++) expect(tokens.has(chars.slice(0, n).join('')), piece).toBe(true);
    }
  });

  it('carries a chatml template llama.cpp detects', () => {
    const tmpl = g.kv.get('tokenizer.chat_template') as string;
    expect(tmpl).toContain('<|im_start|>');
    expect(tmpl).toContain('<|im_end|>');
    expect(tmpl).not.toContain('<|im_sep|>');
  });
});

describe('determinism', () => {
  it('writes byte-identical files for the same arguments and different ones for another seed', async () => {
    const a = join(dir, 'det-a.gguf');
    const b = join(dir, 'det-b.gguf');
    const c = join(dir, 'det-c.gguf');
    await writeSyntheticModel({ arch: 'moe', shape: 'tiny', quant: 'q4_0', seed: 42, out: a });
    await writeSyntheticModel({ arch: 'moe', shape: 'tiny', quant: 'q4_0', seed: 42, out: b });
    await writeSyntheticModel({ arch: 'moe', shape: 'tiny', quant: 'q4_0', seed: 43, out: c });
    expect(sha256(a)).toBe(sha256(b));
    expect(sha256(a)).not.toBe(sha256(c));
    expect(statSync(a).size).toBe(statSync(c).size);
  });

  it('fim: false writes the same bytes as no fim option; fim: true changes only the vocabulary', async () => {
    const base = { arch: 'llama', shape: 'tiny', quant: 'q8_0', seed: 3 } as const;
    const [a, b, c] = ['fim-none', 'fim-false', 'fim-true'].map((n) => join(dir, `${n}.gguf`));
    await writeSyntheticModel({ ...base, out: a! });
    await writeSyntheticModel({ ...base, out: b!, fim: false });
    await writeSyntheticModel({ ...base, out: c!, fim: true });
    expect(sha256(b!)).toBe(sha256(a!));
    expect(sha256(c!)).not.toBe(sha256(a!));
    await expect(
      writeSyntheticModel({ ...base, out: c!, fim: 1 as unknown as boolean }),
    ).rejects.toMatchObject({
      keys: ['fim'],
    });
  });
});

describe('arguments', () => {
  const code = (fn: () => unknown): { code?: string; keys?: readonly string[] } => {
    try {
      fn();
    } catch (err) {
      return err as { code?: string; keys?: readonly string[] };
    }
    return {};
  };

  it('parses flags in both spellings with defaults', () => {
    expect(parseSynthArgs(['--out', 'm.gguf'])).toEqual({
      arch: 'llama',
      shape: 'tiny',
      quant: 'q8_0',
      seed: 0,
      out: 'm.gguf',
    });
    expect(
      parseSynthArgs(['--arch=moe', '--shape', '8b', '--quant=q4_0', '--seed', '4294967295', '--out=x.gguf']),
    ).toEqual({ arch: 'moe', shape: '8b', quant: 'q4_0', seed: 4294967295, out: 'x.gguf' });
  });

  it('round-trips every valid combination in any order', () => {
    fc.assert(
      fc.property(
        fc.constantFrom('llama', 'moe'),
        fc.constantFrom('tiny', '1b', '8b', '27b'),
        fc.constantFrom('f32', 'f16', 'q8_0', 'q4_0'),
        fc.integer({ min: 0, max: 0xffffffff }),
        fc.boolean(),
        fc.func(fc.integer()),
        (arch, shape, quant, seed, inline, order) => {
          const want = { arch, shape, quant, seed, out: '/tmp/m.gguf' };
          const pairs = Object.entries(want).map(([k, v]) => [k, String(v)] as const);
          pairs.sort((x, y) => order(x[0]) - order(y[0]));
          const argv = pairs.flatMap(([k, v]) => (inline ? [`--${k}=${v}`] : [`--${k}`, v]));
          expect(parseSynthArgs(argv)).toEqual(want);
        },
      ),
      { numRuns: 200 },
    );
  });

  it.each([
    [['--arch', 'gpt2', '--out', 'm'], 'arch'],
    [['--shape', '70b', '--out', 'm'], 'shape'],
    [['--quant', 'q5_k', '--out', 'm'], 'quant'],
    [['--seed', '-1', '--out', 'm'], 'seed'],
    [['--seed', '1.5', '--out', 'm'], 'seed'],
    [['--seed', '4294967296', '--out', 'm'], 'seed'],
    [['--seed', 'abc', '--out', 'm'], 'seed'],
    [['--arch', 'llama'], 'out'],
    [['--out'], 'out'],
    [['--out', '--arch', 'llama'], 'out'],
    [['--out='], 'out'],
    [['--out', 'a', '--out', 'b'], 'out'],
    [['--size', '1', '--out', 'm'], 'size'],
    [['model.gguf'], 'model.gguf'],
  ])('rejects %j with HYDRA_ERR_BAD_ARGUMENT naming %s', (argv, key) => {
    const err = code(() => parseSynthArgs(argv));
    expect(err.code).toBe('HYDRA_ERR_BAD_ARGUMENT');
    expect(err.keys).toEqual([key]);
  });

  it('rejects bad options and unwritable paths before writing anything', async () => {
    const base = {
      arch: 'llama',
      shape: 'tiny',
      quant: 'q8_0',
      seed: 0,
      out: join(dir, 'never.gguf'),
    } as const;
    const cases: Array<[Record<string, unknown>, string]> = [
      [{ seed: -1 }, 'seed'],
      [{ seed: 2 ** 32 }, 'seed'],
      [{ shape: 'huge' }, 'shape'],
      [{ quant: 'q6_k' }, 'quant'],
      [{ arch: 'mamba' }, 'arch'],
      [{ out: '' }, 'out'],
    ];
    for (const [patch, key] of cases) {
      const opts = { ...base, ...patch } as unknown as Parameters<typeof writeSyntheticModel>[0];
      await expect(writeSyntheticModel(opts)).rejects.toMatchObject({
        code: 'HYDRA_ERR_BAD_ARGUMENT',
        keys: [key],
      });
    }
    const file = join(dir, 'a-file');
    writeFileSync(file, 'x');
    await expect(writeSyntheticModel({ ...base, out: join(file, 'm.gguf') })).rejects.toMatchObject({
      code: 'HYDRA_ERR_BAD_ARGUMENT',
      keys: ['out'],
    });
    expect(() => statSync(base.out)).toThrow();
  });
});

describe('runSynthCli', () => {
  it('prints a JSON summary on stdout and usage for --help', async () => {
    let stdout = '';
    let stderr = '';
    const io = {
      stdout: {
        write: (s: string) => {
          stdout += s;
        },
      },
      stderr: {
        write: (s: string) => {
          stderr += s;
        },
      },
    };
    const out = join(dir, 'cli.gguf');
    const result = await runSynthCli(['--arch', 'moe', '--quant', 'q4_0', '--seed', '9', '--out', out], io);
    const summary = JSON.parse(stdout);
    expect(summary).toMatchObject({ path: out, arch: 'moe', shape: 'tiny', quant: 'q4_0', seed: 9 });
    expect(summary.bytes).toBe(statSync(out).size);
    expect(result?.bytes).toBe(summary.bytes);
    expect(stderr).toBe(''); // progress is only for files over 256 MiB
    stdout = '';
    expect(await runSynthCli(['--help'], io)).toBeNull();
    expect(stdout).toContain('--shape tiny|1b|8b|27b');
  });
});
