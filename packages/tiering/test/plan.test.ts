import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { defaults, FIELDS, HydraError, normalize, type Params, plan } from '../src/index.js';
import { nest, RUNTIME, validDelta } from './arbitraries.js';

function rejection(fn: () => unknown): HydraError {
  try {
    fn();
  } catch (error) {
    expect(error).toBeInstanceOf(HydraError);
    return error as HydraError;
  }
  throw new Error('expected a rejection');
}

describe('plan', () => {
  it('plans the protocol.md CONFIGURE example', () => {
    const r = plan(defaults(), { sampling: { temp: 0.5, top_k: 40 }, seed: 42, n_ctx: 8192 });
    expect(r.tier).toBe('T2');
    expect(r.rebuild).toBe('context');
    expect(r.paramsApplied).toEqual({ 'sampling.temp': 0.5, 'sampling.top_k': 40, seed: 42, n_ctx: 8192 });
    // top_k 40 is the default: echoed but not a change.
    expect(r.changes.map((c) => [c.key, c.tier])).toEqual([
      ['sampling.temp', 'T1'],
      ['seed', 'T1'],
      ['n_ctx', 'T2'],
    ]);
    expect(r.contextKeys).toEqual(['n_ctx']);
    expect(r.modelKeys).toEqual([]);
    expect(r.next.n_ctx).toBe(8192);
    expect(r.legacy).toBe(false);
    expect(r.stateChunkSizeApplied).toBeUndefined();
  });

  it('plans a mixed-tier request with the highest tier and model keys', () => {
    const r = plan(defaults(), {
      sampling: { temp: 0.5, top_p: 0.9, top_k: 40, min_p: 0.05, penalty_repeat: 1.1 },
      seed: 42,
      n_predict: 500,
      state_chunk_size: 2097152,
      n_ctx: 65536,
      cache_type_k: 'q8_0',
      cache_type_v: 'q8_0',
      n_gpu_layers: 65,
      split_mode: 'layer',
      tensor_split: [25.0, 40.0],
    });
    expect(r.tier).toBe('T3');
    expect(r.rebuild).toBe('model');
    expect(r.modelKeys).toEqual(['n_gpu_layers', 'tensor_split']);
    expect(r.contextKeys).toEqual(['n_ctx', 'cache_type_k', 'cache_type_v']);
    expect(r.stateChunkSizeApplied).toBe(2097152);
  });

  it('says none, sampler or none-for-engine-settings for T1', () => {
    const d = defaults();
    expect(plan(d, {}).tier).toBe('none');
    expect(plan(d, { n_ctx: 0 }).tier).toBe('none');
    expect(plan(d, { n_ctx: 0 }).paramsApplied).toEqual({ n_ctx: 0 });
    const s = plan(d, { 'sampling.temp': 0.1 });
    expect([s.tier, s.rebuild]).toEqual(['T1', 'sampler']);
    const e = plan(d, { n_predict: 10 });
    expect([e.tier, e.rebuild]).toEqual(['T1', 'none']);
  });

  it('answers the legacy state_chunk_size payload with T1, clamping and the echo', () => {
    const d = defaults();
    const low = plan(d, { state_chunk_size: 1 });
    expect(low.tier).toBe('T1');
    expect(low.legacy).toBe(true);
    expect(low.paramsApplied).toEqual({ state_chunk_size: 65536 });
    expect(low.stateChunkSizeApplied).toBe(65536);
    const high = plan(d, { state_chunk_size: 2 ** 40 });
    expect(high.stateChunkSizeApplied).toBe(64 * 1024 * 1024);
    // Unchanged still answers T1, as protocol.md's legacy form says.
    const again = plan(high.next, { state_chunk_size: 2 ** 40 });
    expect([again.tier, again.changes, again.stateChunkSizeApplied]).toEqual(['T1', [], 64 * 1024 * 1024]);
    // Not legacy once another key comes along.
    const mixed = plan(high.next, { state_chunk_size: 2 ** 40, n_predict: -1 });
    expect([mixed.tier, mixed.legacy, mixed.stateChunkSizeApplied]).toEqual([
      'none',
      false,
      64 * 1024 * 1024,
    ]);
    expect(rejection(() => plan(d, { state_chunk_size: 1.5 })).code).toBe('HYDRA_ERR_BAD_VALUE');
    expect(rejection(() => plan(d, { state_chunk_size: '2' })).code).toBe('HYDRA_ERR_BAD_VALUE');
  });

  it('falls back to options.defaults, then registry defaults, for keys missing from applied', () => {
    expect(plan({}, { n_ctx: 4096 }, { defaults: { n_ctx: 4096 } }).tier).toBe('none');
    expect(plan({}, { n_ctx: 0 }).tier).toBe('none');
    expect(plan({}, { n_ctx: 4096 }).changes[0]).toMatchObject({ from: 0, to: 4096 });
  });

  it('coerces flash_attn booleans, seed -1, enum case and aliases', () => {
    expect(normalize({ flash_attn: true })).toEqual({ flash_attn: 'on' });
    expect(normalize({ flash_attn_type: false })).toEqual({ flash_attn: 'off' });
    expect(normalize({ seed: -1 })).toEqual({ seed: 0xffffffff });
    expect(normalize({ sampling: { seed: 7 } })).toEqual({ seed: 7 });
    expect(normalize({ cache_type_k: 'Q8_0' })).toEqual({ cache_type_k: 'q8_0' });
    expect(normalize({ tensor_buft_overrides: ['token_embd=CPU'] })).toEqual({
      override_tensors: ['token_embd=CPU'],
    });
    expect(normalize({ model: { path: '/m.gguf' } })).toEqual({ model: '/m.gguf' });
    expect(normalize({ n_threads: 4 })).toEqual({ 'cpuparams.n_threads': 4 });
    expect(normalize({ speculative: { draft: { model: 'd.gguf' } } })).toEqual({
      'speculative.model': 'd.gguf',
    });
    // Refused (no tree speculation), under the alias it was sent as.
    expect(rejection(() => normalize({ speculative: { draft: { p_split: 0.2 } } }))).toMatchObject({
      code: 'HYDRA_ERR_UNSUPPORTED_FIELD',
      keys: ['speculative.draft.p_split'],
    });
    expect(normalize({ seed: 3, sampling: { seed: 3 } })).toEqual({ seed: 3 });
  });

  it('rejects two spellings of one key with different values', () => {
    const e = rejection(() => normalize({ seed: 3, sampling: { seed: 4 } }));
    expect(e.code).toBe('HYDRA_ERR_BAD_VALUE');
    expect(e.keys).toEqual(['sampling.seed']);
  });

  it('lists every offender and picks the code by the documented order', () => {
    const d = defaults();
    const all = rejection(() =>
      plan(d, {
        port: 9000,
        'sampling.temp': 'hot',
        frobnicate: 1,
        mmproj: 'x.gguf',
        log_anything: true,
        sampling: { bogus: 1 },
        n_ctx: 8192,
      }),
    );
    expect(all.code).toBe('HYDRA_ERR_UNKNOWN_KEY');
    expect([...(all.keys ?? [])].sort()).toEqual(
      ['frobnicate', 'log_anything', 'mmproj', 'port', 'sampling.bogus', 'sampling.temp'].sort(),
    );
    expect(all.details?.byCode).toEqual({
      HYDRA_ERR_T4_FIELD: ['port', 'log_anything'],
      HYDRA_ERR_BAD_VALUE: ['sampling.temp'],
      HYDRA_ERR_UNKNOWN_KEY: ['frobnicate', 'sampling.bogus'],
      HYDRA_ERR_UNSUPPORTED_FIELD: ['mmproj'],
    });
    expect(rejection(() => plan(d, { port: 1, mmproj: 'x', n_ctx: -1 })).code).toBe('HYDRA_ERR_T4_FIELD');
    expect(rejection(() => plan(d, { mmproj: 'x', n_ctx: -1 })).code).toBe('HYDRA_ERR_UNSUPPORTED_FIELD');
    expect(rejection(() => plan(d, { n_ctx: -1 })).code).toBe('HYDRA_ERR_BAD_VALUE');
    expect(rejection(() => plan(d, { host: '0.0.0.0' })).code).toBe('HYDRA_ERR_T4_FIELD');
    expect(rejection(() => plan(d, { rpc_port: 50052 })).code).toBe('HYDRA_ERR_T4_FIELD');
    expect(rejection(() => plan(d, { api_key: 'k' })).code).toBe('HYDRA_ERR_T4_FIELD');
    expect(rejection(() => plan(d, { ssl_whatever: 'k' })).code).toBe('HYDRA_ERR_T4_FIELD');
  });

  it('rejects malformed values of formatted fields', () => {
    const d = defaults();
    const cases: [string, unknown][] = [
      ['override_tensors', ['no-equals-sign']],
      ['override_tensors', ['blk.(unclosed=CPU']],
      ['rpc_servers', ['localhost']],
      ['rpc_servers', ['localhost:70000']],
      ['kv_overrides', ['a=long:1']],
      ['split_mode', 'diagonal'],
      ['cache_type_v', 'q2_k'],
      ['tensor_split', [1, -1]],
      ['tensor_split', new Array(129).fill(1)],
      ['sampling.top_p', 1.5],
      ['sampling.temp', Number.NaN],
      ['n_gpu_layers', 1.5],
      ['devices', 'CUDA0'],
      ['use_mmap', 'true'],
      ['override_tensors', [1]],
      ['split_mode', 'tensor'],
      ['rope_scaling_type', 'longrope'],
      ['model', null],
      ['tensor_split', 'most'],
      ['n_gpu_layers', 'all'],
    ];
    for (const [key, value] of cases) {
      const e = rejection(() => plan(d, { [key]: value }));
      expect([key, e.code, e.keys]).toEqual([key, 'HYDRA_ERR_BAD_VALUE', [key]]);
    }
    expect(rejection(() => plan(d, [] as unknown as Params)).code).toBe('HYDRA_ERR_BAD_VALUE');
    expect(rejection(() => plan(d, 'x')).code).toBe('HYDRA_ERR_BAD_VALUE');
  });

  it('takes "auto" for tensor_split and n_gpu_layers (the engine planner chooses), T3 like their values', () => {
    const r = plan(defaults(), { tensor_split: 'AUTO', n_gpu_layers: 'auto' });
    expect(r.paramsApplied).toMatchObject({ tensor_split: 'auto', n_gpu_layers: 'auto' });
    expect([r.tier, r.rebuild]).toEqual(['T3', 'model']);
    // Other strings are still refused, and "auto" is no value for keys without the option.
    expect(rejection(() => plan(defaults(), { main_gpu: 'auto' })).code).toBe('HYDRA_ERR_BAD_VALUE');
    expect(rejection(() => plan(defaults(), { tensor_split: 'auto,1' })).keys).toEqual(['tensor_split']);
  });

  it('treats __proto__ and constructor as unknown keys', () => {
    const e = rejection(() => plan(defaults(), JSON.parse('{"__proto__": {"n_ctx": 1}, "constructor": 1}')));
    expect(e.code).toBe('HYDRA_ERR_UNKNOWN_KEY');
    expect(e.keys).toEqual(['__proto__', 'constructor']);
  });

  it('shares no objects with its inputs', () => {
    const applied = defaults();
    const delta = { override_tensors: ['a=CPU'], tensor_split: [1, 2] };
    const r = plan(applied, delta);
    delta.override_tensors.push('b=CPU');
    (r.next.tensor_split as number[]).push(3);
    expect(r.paramsApplied.override_tensors).toEqual(['a=CPU']);
    expect(applied.tensor_split).toEqual([]);
    expect(r.changes.find((c) => c.key === 'tensor_split')!.to).toEqual([1, 2]);
  });
});

