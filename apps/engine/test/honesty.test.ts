import { copyFileSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { open } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { HydraClient } from '@hydra-engine/hydra-rpc';
import {
  type ContextParams,
  initBackend,
  Model,
  type ModelLoadParams,
  type SamplerParams,
} from '@hydra-engine/native-ggml';
import { writeSyntheticModel } from '@hydra-engine/native-ggml/synth';
import { defaults, FIELDS, isRuntimeField, type Params, plan } from '@hydra-engine/tiering';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseServeArgs } from '../src/args.js';
import { contextParamsFrom, modelParamsFrom, samplerParamsFrom } from '../src/core/params.js';
import type { HydraError } from '../src/errors.js';
import { readGgufFile } from '../src/placement.js';
import { complete, freePort } from './control-helpers.js';
import { engineWith } from './helpers.js';

// Issue 20: every key of the common_params registry either takes an effect that llama.cpp (or the
// engine) shows, or is refused. The table below names, for each accepted key, the value to set and
// what must change; a registry key that is accepted without a row here fails the first test.

type Ctx = Awaited<ReturnType<Model['createContext']>>;
type Info = Ctx['info'];

type Check =
  /** The sampler chain llama.cpp runs: its stage names include `names`, and the tokens change. */
  | { kind: 'sampler'; value: unknown; base?: Params; names?: string[]; same?: true }
  /** The context llama.cpp built: `read` of its info equals `want`, or the prompt's logits change. */
  | { kind: 'context'; value: unknown; base?: Params; read?: (i: Info) => unknown; want?: unknown }
  /** The model llama.cpp loaded: `read` equals `want`, or the load fails as the value asks for. */
  | {
      kind: 'model';
      value: unknown;
      read?: (m: Model) => unknown;
      want?: unknown;
      fails?: string;
      /**
       * Load this file instead (NAN_MODEL: a copy with a NaN in one weight; Q4_MODEL: the tiny model
       * in q4_0, which the CPU backend repacks); without the key it must load, and `read` differ.
       */
      file?: 'NAN_MODEL' | 'Q4_MODEL';
    }
  /**
   * Reaches the native parameters llama.cpp is given (`field` equals `want`, and llama.cpp accepts
   * it) but has no getter and no effect on the tiny model on a CPU host; `why` says which.
   */
  | {
      kind: 'passed';
      value: unknown;
      field: keyof ContextParams | keyof ModelLoadParams;
      want: unknown;
      why: string;
    }
  /** An engine setting: checked end to end through CONFIGURE and the HTTP API below. */
  | { kind: 'engine'; value: unknown }
  /**
   * An engine setting whose effect another test file asserts (a feature with its own harness, such
   * as COMBINE failover): that file must exist and hold a test whose name contains `test`.
   */
  | { kind: 'covered'; file: string; test: string };

const warm = { 'sampling.temp': 1, seed: 1 };
const greedy = { 'sampling.temp': 0 };
const yarn = { rope_scaling_type: 'yarn', rope_freq_scale: 0.25 };
const miro = { ...warm, 'sampling.mirostat': 2 };
// A bias makes greedy repeat one token, which DRY then breaks up.
const repeat = { ...greedy, 'sampling.logit_bias': { '100': 8 } };
const dry = { ...repeat, 'sampling.dry_multiplier': 2 };
const adaptive = {
  ...warm,
  'sampling.temp': 0.5,
  'sampling.samplers': ['top_k', 'temperature', 'adaptive_p'],
  'sampling.adaptive_target': 0.2,
};

