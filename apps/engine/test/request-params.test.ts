import type { SamplerParams } from '@hydra-engine/native-ggml';
import { defaults, fieldFor, type Params } from '@hydra-engine/tiering';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import type { HydraError } from '../src/errors.js';
import { checkSampler, REFUSED_FIELDS, REQUEST_FIELDS, requestSettings } from '../src/request-params.js';

const inForce: Params = defaults();

function rejection(fn: () => unknown): HydraError {
  try {
    fn();
  } catch (e) {
    return e as HydraError;
  }
  throw new Error('expected a rejection');
}

describe('requestSettings', () => {
  it('maps every llama-server field to a registry key the engine knows', () => {
    for (const key of Object.values(REQUEST_FIELDS)) expect(fieldFor(key)?.key).toBe(key);
  });

  it.each([
    ['temperature', 0.3, 'temp', 0.3],
    ['top_k', 7, 'topK', 7],
    ['typical_p', 0.5, 'typP', 0.5],
    ['min_keep', 3, 'minKeep', 3],
    ['repeat_last_n', -1, 'penaltyLastN', -1],
    ['dry_multiplier', 0.8, 'dryMultiplier', 0.8],
    ['dry_sequence_breakers', ['\n'], 'drySequenceBreakers', ['\n']],
    ['xtc_probability', 0.5, 'xtcProbability', 0.5],
    ['xtc_threshold', 0.2, 'xtcThreshold', 0.2],
    ['dynatemp_range', 0.5, 'dynatempRange', 0.5],
    ['dynatemp_exponent', 2, 'dynatempExponent', 2],
    ['top_n_sigma', 1.5, 'topNSigma', 1.5],
    ['mirostat', 2, 'mirostat', 2],
    ['mirostat_tau', 3, 'mirostatTau', 3],
    ['mirostat_eta', 0.2, 'mirostatEta', 0.2],
    ['adaptive_target', 0.4, 'adaptiveTarget', 0.4],
    ['adaptive_decay', 0.5, 'adaptiveDecay', 0.5],
    ['grammar', 'root ::= "a"', 'grammar', 'root ::= "a"'],
    ['samplers', ['top_k', 'temperature'], 'samplers', ['top_k', 'temperature']],
    ['samplers', ['top-k', 'nucleus', 'temp'], 'samplers', ['top_k', 'top_p', 'temperature']],
    ['samplers', 'kpt', 'samplers', ['top_k', 'top_p', 'temperature']],
    ['logit_bias', { '15': 2.5 }, 'logitBias', [{ token: 15, bias: 2.5 }]],
    ['logit_bias', [[15, false]], 'logitBias', [{ token: 15, bias: -1e9 }]],
    ['seed', -1, 'seed', 0xffff_ffff],
  ] as const)('%s = %j reaches the sampler as %s', (field, value, native, want) => {
    const r = requestSettings({ [field]: value }, inForce);
    expect(r.sampler[native as keyof SamplerParams]).toEqual(want);
    expect(Object.keys(r.delta)).toEqual([REQUEST_FIELDS[field]]);
  });

  it('leaves the configuration in force where the request is silent, and never modifies it', () => {
    const cfg = { ...inForce, 'sampling.temp': 0.1, 'sampling.logit_bias': { '3': 1 } };
    const copy = structuredClone(cfg);
    const r = requestSettings({ top_k: 5 }, cfg);
    expect(r.sampler.temp).toBe(0.1);
    expect(r.sampler.logitBias).toEqual([{ token: 3, bias: 1 }]);
    expect(cfg).toEqual(copy);
    expect(requestSettings({ logit_bias: {} }, cfg).sampler.logitBias).toBeUndefined();
  });

  it('reads n_predict from max_tokens, max_completion_tokens or n_predict, which must agree', () => {
    expect(requestSettings({ max_tokens: 5 }, inForce).nPredict).toBe(5);
    expect(requestSettings({ max_tokens: 5, n_predict: 5 }, inForce).nPredict).toBe(5);
    expect(rejection(() => requestSettings({ max_tokens: 5, n_predict: 6 }, inForce))).toMatchObject({
      code: 'HYDRA_ERR_BAD_VALUE',
      keys: ['n_predict'],
    });
  });

  it.each(Object.keys(REFUSED_FIELDS))('refuses %s with a value that would change the reply', (field) => {
    const value = field === 'n' ? 2 : ['x'];
    const weird = [
      'logprobs',
      'echo',
      'timings_per_token',
      'return_progress',
      'post_sampling_probs',
    ].includes(field)
      ? true
      : ['top_logprobs', 'n_indent', 'n_keep', 'best_of'].includes(field)
        ? 3
        : field === 'suffix'
          ? 'x'
          : field === 'tool_choice' || field === 'function_call'
            ? 'required'
            : field === 'grammar_lazy'
              ? true
              : value;
    const e = rejection(() => requestSettings({ temperature: 0.5, [field]: weird }, inForce));
    expect(e.code).toBe('HYDRA_ERR_UNSUPPORTED_FIELD');
    expect(e.keys).toEqual([field]);
  });

  it('accepts the neutral values of refused fields, and null', () => {
    const body = {
      response_format: { type: 'text' },
      tools: [],
      tool_choice: 'none',
      logprobs: false,
      top_logprobs: 0,
      n: 1,
      best_of: 1,
      echo: false,
      suffix: '',
      n_keep: 0,
      json_schema: null,
    };
    expect(requestSettings(body, inForce).delta).toEqual({});
  });

  it('reads token probabilities as completions ask them: n_probs, logprobs: N, the default in force', () => {
    const probs = (body: Record<string, unknown>, cfg = inForce) => requestSettings(body, cfg).probs;
    expect(probs({})).toBeUndefined();
    expect(probs({ n_probs: 3 })).toEqual({ n: 3, postSampling: false });
    expect(probs({ logprobs: 2, post_sampling_probs: true })).toEqual({ n: 2, postSampling: true });
    // llama-server: logprobs is n_probs' alias, used when n_probs is absent.
    expect(probs({ logprobs: 2, n_probs: 4 })).toEqual({ n: 4, postSampling: false });
    expect(probs({ logprobs: 0 })).toBeUndefined();
    const five = { ...inForce, 'sampling.n_probs': 5 };
    expect(probs({}, five)).toEqual({ n: 5, postSampling: false });
    expect(probs({ logprobs: false }, five)).toBeUndefined();
    expect(probs({ n_probs: 0 }, five)).toBeUndefined();
  });

  it('reads chat token probabilities as OpenAI: logprobs: true with top_logprobs alternatives', () => {
    const probs = (body: Record<string, unknown>, cfg = inForce) =>
      requestSettings(body, cfg, { logprobs: 'chat' }).probs;
    expect(probs({ logprobs: true })).toEqual({ n: 0, postSampling: false });
    expect(probs({ logprobs: true, top_logprobs: 20 })).toEqual({ n: 20, postSampling: false });
    expect(probs({ logprobs: false, top_logprobs: null })).toBeUndefined();
    const five = { ...inForce, 'sampling.n_probs': 5 };
    expect(probs({}, five)).toEqual({ n: 5, postSampling: false });
    expect(probs({ logprobs: false }, five)).toBeUndefined();
  });

  it.each([
    ['chat', { logprobs: true, top_logprobs: 21 }, 'HYDRA_ERR_BAD_VALUE', 'top_logprobs'],
    ['chat', { logprobs: true, top_logprobs: -1 }, 'HYDRA_ERR_BAD_VALUE', 'top_logprobs'],
    ['chat', { logprobs: true, top_logprobs: 1.5 }, 'HYDRA_ERR_BAD_VALUE', 'top_logprobs'],
    ['chat', { top_logprobs: 3 }, 'HYDRA_ERR_BAD_VALUE', 'top_logprobs'],
    ['chat', { logprobs: 3 }, 'HYDRA_ERR_BAD_VALUE', 'logprobs'],
    ['count', { logprobs: 21 }, 'HYDRA_ERR_BAD_VALUE', 'logprobs'],
    ['count', { logprobs: -1 }, 'HYDRA_ERR_BAD_VALUE', 'logprobs'],
    ['count', { logprobs: true }, 'HYDRA_ERR_BAD_VALUE', 'logprobs'],
    ['count', { top_logprobs: 2 }, 'HYDRA_ERR_UNSUPPORTED_FIELD', 'top_logprobs'],
    ['count', { n_probs: -1 }, 'HYDRA_ERR_BAD_VALUE', 'n_probs'],
    ['count', { post_sampling_probs: 'yes' }, 'HYDRA_ERR_BAD_VALUE', 'post_sampling_probs'],
  ] as const)('%s %j is %s naming %s', (mode, body, code, key) => {
    expect(rejection(() => requestSettings(body, inForce, { logprobs: mode }))).toMatchObject({
      code,
      keys: [key],
    });
  });

  it.each([
    ['temperature', 'hot'],
    ['top_p', 2],
    ['mirostat', 3],
    ['dry_sequence_breakers', 'x'],
    ['samplers', ['top_k', 'bogus']],
    ['samplers', 'kz'],
    ['samplers', 5],
    ['logit_bias', [[-1, 1]]],
    ['logit_bias', { '1': 'x' }],
    ['logit_bias', [[1]]],
    ['logit_bias', 'x'],
    ['grammar', 5],
    ['xtc_probability', -0.1],
  ] as const)('%s = %j is HYDRA_ERR_BAD_VALUE naming the field', (field, value) => {
    const e = rejection(() => requestSettings({ [field]: value }, inForce));
    expect([e.code, e.keys]).toEqual(['HYDRA_ERR_BAD_VALUE', [field]]);
  });

  it('refuses a text piece in logit_bias rather than ignoring it', () => {
    expect(rejection(() => requestSettings({ logit_bias: [['Hello', 1]] }, inForce))).toMatchObject({
      code: 'HYDRA_ERR_UNSUPPORTED_FIELD',
      keys: ['logit_bias'],
    });
  });

  it('never throws anything but a HydraError with the offending fields named', () => {
    const fields = [
      ...Object.keys(REQUEST_FIELDS),
      ...Object.keys(REFUSED_FIELDS),
      'json_schema',
      'response_format',
      'prompt',
    ];
    fc.assert(
      fc.property(fc.dictionary(fc.constantFrom(...fields), fc.jsonValue(), { maxKeys: 6 }), (body) => {
        try {
          requestSettings(body as Record<string, unknown>, inForce);
        } catch (e) {
          const err = e as HydraError;
          expect(['HYDRA_ERR_BAD_VALUE', 'HYDRA_ERR_UNSUPPORTED_FIELD']).toContain(err.code);
          expect(err.keys?.length).toBeGreaterThan(0);
          for (const k of err.keys ?? []) expect(Object.keys(body)).toContain(k);
        }
      }),
      { numRuns: 500 },
    );
  });
});

