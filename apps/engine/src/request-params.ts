// Per-request settings of a completion, as llama-server and the OpenAI API name them: each field is
// either a T1 registry key (validated by tiering like a CONFIGURE delta and merged over the
// configuration in force), a field that changes what the client gets back and is refused until it
// is implemented, or one the caller handles itself (prompt, stop, stream, slot, cache_prompt, n,
// echo, ...).
// Pure: the one native check (a grammar parses, bias token ids exist) goes through an injected
// sampler factory.
import type { SamplerParams, SamplerStage } from '@hydra-engine/native-ggml';
import { normalize, type Params } from '@hydra-engine/tiering';
import { samplerParamsFrom } from './core/params.js';
import { HydraError } from './errors.js';
import type { ProbsRequest } from './logprobs.js';

/** Request fields that are registry T1 keys. */
export const REQUEST_FIELDS: Readonly<Record<string, string>> = Object.freeze({
  temperature: 'sampling.temp',
  top_p: 'sampling.top_p',
  top_k: 'sampling.top_k',
  min_p: 'sampling.min_p',
  typical_p: 'sampling.typ_p',
  min_keep: 'sampling.min_keep',
  repeat_penalty: 'sampling.penalty_repeat',
  repeat_last_n: 'sampling.penalty_last_n',
  frequency_penalty: 'sampling.penalty_freq',
  presence_penalty: 'sampling.penalty_present',
  dry_multiplier: 'sampling.dry_multiplier',
  dry_base: 'sampling.dry_base',
  dry_allowed_length: 'sampling.dry_allowed_length',
  dry_penalty_last_n: 'sampling.dry_penalty_last_n',
  dry_sequence_breakers: 'sampling.dry_sequence_breakers',
  xtc_probability: 'sampling.xtc_probability',
  xtc_threshold: 'sampling.xtc_threshold',
  dynatemp_range: 'sampling.dynatemp_range',
  dynatemp_exponent: 'sampling.dynatemp_exponent',
  top_n_sigma: 'sampling.top_n_sigma',
  mirostat: 'sampling.mirostat',
  mirostat_tau: 'sampling.mirostat_tau',
  mirostat_eta: 'sampling.mirostat_eta',
  adaptive_target: 'sampling.adaptive_target',
  adaptive_decay: 'sampling.adaptive_decay',
  grammar: 'sampling.grammar',
  samplers: 'sampling.samplers',
  logit_bias: 'sampling.logit_bias',
  n_probs: 'sampling.n_probs',
  seed: 'seed',
  max_tokens: 'n_predict',
  max_completion_tokens: 'n_predict',
  n_predict: 'n_predict',
  ignore_eos: 'sampling.ignore_eos',
});

const isObject = (v: unknown): v is Record<string, unknown> =>
  typeof v === 'object' && v !== null && !Array.isArray(v);
const emptyList = (v: unknown) => Array.isArray(v) && v.length === 0;

/**
 * Fields that change what the client gets back, or how the prompt is read, and that this engine
 * does not implement: a request naming one with anything but its neutral value is refused
 * (HYDRA_ERR_UNSUPPORTED_FIELD naming it) instead of answered as if it were absent.
 */
export const REFUSED_FIELDS: Readonly<Record<string, { neutral: (v: unknown) => boolean; why: string }>> =
  Object.freeze({
    tools: { neutral: emptyList, why: 'tool calls are not implemented' },
    tool_choice: { neutral: (v) => v === 'none' || v === 'auto', why: 'tool calls are not implemented' },
    functions: { neutral: emptyList, why: 'function calls are not implemented' },
    function_call: {
      neutral: (v) => v === 'none' || v === 'auto',
      why: 'function calls are not implemented',
    },
    best_of: {
      neutral: (v) => v === 1,
      why: 'best_of (rank choices by log probability server-side) is not implemented; use n',
    },
    timings_per_token: { neutral: (v) => v === false, why: 'per-token timings are not returned' },
    return_progress: { neutral: (v) => v === false, why: 'prompt progress is not streamed' },
    n_indent: { neutral: (v) => v === 0, why: 'indentation stops are not implemented' },
    grammar_lazy: { neutral: (v) => v === false, why: 'lazy grammars are not implemented' },
    grammar_triggers: { neutral: emptyList, why: 'lazy grammars are not implemented' },
    preserved_tokens: { neutral: emptyList, why: 'lazy grammars are not implemented' },
    lora: { neutral: emptyList, why: 'LoRA adapters are not implemented' },
    image_data: { neutral: emptyList, why: 'multimodal input is not implemented' },
  });