const TABLE: Record<string, Check> = {
  'sampling.min_keep': { kind: 'sampler', value: 50, base: { ...warm, 'sampling.top_p': 0 } },
  'sampling.top_k': { kind: 'sampler', value: 1, base: warm, names: ['top-k'] },
  'sampling.top_p': { kind: 'sampler', value: 0.05, base: warm, names: ['top-p'] },
  'sampling.min_p': { kind: 'sampler', value: 0.9, base: warm, names: ['min-p'] },
  'sampling.xtc_probability': {
    kind: 'sampler',
    value: 1,
    base: { ...warm, 'sampling.xtc_threshold': 0.001 },
    names: ['xtc'],
  },
  'sampling.xtc_threshold': {
    kind: 'sampler',
    value: 0.001,
    base: { ...warm, 'sampling.xtc_probability': 1 },
    names: ['xtc'],
  },
  'sampling.typ_p': { kind: 'sampler', value: 0.2, base: warm, names: ['typical'] },
  'sampling.temp': { kind: 'sampler', value: 0, base: warm, names: ['greedy'] },
  'sampling.dynatemp_range': { kind: 'sampler', value: 0.9, base: warm, names: ['temp-ext'] },
  'sampling.dynatemp_exponent': {
    kind: 'sampler',
    value: 4,
    base: { ...warm, 'sampling.dynatemp_range': 0.9 },
    names: ['temp-ext'],
  },
  'sampling.penalty_last_n': {
    kind: 'sampler',
    value: 0,
    base: { ...greedy, 'sampling.penalty_repeat': 2 },
  },
  'sampling.penalty_repeat': { kind: 'sampler', value: 2, base: greedy, names: ['penalties'] },
  'sampling.penalty_freq': { kind: 'sampler', value: 2, base: greedy, names: ['penalties'] },
  'sampling.penalty_present': { kind: 'sampler', value: 2, base: greedy, names: ['penalties'] },
  'sampling.dry_multiplier': { kind: 'sampler', value: 2, base: repeat, names: ['dry'] },
  'sampling.dry_base': { kind: 'sampler', value: 4, base: dry, names: ['dry'] },
  'sampling.dry_allowed_length': { kind: 'sampler', value: 1, base: dry, names: ['dry'] },
  'sampling.dry_penalty_last_n': { kind: 'sampler', value: 0, base: dry },
  // Breakers cut the repeat DRY looks for: with every generated piece a breaker, DRY has no effect.
  'sampling.dry_sequence_breakers': { kind: 'sampler', value: 'GENERATED_PIECES', base: dry, names: ['dry'] },
  'sampling.adaptive_target': { kind: 'sampler', value: 0.5, base: adaptive, names: ['adaptive-p'] },
  'sampling.adaptive_decay': { kind: 'sampler', value: 0, base: adaptive, names: ['adaptive-p'] },
  'sampling.mirostat': { kind: 'sampler', value: 2, base: warm, names: ['mirostat-v2'] },
  'sampling.mirostat_tau': { kind: 'sampler', value: 0.5, base: miro, names: ['mirostat-v2'] },
  'sampling.mirostat_eta': { kind: 'sampler', value: 1, base: { ...miro, 'sampling.mirostat_tau': 2 } },
  'sampling.top_n_sigma': { kind: 'sampler', value: 0.5, base: warm, names: ['top-n-sigma'] },
  'sampling.samplers': {
    kind: 'sampler',
    value: ['top_k', 'temperature'],
    base: { ...warm, 'sampling.temp': 0.7 },
  },
  'sampling.grammar': { kind: 'sampler', value: 'root ::= [a-c]+', base: greedy, names: ['grammar'] },
  'sampling.logit_bias': { kind: 'sampler', value: { '100': 100 }, base: greedy, names: ['logit-bias'] },
  seed: { kind: 'sampler', value: 2, base: warm },
  'sampling.ignore_eos': { kind: 'engine', value: true },
  n_predict: { kind: 'engine', value: 3 },
  'sampling.n_probs': {
    kind: 'covered',
    file: './logprobs.test.ts',
    test: 'CONFIGURE sampling.n_probs is the default of requests that do not say',
  },
  state_chunk_size: { kind: 'engine', value: 65536 },
  failover_policy: {
    kind: 'covered',
    file: './combine-loss.test.ts',
    test: 'none: PEER_LOST, nothing reloaded',
  },
  peer_rejoin: { kind: 'covered', file: './combine-loss.test.ts', test: '--no-peer-rejoin stays degraded' },
  device_memory_cap: {
    kind: 'covered',
    file: './combine-loss.test.ts',
    test: 'offload (auto, a memory cap makes SOLO not fit)',
  },
  embedding: {
    kind: 'covered',
    file: './embeddings.test.ts',
    test: 'answers the embedding routes 501 until CONFIGURE embedding turns them on',
  },
  embd_normalize: {
    kind: 'covered',
    file: './embeddings.test.ts',
    test: 'embd_normalize: CONFIGURE sets the normalization of requests that name none',
  },
  pooling_type: {
    kind: 'covered',
    file: './embeddings.test.ts',
    test: 'pooling_type: CONFIGURE rebuilds the context with the new pooling',
  },
  n_ctx_checkpoints: {
    kind: 'covered',
    file: './checkpoints.test.ts',
    test: 'makes none with n_ctx_checkpoints 0',
  },
  checkpoint_min_step: {
    kind: 'covered',
    file: './checkpoints.test.ts',
    test: 'takes one every checkpoint_min_step tokens of a chunked prompt',
  },
  'speculative.types': {
    kind: 'covered',
    file: './speculative.test.ts',
    test: 'gives the greedy text of the plain engine and accepts guesses',
  },
  'speculative.model': {
    kind: 'covered',
    file: './speculative-draft.test.ts',
    test: 'gives the greedy text of the plain engine and accepts draft guesses',
  },
  'speculative.n_max': {
    kind: 'covered',
    file: './speculative-draft.test.ts',
    test: 'n_max, n_min and p_min shape the drafts',
  },
  'speculative.n_min': {
    kind: 'covered',
    file: './speculative-draft.test.ts',
    test: 'n_max, n_min and p_min shape the drafts',
  },
  'speculative.p_min': {
    kind: 'covered',
    file: './speculative-draft.test.ts',
    test: 'n_max, n_min and p_min shape the drafts',
  },
  'speculative.n_gpu_layers': {
    kind: 'covered',
    file: './speculative-draft.test.ts',
    test: 'the draft loads with its own devices and layers',
  },
  'speculative.devices': {
    kind: 'covered',
    file: './speculative-draft.test.ts',
    test: 'the draft loads with its own devices and layers',
  },
  'speculative.ngram_size_n': {
    kind: 'covered',
    file: './speculative-unit.test.ts',
    test: 'reads speculative.types and the n-gram sizes',
  },
  'speculative.ngram_size_m': {
    kind: 'covered',
    file: './speculative-unit.test.ts',
    test: 'reads speculative.types and the n-gram sizes',
  },
  'speculative.ngram_map_k.size_n': {
    kind: 'covered',
    file: './speculative-ngram.test.ts',
    test: "the plain engine's greedy text, guesses accepted on repeating text",
  },
  'speculative.ngram_map_k.size_m': {
    kind: 'covered',
    file: './speculative-ngram.test.ts',
    test: "the plain engine's greedy text, guesses accepted on repeating text",
  },
  'speculative.ngram_map_k.min_hits': {
    kind: 'covered',
    file: './speculative-ngram.test.ts',
    test: "the plain engine's greedy text, guesses accepted on repeating text",
  },
  'speculative.ngram_map_k4v.size_n': {
    kind: 'covered',
    file: './speculative-ngram.test.ts',
    test: "the plain engine's greedy text, guesses accepted on repeating text",
  },
  'speculative.ngram_map_k4v.size_m': {
    kind: 'covered',
    file: './speculative-ngram.test.ts',
    test: "the plain engine's greedy text, guesses accepted on repeating text",
  },
  'speculative.ngram_map_k4v.min_hits': {
    kind: 'covered',
    file: './speculative-ngram.test.ts',
    test: "the plain engine's greedy text, guesses accepted on repeating text",
  },
  'speculative.ngram_mod.n_match': {
    kind: 'covered',
    file: './speculative-ngram.test.ts',
    test: "the plain engine's greedy text, guesses accepted on repeating text",
  },
  'speculative.ngram_mod.n_max': {
    kind: 'covered',
    file: './speculative-ngram.test.ts',
    test: "the plain engine's greedy text, guesses accepted on repeating text",
  },
  'speculative.ngram_mod.n_min': {
    kind: 'covered',
    file: './speculative-ngram.test.ts',
    test: "the plain engine's greedy text, guesses accepted on repeating text",
  },

  n_ctx: { kind: 'context', value: 1024, read: (i) => i.nCtx, want: 1024 },
  n_batch: { kind: 'context', value: 64, read: (i) => i.nBatch, want: 64 },
  n_ubatch: { kind: 'context', value: 32, read: (i) => i.nUbatch, want: 32 },
  n_parallel: { kind: 'context', value: 3, read: (i) => i.nSeqMax, want: 3 },
  'cpuparams.n_threads': { kind: 'context', value: 2, read: (i) => i.nThreads, want: 2 },
  'cpuparams_batch.n_threads': { kind: 'context', value: 3, read: (i) => i.nThreadsBatch, want: 3 },
  ctx_shift: {
    kind: 'covered',
    file: './context-shift.test.ts',
    test: 'ctx_shift: a generation goes on past the slot context',
  },
  n_keep: {
    kind: 'covered',
    file: './context-shift.test.ts',
    test: 'n_keep: the tokens kept on a shift change what follows',
  },
  // A decoder read without its causal mask: every prompt position sees the later ones too.
  attention_type: { kind: 'context', value: 'non_causal' },
  'cpuparams.cpumask': {
    kind: 'covered',
    file: './cpu-placement.test.ts',
    test: 'cpumask pins the compute threads',
  },
  'cpuparams.strict_cpu': {
    kind: 'covered',
    file: './cpu-placement.test.ts',
    test: 'strict_cpu gives each compute thread one CPU of the mask',
  },
  'cpuparams_batch.cpumask': {
    kind: 'covered',
    file: './cpu-placement.test.ts',
    test: 'the batch group takes its own mask for prompts',
  },
  'cpuparams_batch.strict_cpu': {
    kind: 'covered',
    file: './cpu-placement.test.ts',
    test: 'the batch group takes its own mask for prompts',
  },
  kv_unified: {
    kind: 'context',
    value: true,
    base: { n_parallel: 2, n_ctx: 1024 },
    read: (i) => i.nCtxSeq,
    want: 1024,
  },
  rope_freq_base: { kind: 'context', value: 50 },
  rope_freq_scale: { kind: 'context', value: 0.25 },
  rope_scaling_type: { kind: 'context', value: 'yarn', base: { rope_freq_scale: 0.25 } },
  yarn_ext_factor: { kind: 'context', value: 0.25, base: yarn },
  // The pinned llama.cpp recomputes the attention factor whenever ext_factor is not 0.
  yarn_attn_factor: { kind: 'context', value: 3, base: { ...yarn, yarn_ext_factor: 0 } },
  yarn_beta_fast: { kind: 'context', value: 2, base: yarn },
  yarn_beta_slow: { kind: 'context', value: 8, base: yarn },
  yarn_orig_ctx: { kind: 'context', value: 64, base: yarn },
  flash_attn: { kind: 'context', value: 'on', base: { flash_attn: 'off' } },
  cache_type_k: { kind: 'context', value: 'q4_0' },
  cache_type_v: { kind: 'context', value: 'q4_0', base: { flash_attn: 'on' } },
  swa_full: {
    kind: 'passed',
    value: true,
    field: 'swaFull',
    want: true,
    why: 'the tiny model has no sliding-window layers',
  },
  no_kv_offload: {
    kind: 'passed',
    value: true,
    field: 'offloadKqv',
    want: false,
    why: 'the KV cache is on the host anyway on a CPU-only machine',
  },
  no_op_offload: {
    kind: 'passed',
    value: true,
    field: 'opOffload',
    want: false,
    why: 'there is no device to offload ops to on a CPU-only machine',
  },

  model: { kind: 'model', value: 'OTHER_MODEL', read: (m) => m.path, want: 'OTHER_MODEL' },
  kv_overrides: {
    kind: 'model',
    value: ['llama.context_length=int:2048'],
    read: (m) => m.info.nCtxTrain,
    want: 2048,
  },
  devices: { kind: 'model', value: ['NO_SUCH_DEVICE'], fails: 'HYDRA_ERR_NO_DEVICE' },
  n_gpu_layers: { kind: 'passed', value: 0, field: 'nGpuLayers', want: 0, why: 'no GPU to hold layers' },
  main_gpu: { kind: 'passed', value: 0, field: 'mainGpu', want: 0, why: 'no GPU to pick' },
  tensor_split: { kind: 'passed', value: [1], field: 'tensorSplit', want: [1], why: 'one device' },
  split_mode: { kind: 'passed', value: 'none', field: 'splitMode', want: 'none', why: 'one device' },
  // Mapped weights sit in llama.cpp's CPU_Mapped buffer; read ones in a plain CPU buffer.
  use_mmap: { kind: 'model', value: false, read: weightBuffers, want: ['CPU'] },
  use_mlock: { kind: 'passed', value: true, field: 'useMlock', want: true, why: 'no getter; same weights' },
  // Direct I/O reads the file (unbuffered where the filesystem allows O_DIRECT), so even with
  // use_mmap on the weights land in a plain CPU buffer instead of the mapping.
  use_direct_io: { kind: 'model', value: true, read: weightBuffers, want: ['CPU'] },
  // Repackable q4_0 weights go to CPU_REPACK unless extra buffer types are off.
  no_extra_bufts: { kind: 'model', value: true, read: weightBuffers, want: ['CPU_Mapped'], file: 'Q4_MODEL' },
  no_host: {
    kind: 'passed',
    value: true,
    field: 'noHost',
    want: true,
    why: 'a host buffer type exists only beside a GPU device',
  },
  // A NaN written into a weight: llama.cpp's tensor validation refuses the file, a plain load takes it.
  check_tensors: { kind: 'model', value: true, fails: 'HYDRA_ERR_LOAD_FAILED', file: 'NAN_MODEL' },
  override_tensors: {
    kind: 'passed',
    value: ['token_embd=CPU'],
    field: 'overrides',
    want: ['token_embd=CPU'],
    why: 'every buffer is a CPU one on a CPU-only machine',
  },
  n_cpu_moe: {
    kind: 'passed',
    value: 1,
    field: 'overrides',
    want: ['blk\\.0\\.ffn_(up|down|gate|gate_up)_(ch|)exps=CPU'], // llama.cpp's llm_ffn_exps_block_regex(0)
    why: 'experts stay on the host anyway on a CPU-only machine (and the tiny model is dense)',
  },
  // Honoured by the COMBINE path; combine.test.ts and combine-loss.test.ts serve it from real peers.
  rpc_servers: {
    kind: 'passed',
    value: [],
    field: 'path',
    want: 'MODEL',
    why: 'needs a ggml-RPC peer: see combine.test.ts',
  },
};

