import type { ContextParams, ModelLoadParams, SamplerParams, SamplerStage } from '@hydra-engine/native-ggml';
import { expertBlockRegex, LLAMA_MAX_LAYERS } from '@hydra-engine/resolver';
import type { Params } from '@hydra-engine/tiering';
import { HydraError } from '../errors.js';
import { maxGuess, speculativeFrom } from './speculative.js';

function withoutDefaults<T extends object>(obj: T): Partial<T> {
  const out: Partial<T> = {};
  for (const [k, v] of Object.entries(obj)) if (v !== undefined) (out as Record<string, unknown>)[k] = v;
  return out;
}

/** Model load parameters (T3 fields) from the configuration in force. */
export function modelParamsFrom(cfg: Params, path: string): ModelLoadParams {
  const overrides = [...((cfg.override_tensors as string[]) ?? [])];
  // llama.cpp --n-cpu-moe N: the experts of the first N layers stay in host memory.
  // Past llama.cpp's 512 layers (LLAMA_MAX_LAYERS) an override matches no block: the registry
  // allows n_cpu_moe up to 2^31, and one string per value would take the JS heap down first.
  const nCpuMoe = Math.min((cfg.n_cpu_moe as number) ?? 0, LLAMA_MAX_LAYERS);
  for (let i = 0; i < nCpuMoe; i++) overrides.push(`${expertBlockRegex(i)}=CPU`);
  const kvOverrides = ((cfg.kv_overrides as string[]) ?? []).map((spec) => {
    const m = /^([^=]+)=(int|float|bool|str):(.*)$/.exec(spec);
    if (!m)
      throw new HydraError('HYDRA_ERR_BAD_VALUE', `kv_overrides item must be KEY=TYPE:VALUE, got ${spec}`);
    const type = m[2] as 'int' | 'float' | 'bool' | 'str';
    const raw = m[3]!;
    const value = type === 'str' ? raw : type === 'bool' ? raw === 'true' : Number(raw);
    return { key: m[1]!, type, value };
  });
  const ngl = cfg.n_gpu_layers as number;
  const split = (cfg.tensor_split as number[]) ?? [];
  const devices = (cfg.devices as string[]) ?? [];
  return withoutDefaults({
    path,
    nGpuLayers: ngl === -1 ? undefined : ngl,
    splitMode: cfg.split_mode as 'none' | 'layer' | 'row',
    mainGpu: cfg.main_gpu as number,
    tensorSplit: split.length > 0 ? split : undefined,
    devices: devices.length > 0 ? devices : undefined,
    overrides: overrides.length > 0 ? overrides : undefined,
    kvOverrides: kvOverrides.length > 0 ? kvOverrides : undefined,
    useMmap: cfg.use_mmap as boolean,
    useMlock: cfg.use_mlock as boolean,
    checkTensors: cfg.check_tensors as boolean,
  }) as ModelLoadParams;
}