// llama-server's names for the stages (common_sampler_types_from_names with alternative names) and
// its one-letter form (common_sampler_types_from_chars).
const STAGE_NAMES: Readonly<Record<string, SamplerStage>> = {
  penalties: 'penalties',
  dry: 'dry',
  top_n_sigma: 'top_n_sigma',
  'top-n-sigma': 'top_n_sigma',
  top_k: 'top_k',
  'top-k': 'top_k',
  typ_p: 'typ_p',
  'typ-p': 'typ_p',
  typical_p: 'typ_p',
  'typical-p': 'typ_p',
  typical: 'typ_p',
  typ: 'typ_p',
  top_p: 'top_p',
  'top-p': 'top_p',
  nucleus: 'top_p',
  min_p: 'min_p',
  'min-p': 'min_p',
  xtc: 'xtc',
  temperature: 'temperature',
  temp: 'temperature',
  infill: 'infill',
  adaptive_p: 'adaptive_p',
  'adaptive-p': 'adaptive_p',
};
const STAGE_CHARS: Readonly<Record<string, SamplerStage>> = {
  e: 'penalties',
  d: 'dry',
  s: 'top_n_sigma',
  k: 'top_k',
  y: 'typ_p',
  p: 'top_p',
  m: 'min_p',
  x: 'xtc',
  t: 'temperature',
  i: 'infill',
  a: 'adaptive_p',
};

function badValue(message: string, field: string): HydraError {
  return new HydraError('HYDRA_ERR_BAD_VALUE', message, { keys: [field] });
}

/** `samplers` as a list of stage names or a string of stage letters, in llama-server's spellings. */
function stagesFrom(v: unknown): SamplerStage[] {
  const names = typeof v === 'string' ? [...v] : v;
  if (!Array.isArray(names) || names.length > 32)
    throw badValue('samplers must be a list of at most 32 sampler names or a string of letters', 'samplers');
  const table = typeof v === 'string' ? STAGE_CHARS : STAGE_NAMES;
  return names.map((n) => {
    const stage = typeof n === 'string' ? table[typeof v === 'string' ? n : n.toLowerCase()] : undefined;
    if (stage === undefined) throw badValue(`samplers: unknown sampler ${JSON.stringify(n)}`, 'samplers');
    return stage;
  });
}

/**
 * `logit_bias` as OpenAI sends it (`{"<token id>": bias}`) or llama-server's pair list
 * (`[[token id, bias | false], ...]`, false meaning never), as the registry's id -> bias map.
 */
function logitBiasFrom(v: unknown): Record<string, number> {
  const pairs: [unknown, unknown][] = Array.isArray(v)
    ? v.map((p) => (Array.isArray(p) && p.length === 2 ? (p as [unknown, unknown]) : [undefined, undefined]))
    : isObject(v)
      ? Object.entries(v)
      : [[undefined, undefined]];
  const out: Record<string, number> = {};
  for (const [token, bias] of pairs) {
    if (typeof token === 'string' && !/^(0|[1-9][0-9]{0,9})$/.test(token)) {
      throw new HydraError(
        'HYDRA_ERR_UNSUPPORTED_FIELD',
        'logit_bias: biasing a text piece is not implemented; send token ids',
        { keys: ['logit_bias'] },
      );
    }
    const id = typeof token === 'string' ? Number(token) : token;
    if (typeof id !== 'number' || !Number.isSafeInteger(id) || id < 0)
      throw badValue('logit_bias keys must be token ids', 'logit_bias');
    const b = bias === false ? -1e9 : bias;
    if (typeof b !== 'number' || !Number.isFinite(b))
      throw badValue('logit_bias values must be numbers (or false: never)', 'logit_bias');
    Object.defineProperty(out, String(id), {
      value: b,
      enumerable: true,
      writable: true,
      configurable: true,
    });
  }
  return out;
}

/** What {@link requestSettings} needs from outside: the native schema converter, the endpoint's kind. */
export interface RequestOptions {
  /**
   * How `logprobs` reads: OpenAI chat's boolean with `top_logprobs` (`chat`), or OpenAI
   * completions' count, llama-server's alias of `n_probs` (`count`, the default).
   */
  logprobs?: 'chat' | 'count';
  /** GBNF for a JSON schema (native-ggml's jsonSchemaToGrammar); without it schemas are refused. */
  jsonSchemaToGrammar?: (schema: unknown) => string;
}

/**
 * The grammar a request's `json_schema`, or `response_format` of type `json_object` (its optional
 * `schema`, else any JSON value, as llama-server does) or `json_schema` (`json_schema.schema`),
 * asks for; undefined when it asks for none.
 */