/** The buffer types llama.cpp put the model's weights in. */
async function weightBuffers(m: Model): Promise<string[]> {
  const ctx = await m.createContext({ nCtx: 256 });
  try {
    return ctx
      .memory()
      .filter((b) => b.model > 0)
      .map((b) => b.bufferType);
  } finally {
    await ctx.dispose();
  }
}

const dir = mkdtempSync(join(tmpdir(), 'hydra-honesty-'));
let path: string;
let other: string;
let nanModel: string;
let q4Model: string;
let model: Model;

beforeAll(async () => {
  initBackend();
  path = join(dir, 'tiny.gguf');
  other = join(dir, 'other.gguf');
  await writeSyntheticModel({ arch: 'llama', shape: 'tiny', quant: 'f32', seed: 7, out: path });
  await writeSyntheticModel({ arch: 'llama', shape: 'tiny', quant: 'f32', seed: 8, out: other });
  q4Model = join(dir, 'q4.gguf');
  await writeSyntheticModel({ arch: 'llama', shape: 'tiny', quant: 'q4_0', seed: 7, out: q4Model });
  model = await Model.load({ path, nGpuLayers: 0 });
  // The same model with one f32 weight set to NaN (its data offset read from the GGUF header).
  nanModel = join(dir, 'nan.gguf');
  copyFileSync(path, nanModel);
  const gguf = await readGgufFile(nanModel);
  const norm = gguf.tensors.find((t) => t.name === 'blk.0.attn_norm.weight')!;
  const fh = await open(nanModel, 'r+');
  await fh.write(Buffer.from(new Float32Array([Number.NaN]).buffer), 0, 4, gguf.dataOffset + norm.offset);
  await fh.close();
}, 60_000);
afterAll(() => model?.dispose());