describe('requestSettings with a JSON schema converter', () => {
  const seen: unknown[] = [];
  const convert = (schema: unknown) => {
    seen.push(schema);
    if ((schema as { type?: string }).type === 'frob') throw new Error('Unrecognized schema');
    return `root ::= ${JSON.stringify(JSON.stringify(schema))}`;
  };
  const schema = { type: 'object', properties: { a: { type: 'integer' } } };

  it.each([
    [{ json_schema: schema }, schema, 'json_schema'],
    [
      { response_format: { type: 'json_schema', json_schema: { name: 'n', schema } } },
      schema,
      'response_format',
    ],
    [{ response_format: { type: 'json_object' } }, {}, 'response_format'],
    [{ response_format: { type: 'json_object', schema } }, schema, 'response_format'],
  ] as const)('%j becomes the grammar of %j', (body, want, field) => {
    seen.length = 0;
    const r = requestSettings(body as Record<string, unknown>, inForce, { jsonSchemaToGrammar: convert });
    expect(seen).toEqual([want]);
    expect(r.sampler.grammar).toBe(`root ::= ${JSON.stringify(JSON.stringify(want))}`);
    expect(r.fields.grammar).toBe(field);
  });

  it('leaves the grammar alone for response_format text and a null schema', () => {
    const r = requestSettings({ response_format: { type: 'text' }, json_schema: null }, inForce, {
      jsonSchemaToGrammar: convert,
    });
    expect(r.sampler.grammar).toBeUndefined();
  });

  it.each([
    [{ json_schema: { type: 'frob' } }, 'HYDRA_ERR_BAD_VALUE', 'json_schema'],
    [{ json_schema: 'x' }, 'HYDRA_ERR_BAD_VALUE', 'json_schema'],
    [{ json_schema: schema, grammar: 'root ::= "a"' }, 'HYDRA_ERR_BAD_VALUE', 'json_schema'],
    [{ response_format: { type: 'xml' } }, 'HYDRA_ERR_BAD_VALUE', 'response_format'],
    [{ response_format: 'json' }, 'HYDRA_ERR_BAD_VALUE', 'response_format'],
    [{ response_format: { type: 'json_schema' } }, 'HYDRA_ERR_BAD_VALUE', 'response_format'],
  ] as const)('%j is %s naming %s', (body, code, field) => {
    const e = rejection(() =>
      requestSettings(body as Record<string, unknown>, inForce, { jsonSchemaToGrammar: convert }),
    );
    expect([e.code, e.keys]).toEqual([code, [field]]);
  });

  it('refuses a schema when no converter is given, rather than ignoring it', () => {
    expect(rejection(() => requestSettings({ json_schema: schema }, inForce))).toMatchObject({
      code: 'HYDRA_ERR_UNSUPPORTED_FIELD',
      keys: ['json_schema'],
    });
  });
});

describe('checkSampler', () => {
  const failing = (message: string) => ({
    createSampler: () => {
      throw new Error(message);
    },
  });

  it('names the field whose value llama.cpp refused', () => {
    const g = rejection(() => checkSampler(failing('grammar failed to parse'), { grammar: 'x' }));
    expect([g.code, g.keys]).toEqual(['HYDRA_ERR_BAD_VALUE', ['grammar']]);
    const b = rejection(() =>
      checkSampler(
        failing('params.logitBias[0] must be ...'),
        { logitBias: [{ token: 1, bias: 1 }] },
        {
          grammar: 'g',
          logit_bias: 'sampling.logit_bias',
          samplers: 's',
        },
      ),
    );
    expect(b.keys).toEqual(['sampling.logit_bias']);
  });

  it('builds nothing for a chain without a grammar or biases', () => {
    expect(() => checkSampler(failing('never called'), { temp: 0 })).not.toThrow();
  });
});