function schemaGrammar(
  body: Record<string, unknown>,
  options: RequestOptions,
): { field: string; grammar: string } | undefined {
  let field: string;
  let schema: unknown;
  if (body.json_schema !== undefined && body.json_schema !== null) {
    field = 'json_schema';
    schema = body.json_schema;
  } else {
    const rf = body.response_format;
    if (rf === undefined || rf === null) return undefined;
    field = 'response_format';
    if (!isObject(rf)) throw badValue('response_format must be an object with a type', field);
    if (rf.type === 'text') return undefined;
    if (rf.type === 'json_object') schema = rf.schema ?? {};
    else if (rf.type === 'json_schema') {
      schema = isObject(rf.json_schema) ? rf.json_schema.schema : undefined;
      if (schema === undefined) throw badValue('response_format.json_schema.schema is required', field);
    } else throw badValue('response_format.type must be text, json_object or json_schema', field);
  }
  if (!isObject(schema) && typeof schema !== 'boolean')
    throw badValue(`${field}: a JSON schema is an object`, field);
  if (body.grammar !== undefined && body.grammar !== null)
    throw badValue(`grammar and ${field} cannot both be set`, field);
  const convert = options.jsonSchemaToGrammar;
  if (!convert)
    throw new HydraError('HYDRA_ERR_UNSUPPORTED_FIELD', `${field}: no JSON schema converter`, {
      keys: [field],
    });
  try {
    return { field, grammar: convert(schema) };
  } catch (err) {
    throw new HydraError('HYDRA_ERR_BAD_VALUE', `${field}: ${(err as Error).message}`, {
      keys: [field],
      cause: err,
    });
  }
}

/** A request's validated T1 settings. */
export interface RequestSettings {
  /** The request's own T1 keys, canonical and normalized (what it overrides). */
  delta: Params;
  /** The configuration in force with `delta` over it. */
  effective: Params;
  sampler: SamplerParams;
  /** `n_predict` in force; -1 (and -2) mean no limit but the context. */
  nPredict: number;
  ignoreEos: boolean;
  /** The request fields that set the grammar, the biases and the stage order, for error messages. */
  fields: { grammar: string; logit_bias: string; samplers: string };
  /** Token probabilities to report (see {@link probsFrom}); undefined: none. */
  probs: ProbsRequest | undefined;
  /** llama-server's per-request `n_keep` for a context shift (-1: the whole prompt); undefined: not given. */
  nKeep: number | undefined;
}

/** OpenAI's bound on `top_logprobs` (and here on completions' `logprobs`). */
const TOP_LOGPROBS_MAX = 20;

const given = (v: unknown) => v !== undefined && v !== null;

/**
 * The token probabilities a request asks for: OpenAI chat's `logprobs: true` with `top_logprobs`
 * alternatives (default 0, as OpenAI; `top_logprobs` without `logprobs: true` is refused as
 * llama-server and OpenAI do), OpenAI completions' `logprobs: N` (llama-server's alias of
 * `n_probs`, which wins when both are set), `n_probs`, else `sampling.n_probs` in force (a chat's
 * explicit `logprobs: false` turns that default off); `post_sampling_probs` reports probabilities
 * after the sampler chain.
 */
function probsFrom(
  body: Record<string, unknown>,
  mode: 'chat' | 'count',
  nProbs: number,
  nProbsAsked: boolean,
): ProbsRequest | undefined {
  const post = body.post_sampling_probs;
  if (given(post) && typeof post !== 'boolean')
    throw badValue('post_sampling_probs must be a boolean', 'post_sampling_probs');
  const postSampling = post === true;
  const lp = body.logprobs;
  const top = body.top_logprobs;
  const count = (v: unknown) =>
    Number.isSafeInteger(v) && (v as number) >= 0 && (v as number) <= TOP_LOGPROBS_MAX;
  if (mode === 'chat') {
    if (given(lp) && typeof lp !== 'boolean') throw badValue('logprobs must be a boolean', 'logprobs');
    if (given(top)) {
      if (!count(top))
        throw badValue(`top_logprobs must be an integer in 0..${TOP_LOGPROBS_MAX}`, 'top_logprobs');
      if (lp !== true) throw badValue('top_logprobs requires logprobs: true', 'top_logprobs');
    }
    if (lp === true) return { n: nProbsAsked ? nProbs : ((top as number | undefined) ?? 0), postSampling };
    if (lp === false && !nProbsAsked) return undefined;
  } else {
    if (given(top) && top !== 0)
      throw new HydraError(
        'HYDRA_ERR_UNSUPPORTED_FIELD',
        'top_logprobs is a chat field; completions take logprobs: N',
        { keys: ['top_logprobs'] },
      );
    if (given(lp) && lp !== false) {
      if (!count(lp)) throw badValue(`logprobs must be an integer in 0..${TOP_LOGPROBS_MAX}`, 'logprobs');
      if (!nProbsAsked) nProbs = lp as number;
    } else if (lp === false && !nProbsAsked) return undefined;
  }
  return nProbs > 0 ? { n: nProbs, postSampling } : undefined;
}