const config = (key: string, value: unknown, base: Params = {}): Params => {
  const delta = value === undefined ? base : { ...base, [key]: value };
  return plan(defaults(), delta).next;
};

async function generate(ctx: Ctx, sampler: SamplerParams, n = 16): Promise<number[]> {
  const s = model.createSampler(sampler);
  try {
    const prompt = Array.from(model.tokenize('Once upon a time there was', { addSpecial: true }));
    ctx.removeSequence(0, 0, -1);
    let r = await ctx.decode([{ seq: 0, pos: 0, tokens: prompt, sampler: s }]);
    const out = [r.tokens[0]!];
    while (out.length < n) {
      r = await ctx.decode([
        { seq: 0, pos: prompt.length + out.length - 1, tokens: [out.at(-1)!], sampler: s },
      ]);
      out.push(r.tokens[0]!);
    }
    return out;
  } finally {
    s.dispose();
  }
}

async function promptLogits(ctx: Ctx): Promise<Float32Array> {
  const prompt = Array.from(
    model.tokenize('Once upon a time there was a small dragon who', { addSpecial: true }),
  );
  const s = model.createSampler({ temp: 0 });
  try {
    ctx.removeSequence(0, 0, -1);
    const r = await ctx.decode([{ seq: 0, pos: 0, tokens: prompt, sampler: s, logits: true }]);
    return r.logits[0]!;
  } finally {
    s.dispose();
  }
}