/** Context parameters (T2 fields) from the configuration in force. */
export function contextParamsFrom(cfg: Params): ContextParams {
  const positive = (v: unknown) => (typeof v === 'number' && v > 0 ? v : undefined);
  const rope = cfg.rope_scaling_type as string;
  const spec = speculativeFrom(cfg);
  return withoutDefaults({
    nCtx: cfg.n_ctx as number,
    nBatch: cfg.n_batch as number,
    nUbatch: cfg.n_ubatch as number,
    nSeqMax: cfg.n_parallel as number,
    nThreads: positive(cfg['cpuparams.n_threads']),
    nThreadsBatch: positive(cfg['cpuparams_batch.n_threads']) ?? positive(cfg['cpuparams.n_threads']),
    flashAttn: cfg.flash_attn as 'auto' | 'on' | 'off',
    typeK: cfg.cache_type_k as string,
    typeV: cfg.cache_type_v as string,
    ropeFreqBase: positive(cfg.rope_freq_base),
    ropeFreqScale: positive(cfg.rope_freq_scale),
    ropeScalingType: rope === 'none' || rope === 'linear' || rope === 'yarn' ? rope : undefined,
    // -1 is llama.cpp's own "from the model" for each factor, so they pass through unchanged.
    yarnExtFactor: cfg.yarn_ext_factor as number,
    yarnAttnFactor: cfg.yarn_attn_factor as number,
    yarnBetaFast: cfg.yarn_beta_fast as number,
    yarnBetaSlow: cfg.yarn_beta_slow as number,
    yarnOrigCtx: positive(cfg.yarn_orig_ctx),
    offloadKqv: !(cfg.no_kv_offload as boolean),
    opOffload: !(cfg.no_op_offload as boolean),
    swaFull: cfg.swa_full as boolean,
    kvUnified: cfg.kv_unified as boolean,
    poolingType: cfg.pooling_type === 'unspecified' ? undefined : (cfg.pooling_type as PoolingType),
    // A speculative guess of up to ngram_size_m (n_max) tokens samples that many + 1 outputs of one
    // sequence; llama.cpp's on-device sampling takes 1 unless told (it clamps to n_batch).
    nOutputsMaxPerSeq: spec ? maxGuess(spec) + 1 : undefined,
  }) as ContextParams;
}

/** `sampling.logit_bias` (token id in decimal -> bias) as the native list; ids are checked natively. */
function logitBiasFrom(map: unknown): { token: number; bias: number }[] | undefined {
  const entries = Object.entries((map as Record<string, number> | undefined) ?? {});
  return entries.length > 0 ? entries.map(([token, bias]) => ({ token: Number(token), bias })) : undefined;
}

/** Sampler parameters (T1 `sampling.*` and `seed`) from a configuration or request. */
export function samplerParamsFrom(cfg: Params): SamplerParams {
  const grammar = cfg['sampling.grammar'] as string | undefined;
  return withoutDefaults({
    temp: cfg['sampling.temp'] as number,
    topK: cfg['sampling.top_k'] as number,
    topP: cfg['sampling.top_p'] as number,
    minP: cfg['sampling.min_p'] as number,
    typP: cfg['sampling.typ_p'] as number,
    minKeep: cfg['sampling.min_keep'] as number,
    penaltyRepeat: cfg['sampling.penalty_repeat'] as number,
    penaltyFreq: cfg['sampling.penalty_freq'] as number,
    penaltyPresent: cfg['sampling.penalty_present'] as number,
    penaltyLastN: cfg['sampling.penalty_last_n'] as number,
    seed: cfg.seed as number,
    grammar: grammar === '' ? undefined : grammar,
    xtcProbability: cfg['sampling.xtc_probability'] as number,
    xtcThreshold: cfg['sampling.xtc_threshold'] as number,
    dynatempRange: cfg['sampling.dynatemp_range'] as number,
    dynatempExponent: cfg['sampling.dynatemp_exponent'] as number,
    dryMultiplier: cfg['sampling.dry_multiplier'] as number,
    dryBase: cfg['sampling.dry_base'] as number,
    dryAllowedLength: cfg['sampling.dry_allowed_length'] as number,
    dryPenaltyLastN: cfg['sampling.dry_penalty_last_n'] as number,
    drySequenceBreakers: cfg['sampling.dry_sequence_breakers'] as string[],
    adaptiveTarget: cfg['sampling.adaptive_target'] as number,
    adaptiveDecay: cfg['sampling.adaptive_decay'] as number,
    mirostat: cfg['sampling.mirostat'] as number,
    mirostatTau: cfg['sampling.mirostat_tau'] as number,
    mirostatEta: cfg['sampling.mirostat_eta'] as number,
    topNSigma: cfg['sampling.top_n_sigma'] as number,
    logitBias: logitBiasFrom(cfg['sampling.logit_bias']),
    samplers: cfg['sampling.samplers'] as SamplerStage[],
  }) as SamplerParams;
}