/**
 * Reads a request body's T1 fields over `inForce` (the configuration in force). Applies nothing.
 *
 * @throws HydraError `HYDRA_ERR_UNSUPPORTED_FIELD` (a refused field, or a registry key the engine
 *   does not honor, such as `n_prev`) or `HYDRA_ERR_BAD_VALUE` (wrong type or out of range, a
 *   schema the converter refuses, a grammar next to a schema), with
 *   `keys` naming every offending field as the request spelled it.
 */
export function requestSettings(
  body: Record<string, unknown>,
  inForce: Params,
  options: RequestOptions = {},
): RequestSettings {
  const refused = Object.keys(REFUSED_FIELDS).filter((f) => {
    const v = body[f];
    return v !== undefined && v !== null && !REFUSED_FIELDS[f]!.neutral(v);
  });
  if (refused.length > 0) {
    const why = refused.map((f) => `${f} (${REFUSED_FIELDS[f]!.why})`).join('; ');
    throw new HydraError('HYDRA_ERR_UNSUPPORTED_FIELD', `unsupported request fields: ${why}`, {
      keys: refused,
    });
  }
  const delta: Record<string, unknown> = {};
  const fieldOf = new Map<string, string>();
  for (const [field, key] of Object.entries(REQUEST_FIELDS)) {
    let v = body[field];
    if (v === undefined || v === null) continue;
    if (field === 'samplers') v = stagesFrom(v);
    else if (field === 'logit_bias') v = logitBiasFrom(v);
    const first = fieldOf.get(key);
    // Two spellings of one key (max_tokens and n_predict) must agree.
    if (first !== undefined) {
      if (JSON.stringify(delta[key]) !== JSON.stringify(v))
        throw badValue(`${field} conflicts with ${first}`, field);
      continue;
    }
    delta[key] = v;
    fieldOf.set(key, field);
  }
  const schema = schemaGrammar(body, options);
  if (schema) {
    delta['sampling.grammar'] = schema.grammar;
    fieldOf.set('sampling.grammar', schema.field);
  }
  let t1: Params;
  try {
    t1 = normalize(delta);
  } catch (err) {
    const e = err as HydraError;
    const code = e.code === 'HYDRA_ERR_UNSUPPORTED_FIELD' ? e.code : 'HYDRA_ERR_BAD_VALUE';
    const keys = (e.keys ?? []).map((k) => fieldOf.get(k) ?? k);
    throw new HydraError(code, e.message, { keys, cause: err });
  }
  const effective = { ...inForce, ...t1 };
  const nKeep = body.n_keep;
  if (given(nKeep) && (!Number.isInteger(nKeep) || (nKeep as number) < -1))
    throw badValue('n_keep must be an integer >= -1', 'n_keep');
  const probs = probsFrom(
    body,
    options.logprobs ?? 'count',
    effective['sampling.n_probs'] as number,
    t1['sampling.n_probs'] !== undefined,
  );
  return {
    delta: t1,
    effective,
    sampler: samplerParamsFrom(effective),
    nPredict: effective.n_predict as number,
    ignoreEos: effective['sampling.ignore_eos'] as boolean,
    fields: {
      grammar: fieldOf.get('sampling.grammar') ?? 'grammar',
      logit_bias: 'logit_bias',
      samplers: 'samplers',
    },
    probs,
    nKeep: given(nKeep) ? (nKeep as number) : undefined,
  };
}

/** What {@link checkSampler} needs of a model: the native sampler factory. */
export interface SamplerFactory {
  createSampler(params: SamplerParams): { dispose(): void };
}

/**
 * Builds the chain once so that what only llama.cpp can judge (a grammar that does not parse, a
 * bias on a token id past the vocabulary) is this request's HYDRA_ERR_BAD_VALUE, naming the field
 * (`names` maps `grammar`/`logit_bias`/`samplers` to the caller's spelling), before it is queued.
 */
export function checkSampler(
  model: SamplerFactory,
  sampler: SamplerParams,
  names: { grammar: string; logit_bias: string; samplers: string } = {
    grammar: 'grammar',
    logit_bias: 'logit_bias',
    samplers: 'samplers',
  },
): void {
  if (sampler.grammar === undefined && sampler.logitBias === undefined) return;
  try {
    model.createSampler(sampler).dispose();
  } catch (err) {
    const message = (err as Error).message;
    const field = /grammar/.test(message)
      ? names.grammar
      : /logitBias/.test(message)
        ? names.logit_bias
        : names.samplers;
    throw new HydraError('HYDRA_ERR_BAD_VALUE', `${field}: ${message}`, { keys: [field], cause: err });
  }
}