const maxDiff = (a: Float32Array, b: Float32Array) =>
  a.reduce((m, v, i) => Math.max(m, Math.abs(v - b[i]!)), 0);

describe('every registry key takes effect or is refused', () => {
  it('has a row for exactly the keys CONFIGURE accepts', () => {
    const accepted = FIELDS.filter(isRuntimeField).map((f) => f.key);
    expect(accepted.filter((k) => !(k in TABLE))).toEqual([]);
    expect(Object.keys(TABLE).filter((k) => !accepted.includes(k))).toEqual([]);
  });

  it.each(
    FIELDS.filter((f) => f.tier !== 'T4' && !isRuntimeField(f)).map((f) => [f.key]),
  )('%s is refused with HYDRA_ERR_UNSUPPORTED_FIELD', (key) => {
    expect(() => plan(defaults(), { [key]: FIELDS.find((f) => f.key === key)!.default })).toThrow(
      expect.objectContaining({ code: 'HYDRA_ERR_UNSUPPORTED_FIELD', keys: [key] }),
    );
  });

  it('keeps the default chains what they were: greedy alone at temp 0 (the backend fast path)', () => {
    const names = (cfg: Params) => {
      const s = model.createSampler(samplerParamsFrom(cfg));
      const out = s.names();
      s.dispose();
      return out;
    };
    expect(names(config('sampling.temp', 0))).toEqual(['greedy']);
    expect(names(defaults())).toEqual(['top-k', 'top-p', 'min-p', 'temp', 'dist']);
  });

  const rows = (kind: Check['kind']) =>
    Object.entries(TABLE)
      .filter(([, c]) => c.kind === kind)
      .map(([k, c]) => [k, c] as [string, Check]);

  describe('sampler keys', () => {
    let ctx: Ctx;
    beforeAll(async () => {
      ctx = await model.createContext({ nCtx: 256, nThreads: 1 });
    });
    afterAll(() => ctx?.dispose());

    it.each(rows('sampler'))('%s: llama.cpp runs it and the tokens change', async (key, check) => {
      const c = check as Extract<Check, { kind: 'sampler' }>;
      const before = samplerParamsFrom(config(key, undefined, c.base));
      const baseline = await generate(ctx, before);
      let value = c.value;
      if (value === 'GENERATED_PIECES')
        value = [...new Set(baseline)].map((t) => model.detokenize(Int32Array.of(t)));
      const after = samplerParamsFrom(config(key, value, c.base));
      if (c.names) {
        const s = model.createSampler(after);
        expect(s.names()).toEqual(expect.arrayContaining(c.names));
        s.dispose();
      }
      const tokens = await generate(ctx, after);
      expect(tokens).not.toEqual(baseline);
      if (key === 'sampling.logit_bias') expect(new Set(tokens)).toEqual(new Set([100]));
      if (key === 'sampling.grammar') expect(model.detokenize(Int32Array.from(tokens))).toMatch(/^[a-c]+$/);
      if (key === 'sampling.samplers') {
        const s = model.createSampler(after);
        expect(s.names()).toEqual(['top-k', 'temp', 'dist']);
        s.dispose();
      }
    });
  });

  describe('context keys', () => {
    it.each(rows('context'))('%s: llama.cpp builds the context it asks for', async (key, check) => {
      const c = check as Extract<Check, { kind: 'context' }>;
      const params = contextParamsFrom(config(key, c.value, { n_ctx: 256, ...c.base }));
      const ctx = await model.createContext({ ...params });
      try {
        if (c.read) {
          expect(c.read(ctx.info)).toEqual(c.want);
          return;
        }
        const baseCtx = await model.createContext(
          contextParamsFrom(config(key, undefined, { n_ctx: 256, ...c.base })),
        );
        try {
          expect(maxDiff(await promptLogits(ctx), await promptLogits(baseCtx))).toBeGreaterThan(1e-4);
        } finally {
          await baseCtx.dispose();
        }
      } finally {
        await ctx.dispose();
      }
    });
  });

  describe('model keys', () => {
    it.each(rows('model'))('%s: llama.cpp loads the model it asks for', async (key, check) => {
      const c = check as Extract<Check, { kind: 'model' }>;
      const value = c.value === 'OTHER_MODEL' ? other : c.value;
      const cfg = config(key, value);
      const file = c.file === 'NAN_MODEL' ? nanModel : c.file === 'Q4_MODEL' ? q4Model : path;
      const params = modelParamsFrom(cfg, key === 'model' ? (cfg.model as string) : file);
      if (c.file) {
        const plain = await Model.load({ ...modelParamsFrom(config(key, undefined), file), nGpuLayers: 0 });
        try {
          if (c.read) expect(await c.read(plain)).not.toEqual(c.want);
        } finally {
          plain.dispose();
        }
      }
      if (c.fails) {
        await expect(Model.load({ ...params, nGpuLayers: 0 })).rejects.toMatchObject({ code: c.fails });
        return;
      }
      const m = await Model.load({ ...params, nGpuLayers: 0 });
      try {
        expect(await c.read!(m)).toEqual(c.want === 'OTHER_MODEL' ? other : c.want);
      } finally {
        m.dispose();
      }
    });
  });

  it('names, for each key whose effect another test asserts, a test that exists', () => {
    for (const [key, check] of rows('covered')) {
      const c = check as Extract<Check, { kind: 'covered' }>;
      const text = readFileSync(new URL(c.file, import.meta.url), 'utf8');
      expect([key, text.includes(c.test)]).toEqual([key, true]);
    }
  });

  describe('keys with no effect visible on a CPU host', () => {
    it.each(rows('passed'))('%s reaches llama.cpp and is accepted there', async (key, check) => {
      const c = check as Extract<Check, { kind: 'passed' }>;
      const cfg = config(key, c.value);
      const cp = contextParamsFrom(cfg) as unknown as Record<string, unknown>;
      const mp = modelParamsFrom(cfg, path) as unknown as Record<string, unknown>;
      const want = c.want === 'MODEL' ? path : c.want;
      if (c.field in cp && FIELDS.find((f) => f.key === key)!.via === 'context') {
        expect(cp[c.field]).toEqual(want);
        const ctx = await model.createContext({ ...cp, nCtx: 256 });
        await ctx.dispose();
      } else {
        expect(mp[c.field]).toEqual(want);
        const m = await Model.load({ ...(mp as unknown as ModelLoadParams), nGpuLayers: 0 });
        m.dispose();
      }
    });
  });
});

