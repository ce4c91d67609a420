import type {
  ContextParams,
  ModelLoadParams,
  PoolingType,
  SamplerParams,
  SamplerStage,
} from '@hydra-engine/native-ggml';
import { expertBlockRegex, LLAMA_MAX_LAYERS } from '@hydra-engine/resolver';
import { type ConfigLayers, type FieldType, fieldFor, type Params } from '@hydra-engine/tiering';
import { HydraError } from '../errors.js';
import { maxGuess, rsSnapshotsFor, speculativeFrom } from './speculative.js';

/** `obj` without its undefined members (the addon reads a present member as set). */
function withoutDefaults<T extends object>(obj: T): T {
  for (const k of Object.keys(obj) as (keyof T)[]) if (obj[k] === undefined) delete obj[k];
  return obj;
}

function internal(message: string): HydraError {
  return new HydraError('HYDRA_ERR_INTERNAL', message);
}

type Kind = FieldType['kind'];

// The native types' values, as lists the reads check the registry against.
const SPLIT_MODES = ['none', 'layer', 'row'] as const satisfies readonly NonNullable<
  ModelLoadParams['splitMode']
>[];
const FLASH_ATTN = ['auto', 'on', 'off'] as const satisfies readonly NonNullable<
  ContextParams['flashAttn']
>[];
const POOLING_TYPES = [
  'unspecified',
  'none',
  'mean',
  'cls',
  'last',
  'rank',
] as const satisfies readonly PoolingType[];
const ATTENTION_TYPES = ['unspecified', 'causal', 'non_causal'] as const satisfies readonly NonNullable<
  ContextParams['attentionType']
>[];
const SAMPLER_STAGES = [
  'penalties',
  'dry',
  'top_n_sigma',
  'top_k',
  'typ_p',
  'top_p',
  'min_p',
  'xtc',
  'temperature',
  'infill',
  'adaptive_p',
] as const satisfies readonly SamplerStage[];

/**
 * Typed reads of a configuration (the layers' state in force, a plan's next state, a request's
 * keys) for the native specs: each read checks the key's type in tiering's registry and the value
 * against it, so the specs are built without casts, and a registry change that alters a key's type
 * (or adds an enum value the native type lacks) fails here, by key, instead of reaching llama.cpp
 * as something else. A key absent from the configuration reads as undefined (llama.cpp's default).
 */
export class ConfigReader {
  readonly #cfg: Params;

  constructor(cfg: Params) {
    this.#cfg = cfg;
  }

  /** The registry's value type of `key` (an `"auto"` key: what it is once the planner chose). */
  #type(key: string, kinds: readonly Kind[], what: string): FieldType {
    const spec = fieldFor(key);
    if (spec === undefined || spec.key !== key) throw internal(`${key} is not a canonical registry key`);
    const type = spec.type.kind === 'auto' ? spec.type.of : spec.type;
    if (!kinds.includes(type.kind)) throw internal(`${key} is ${type.kind} in the registry, read as ${what}`);
    return type;
  }

  #read<T>(key: string, kinds: readonly Kind[], what: string, ok: (v: unknown) => v is T): T | undefined {
    this.#type(key, kinds, what);
    const v = this.#cfg[key];
    if (v === undefined) return undefined;
    if (!ok(v)) throw internal(`${key} must be ${what} here, got ${JSON.stringify(v)}`);
    return v;
  }

  int(key: string): number | undefined {
    return this.#read(key, ['int'], 'an integer', (v): v is number => Number.isSafeInteger(v));
  }

  num(key: string): number | undefined {
    return this.#read(key, ['int', 'number'], 'a number', (v): v is number => typeof v === 'number');
  }

  bool(key: string): boolean | undefined {
    return this.#read(key, ['bool'], 'a boolean', (v): v is boolean => typeof v === 'boolean');
  }

  str(key: string): string | undefined {
    return this.#read(key, ['string', 'enum'], 'a string', (v): v is string => typeof v === 'string');
  }

  strs(key: string): string[] | undefined {
    const type = this.#type(key, ['list'], 'a list of strings');
    if (type.kind !== 'list' || (type.of.kind !== 'string' && type.of.kind !== 'enum'))
      throw internal(`${key} is not a list of strings in the registry`);
    return this.#read(
      key,
      ['list'],
      'a list of strings',
      (v): v is string[] => Array.isArray(v) && v.every((x) => typeof x === 'string'),
    );
  }

  nums(key: string): number[] | undefined {
    const type = this.#type(key, ['list'], 'a list of numbers');
    if (type.kind !== 'list' || (type.of.kind !== 'number' && type.of.kind !== 'int'))
      throw internal(`${key} is not a list of numbers in the registry`);
    return this.#read(
      key,
      ['list'],
      'a list of numbers',
      (v): v is number[] => Array.isArray(v) && v.every((x) => typeof x === 'number'),
    );
  }

  /** A value of `key` as one of `values` (the native type's): every registry value must be one. */
  oneOf<T extends string>(key: string, values: readonly T[]): T | undefined {
    this.#covers(key, this.#type(key, ['enum'], 'an enum'), values);
    return this.#read(key, ['enum'], `one of ${values.join(', ')}`, (v): v is T => values.includes(v as T));
  }

  /** A list of `key` of `values` (the native type's): every registry value must be one. */
  listOf<T extends string>(key: string, values: readonly T[]): T[] | undefined {
    const type = this.#type(key, ['list'], 'a list of enum values');
    if (type.kind !== 'list' || type.of.kind !== 'enum')
      throw internal(`${key} is not a list of enum values`);
    this.#covers(key, type.of, values);
    return this.#read(
      key,
      ['list'],
      `a list of ${values.join(', ')}`,
      (v): v is T[] => Array.isArray(v) && v.every((x) => values.includes(x as T)),
    );
  }

  /** A map of `key` (string keys, number values). */
  numberMap(key: string): ReadonlyMap<string, number> | undefined {
    const v = this.#read(
      key,
      ['map'],
      'a map of numbers',
      (x): x is object =>
        typeof x === 'object' &&
        x !== null &&
        !Array.isArray(x) &&
        Object.values(x).every((n) => typeof n === 'number'),
    );
    return v === undefined ? undefined : new Map(Object.entries(v));
  }

  #covers(key: string, type: FieldType, values: readonly string[]): void {
    if (type.kind !== 'enum') return;
    const missing = type.values.filter((x) => !values.includes(x));
    if (missing.length > 0) throw internal(`${key}: the native type has no ${missing.join(', ')}`);
  }
}