describe('plan properties', () => {
  const INVALID = fc.oneof(
    fc.constantFrom('frobnicate', 'sampling.nope', 'speculative.bogus').map((k) => [k, 1] as const),
    fc
      .constantFrom('port', 'rpc_port', 'host', 'hostname', 'n_threads_http', 'log_file', 'ssl_file_key')
      .map((k) => [k, 1] as const),
    fc
      .constantFrom(...FIELDS.filter((f) => f.unsupported !== undefined).map((f) => f.key))
      .map((k) => [k, 'x'] as const),
    fc
      .constantFrom(...RUNTIME.filter((f) => f.type.kind !== 'map').map((f) => f.key))
      .map((k) => [k, { not: 'a value' }] as const),
  );

  it('is atomic: any invalid key rejects the whole delta, lists it, and changes nothing', () => {
    fc.assert(
      fc.property(validDelta(), fc.array(INVALID, { minLength: 1, maxLength: 3 }), (good, bad) => {
        const applied = defaults();
        const before = structuredClone(applied);
        const delta: Params = { ...good };
        for (const [k, v] of bad) delta[k] = v;
        const e = rejection(() => plan(applied, delta));
        expect([
          'HYDRA_ERR_UNKNOWN_KEY',
          'HYDRA_ERR_T4_FIELD',
          'HYDRA_ERR_UNSUPPORTED_FIELD',
          'HYDRA_ERR_BAD_VALUE',
        ]).toContain(e.code);
        // A nested object under a struct name (`model: {...}`) is reported by its dotted inner key.
        for (const [k] of bad) expect(e.keys!.some((o) => o === k || o.startsWith(`${k}.`))).toBe(true);
        expect(applied).toEqual(before);
      }),
      { numRuns: 300 },
    );
  });

  it('is idempotent: planning the same delta against its own result changes nothing', () => {
    fc.assert(
      fc.property(validDelta(), (delta) => {
        const first = plan(defaults(), delta);
        const second = plan(first.next, delta);
        expect(second.changes).toEqual([]);
        if (!second.legacy) expect(second.tier).toBe('none');
        expect(second.next).toEqual(first.next);
        expect(second.paramsApplied).toEqual(first.paramsApplied);
      }),
      { numRuns: 300 },
    );
  });

  it('plans nested and dotted forms the same', () => {
    fc.assert(
      fc.property(validDelta(), (delta) => {
        const applied = defaults();
        expect(plan(applied, nest(delta))).toEqual(plan(applied, delta));
      }),
      { numRuns: 300 },
    );
  });

  it('reports as tier the highest tier among changed keys, and diffs exactly the changed keys', () => {
    fc.assert(
      fc.property(validDelta(), validDelta(), (a, b) => {
        const start = plan(defaults(), a).next;
        const r = plan(start, b);
        const rank = { none: 0, T1: 1, T2: 2, T3: 3 } as const;
        const highest = r.changes.reduce((m, c) => Math.max(m, rank[c.tier]), 0);
        if (!r.legacy) expect(rank[r.tier]).toBe(highest);
        for (const [k, v] of Object.entries(r.paramsApplied)) expect(r.next[k]).toEqual(v);
        for (const k of Object.keys(start)) {
          if (!r.changes.some((c) => c.key === k)) expect(r.next[k]).toEqual(start[k]);
        }
      }),
      { numRuns: 200 },
    );
  });
});