describe('engine keys, through CONFIGURE and the HTTP API', () => {
  let eng: Awaited<ReturnType<typeof engineWith>>;
  let client: HydraClient;
  beforeAll(async () => {
    const port = await freePort();
    eng = await engineWith(['-m', path, '-c', '1024', '--rpc-port', String(port)]);
    client = await HydraClient.connect({ port, encoding: 'json' });
  }, 60_000);
  afterAll(async () => {
    client?.close();
    await eng?.close();
  });

  it('sampling.logit_bias set by CONFIGURE changes a greedy completion', async () => {
    const body = { prompt: 'Once upon a time', max_tokens: 6, temperature: 0, return_tokens: true };
    const before = (await complete(eng.url, body)).json.choices[0].tokens as number[];
    const r = (await client.configure({ 'sampling.logit_bias': { '100': 100 } })) as unknown as Record<
      string,
      unknown
    >;
    expect(r.params_applied).toEqual({ 'sampling.logit_bias': { '100': 100 } });
    const after = (await complete(eng.url, body)).json.choices[0].tokens as number[];
    expect(before).not.toEqual(after);
    expect(after).toEqual([100, 100, 100, 100, 100, 100]);
    await client.configure({ 'sampling.logit_bias': {} });
  });

  it('n_predict caps a completion that names no max_tokens', async () => {
    await client.configure({ n_predict: (TABLE.n_predict as { value: number }).value });
    const r = await complete(eng.url, { prompt: 'Once upon a time', temperature: 0, ignore_eos: true });
    expect(r.json.usage.completion_tokens).toBe(3);
    await client.configure({ n_predict: -1 });
  });

  it('sampling.ignore_eos keeps generating past an end-of-generation token', async () => {
    const eos = model.info.eos;
    await client.configure({ 'sampling.logit_bias': { [String(eos)]: 100 } });
    const body = { prompt: 'Once upon a time', max_tokens: 4, temperature: 0 };
    expect((await complete(eng.url, body)).json.usage.completion_tokens).toBeLessThan(2);
    await client.configure({ 'sampling.ignore_eos': true });
    expect((await complete(eng.url, body)).json.usage.completion_tokens).toBe(4);
    await client.configure({ 'sampling.ignore_eos': false, 'sampling.logit_bias': {} });
  });

  it('state_chunk_size sizes a STATE_GET that names no chunk_size', async () => {
    await client.configure({ state_chunk_size: (TABLE.state_chunk_size as { value: number }).value });
    const prompt = Array.from(eng.engine.tokenize('Once upon a time there was a dragon. '.repeat(8)));
    await complete(eng.url, { prompt, max_tokens: 2, temperature: 0, slot_id: 0, cache_prompt: true });
    const r = await client.stateGet({ slot: 0 });
    expect(r.total).toBeGreaterThan(65536);
    expect(r.data.length).toBe(65536);
  });

  it('refused keys change nothing: mmproj reloads nothing, the reply names the key', async () => {
    const loaded = eng.engine.model;
    const epoch = eng.engine.epoch;
    await expect(client.configure({ mmproj: other, 'sampling.temp': 0.3 })).rejects.toMatchObject({
      code: 'HYDRA_ERR_UNSUPPORTED_FIELD',
      keys: ['mmproj'],
    });
    expect(eng.engine.layers.get('sampling.temp')).toBe(0.8);
    expect(eng.engine.model).toBe(loaded);
    expect(eng.engine.modelPath).toBe(path);
    expect(eng.engine.epoch).toBe(epoch);
  });
});