/** A list-of-strings key in force in `layers` (`rpc_servers`, `devices`, ...), checked like {@link ConfigReader.strs}. */
export function stringsInForce(layers: Pick<ConfigLayers, 'get'>, key: string): string[] {
  return new ConfigReader({ [key]: layers.get(key) }).strs(key) ?? [];
}

/** Model load parameters (T3 fields) from the configuration in force. */
export function modelParamsFrom(cfg: Params, path: string): ModelLoadParams {
  const c = new ConfigReader(cfg);
  const overrides = [...(c.strs('override_tensors') ?? [])];
  // llama.cpp --n-cpu-moe N: the experts of the first N layers stay in host memory.
  // Past llama.cpp's 512 layers (LLAMA_MAX_LAYERS) an override matches no block: the registry
  // allows n_cpu_moe up to 2^31, and one string per value would take the JS heap down first.
  const nCpuMoe = Math.min(c.num('n_cpu_moe') ?? 0, LLAMA_MAX_LAYERS);
  for (let i = 0; i < nCpuMoe; i++) overrides.push(`${expertBlockRegex(i)}=CPU`);
  const kvOverrides = (c.strs('kv_overrides') ?? []).map((spec) => {
    const m = /^([^=]+)=(int|float|bool|str):(.*)$/.exec(spec);
    if (!m)
      throw new HydraError('HYDRA_ERR_BAD_VALUE', `kv_overrides item must be KEY=TYPE:VALUE, got ${spec}`);
    const type = m[2] as 'int' | 'float' | 'bool' | 'str';
    const raw = m[3]!;
    const value = type === 'str' ? raw : type === 'bool' ? raw === 'true' : Number(raw);
    return { key: m[1]!, type, value };
  });
  const ngl = c.num('n_gpu_layers');
  const split = c.nums('tensor_split') ?? [];
  const devices = c.strs('devices') ?? [];
  return withoutDefaults({
    path,
    nGpuLayers: ngl === -1 ? undefined : ngl,
    splitMode: c.oneOf('split_mode', SPLIT_MODES),
    mainGpu: c.num('main_gpu'),
    tensorSplit: split.length > 0 ? split : undefined,
    devices: devices.length > 0 ? devices : undefined,
    overrides: overrides.length > 0 ? overrides : undefined,
    kvOverrides: kvOverrides.length > 0 ? kvOverrides : undefined,
    useMmap: c.bool('use_mmap'),
    useMlock: c.bool('use_mlock'),
    useDirectIo: c.bool('use_direct_io') || undefined,
    checkTensors: c.bool('check_tensors'),
    noExtraBufts: c.bool('no_extra_bufts') || undefined,
    noHost: c.bool('no_host') || undefined,
  });
}

/** Context parameters (T2 fields) from the configuration in force. */
export function contextParamsFrom(cfg: Params): ContextParams {
  const c = new ConfigReader(cfg);
  const positive = (v: number | undefined) => (v !== undefined && v > 0 ? v : undefined);
  const rope = c.str('rope_scaling_type');
  const spec = speculativeFrom(cfg);
  const pooling = c.oneOf('pooling_type', POOLING_TYPES);
  const attention = c.oneOf('attention_type', ATTENTION_TYPES);
  // llama-server: the batch group's mask and strictness default to the generation group's.
  const cpuMask = c.str('cpuparams.cpumask') || undefined;
  const cpuStrict = c.bool('cpuparams.strict_cpu') || undefined;
  return withoutDefaults({
    nCtx: c.num('n_ctx'),
    nBatch: c.num('n_batch'),
    nUbatch: c.num('n_ubatch'),
    nSeqMax: c.num('n_parallel'),
    nThreads: positive(c.int('cpuparams.n_threads')),
    nThreadsBatch: positive(c.int('cpuparams_batch.n_threads')) ?? positive(c.int('cpuparams.n_threads')),
    flashAttn: c.oneOf('flash_attn', FLASH_ATTN),
    typeK: c.str('cache_type_k'),
    typeV: c.str('cache_type_v'),
    ropeFreqBase: positive(c.num('rope_freq_base')),
    ropeFreqScale: positive(c.num('rope_freq_scale')),
    ropeScalingType: rope === 'none' || rope === 'linear' || rope === 'yarn' ? rope : undefined,
    // -1 is llama.cpp's own "from the model" for each factor, so they pass through unchanged.
    yarnExtFactor: c.num('yarn_ext_factor'),
    yarnAttnFactor: c.num('yarn_attn_factor'),
    yarnBetaFast: c.num('yarn_beta_fast'),
    yarnBetaSlow: c.num('yarn_beta_slow'),
    yarnOrigCtx: positive(c.int('yarn_orig_ctx')),
    offloadKqv: !c.bool('no_kv_offload'),
    opOffload: !c.bool('no_op_offload'),
    swaFull: c.bool('swa_full'),
    kvUnified: c.bool('kv_unified'),
    poolingType: pooling === 'unspecified' ? undefined : pooling,
    attentionType: attention === 'unspecified' ? undefined : attention,
    cpuMask,
    cpuStrict,
    cpuMaskBatch: c.str('cpuparams_batch.cpumask') || cpuMask,
    cpuStrictBatch: c.bool('cpuparams_batch.strict_cpu') || cpuStrict,
    // A speculative guess of up to ngram_size_m (n_max) tokens samples that many + 1 outputs of one
    // sequence; llama.cpp's on-device sampling takes 1 unless told (it clamps to n_batch).
    nOutputsMaxPerSeq: spec ? maxGuess(spec) + 1 : undefined,
    // A recurrent or hybrid memory drops a step's rejected guesses by restoring a snapshot.
    nRsSeq: spec ? rsSnapshotsFor(cfg) : undefined,
  });
}

/** `sampling.logit_bias` (token id in decimal -> bias) as the native list; ids are checked natively. */
function logitBiasFrom(
  map: ReadonlyMap<string, number> | undefined,
): { token: number; bias: number }[] | undefined {
  const entries = [...(map ?? [])];
  return entries.length > 0 ? entries.map(([token, bias]) => ({ token: Number(token), bias })) : undefined;
}

/** Sampler parameters (T1 `sampling.*` and `seed`) from a configuration or request. */
export function samplerParamsFrom(cfg: Params): SamplerParams {
  const c = new ConfigReader(cfg);
  const grammar = c.str('sampling.grammar');
  return withoutDefaults({
    temp: c.num('sampling.temp'),
    topK: c.num('sampling.top_k'),
    topP: c.num('sampling.top_p'),
    minP: c.num('sampling.min_p'),
    typP: c.num('sampling.typ_p'),
    minKeep: c.num('sampling.min_keep'),
    penaltyRepeat: c.num('sampling.penalty_repeat'),
    penaltyFreq: c.num('sampling.penalty_freq'),
    penaltyPresent: c.num('sampling.penalty_present'),
    penaltyLastN: c.num('sampling.penalty_last_n'),
    seed: c.num('seed'),
    grammar: grammar === '' ? undefined : grammar,
    xtcProbability: c.num('sampling.xtc_probability'),
    xtcThreshold: c.num('sampling.xtc_threshold'),
    dynatempRange: c.num('sampling.dynatemp_range'),
    dynatempExponent: c.num('sampling.dynatemp_exponent'),
    dryMultiplier: c.num('sampling.dry_multiplier'),
    dryBase: c.num('sampling.dry_base'),
    dryAllowedLength: c.num('sampling.dry_allowed_length'),
    dryPenaltyLastN: c.num('sampling.dry_penalty_last_n'),
    drySequenceBreakers: c.strs('sampling.dry_sequence_breakers'),
    adaptiveTarget: c.num('sampling.adaptive_target'),
    adaptiveDecay: c.num('sampling.adaptive_decay'),
    mirostat: c.num('sampling.mirostat'),
    mirostatTau: c.num('sampling.mirostat_tau'),
    mirostatEta: c.num('sampling.mirostat_eta'),
    topNSigma: c.num('sampling.top_n_sigma'),
    logitBias: logitBiasFrom(c.numberMap('sampling.logit_bias')),
    samplers: c.listOf('sampling.samplers', SAMPLER_STAGES),
  });
}