describe('per-request fields and refusals at every door', () => {
  let eng: Awaited<ReturnType<typeof engineWith>>;
  let client: HydraClient;
  beforeAll(async () => {
    const port = await freePort();
    eng = await engineWith(['-m', path, '-c', '1024', '--rpc-port', String(port)]);
    client = await HydraClient.connect({ port, encoding: 'json' });
  }, 60_000);
  afterAll(async () => {
    client?.close();
    await eng?.close();
  });

  const ask = (body: Record<string, unknown>) =>
    complete(eng.url, { prompt: 'Once upon a time', max_tokens: 8, temperature: 0, ...body });

  it('grammar, logit_bias and samplers per request take effect', async () => {
    const g = await ask({ grammar: 'root ::= [a-c]+' });
    expect(g.status).toBe(200);
    expect(g.json.choices[0].text).toMatch(/^[a-c]+$/);
    const b = await ask({ logit_bias: [[100, 100]], return_tokens: true });
    expect(b.json.choices[0].tokens).toEqual(new Array(8).fill(100));
    const plain = await ask({ temperature: 0.7, seed: 3, return_tokens: true });
    const reordered = await ask({ temperature: 0.7, seed: 3, samplers: 'kt', return_tokens: true });
    expect(reordered.json.choices[0].tokens).not.toEqual(plain.json.choices[0].tokens);
  });

  it('json_schema and response_format constrain the completion to the schema', async () => {
    const schema = { type: 'object', properties: { a: { type: 'integer' } }, required: ['a'] };
    for (const body of [
      { json_schema: schema },
      { response_format: { type: 'json_schema', json_schema: { name: 'x', schema } } },
    ]) {
      const r = await ask({ ...body, max_tokens: 64 });
      expect(r.status).toBe(200);
      expect(r.json.choices[0].finish_reason).toBe('stop');
      expect(Object.keys(JSON.parse(r.json.choices[0].text))).toEqual(['a']);
    }
    const any = await ask({ response_format: { type: 'json_object' }, max_tokens: 64 });
    expect(any.status).toBe(200);
    const text: string = any.json.choices[0].text;
    // Any JSON value (llama-server's json_object): complete when the grammar ended the completion.
    if (any.json.choices[0].finish_reason === 'stop') expect(() => JSON.parse(text)).not.toThrow();
    expect(text).not.toEqual((await ask({ max_tokens: 64 })).json.choices[0].text);
  });

  it.each([
    [{ grammar: 'root ::= (' }, 'HYDRA_ERR_BAD_VALUE', ['grammar']],
    [{ logit_bias: [[5000, 1]] }, 'HYDRA_ERR_BAD_VALUE', ['logit_bias']],
    [{ mirostat: 7 }, 'HYDRA_ERR_BAD_VALUE', ['mirostat']],
    [{ n: 99 }, 'HYDRA_ERR_BAD_VALUE', ['n']],
    [{ best_of: 2 }, 'HYDRA_ERR_UNSUPPORTED_FIELD', ['best_of']],
    [{ echo: 'yes' }, 'HYDRA_ERR_BAD_REQUEST', ['echo']],
    [{ suffix: 3 }, 'HYDRA_ERR_BAD_REQUEST', ['suffix']],
    // Completions take logprobs as a count (0..20, OpenAI's bound on top_logprobs).
    [{ logprobs: true }, 'HYDRA_ERR_BAD_VALUE', ['logprobs']],
    [{ logprobs: 21 }, 'HYDRA_ERR_BAD_VALUE', ['logprobs']],
    [{ n_probs: -2 }, 'HYDRA_ERR_BAD_VALUE', ['n_probs']],
    [{ json_schema: { type: 'frob' } }, 'HYDRA_ERR_BAD_VALUE', ['json_schema']],
    [
      { response_format: { type: 'json_schema', json_schema: {} } },
      'HYDRA_ERR_BAD_VALUE',
      ['response_format'],
    ],
    [{ json_schema: { type: 'object' }, grammar: 'root ::= "a"' }, 'HYDRA_ERR_BAD_VALUE', ['json_schema']],
    [{ tools: [{ type: 'function', function: { name: 'f' } }] }, 'HYDRA_ERR_UNSUPPORTED_FIELD', ['tools']],
  ] as const)('%j is a 400 %s naming the field', async (body, code, keys) => {
    const r = await ask(body);
    expect([r.status, r.json.error.code, r.json.error.keys]).toEqual([400, code, keys]);
  });

  it('CONFIGURE and PLAN refuse a grammar llama.cpp cannot parse, and apply nothing', async () => {
    const epoch = eng.engine.epoch;
    await expect(
      client.configure({ 'sampling.grammar': 'root ::= (', 'sampling.temp': 0.2 }),
    ).rejects.toMatchObject({ code: 'HYDRA_ERR_BAD_VALUE', keys: ['sampling.grammar'] });
    await expect(client.plan({ 'sampling.grammar': 'root ::= (' })).rejects.toMatchObject({
      code: 'HYDRA_ERR_BAD_VALUE',
      keys: ['sampling.grammar'],
    });
    await expect(client.configure({ 'sampling.logit_bias': { '5000': 1 } })).rejects.toMatchObject({
      code: 'HYDRA_ERR_BAD_VALUE',
      keys: ['sampling.logit_bias'],
    });
    expect(eng.engine.layers.get('sampling.temp')).toBe(0.8);
    expect(eng.engine.epoch).toBe(epoch);
  });

  it('PLAN and the YAML config refuse what CONFIGURE refuses', async () => {
    await expect(client.plan({ n_outputs_max: 8 })).rejects.toMatchObject({
      code: 'HYDRA_ERR_UNSUPPORTED_FIELD',
      keys: ['n_outputs_max'],
    });
    const yaml = join(dir, 'refused.yaml');
    writeFileSync(yaml, `model: ${path}\nspeculative:\n  p_split: 0.2\n`);
    let err: HydraError | undefined;
    try {
      parseServeArgs(['--config', yaml]);
    } catch (e) {
      err = e as HydraError;
    }
    expect(err?.keys).toEqual(['speculative.p_split']);
    expect((err?.cause as HydraError | undefined)?.code).toBe('HYDRA_ERR_UNSUPPORTED_FIELD');
  });
});
