import { defaults, FIELDS } from '@hydra-engine/tiering';
import { describe, expect, it } from 'vitest';
import { ConfigReader, contextParamsFrom, modelParamsFrom, samplerParamsFrom } from '../src/core/params.js';

// The native specs are read through the registry's types (issue 20: no casts at the boundary).
const codeOf = (f: () => unknown) => {
  try {
    f();
    return 'none';
  } catch (e) {
    return (e as { code?: string }).code;
  }
};

describe('ConfigReader', () => {
  it('builds the three specs from the defaults', () => {
    const d = defaults();
    expect(modelParamsFrom(d, '/m.gguf')).toMatchObject({ path: '/m.gguf', splitMode: 'layer' });
    expect(contextParamsFrom(d)).toMatchObject({ flashAttn: 'auto' });
    expect(samplerParamsFrom(d).samplers).toEqual(d['sampling.samplers']);
  });

  it('refuses a value of another type than the registry says, naming the key', () => {
    expect(codeOf(() => contextParamsFrom({ ...defaults(), n_ctx: '4096' }))).toBe('HYDRA_ERR_INTERNAL');
    expect(() => new ConfigReader({ n_ctx: '4096' }).num('n_ctx')).toThrow(/n_ctx/);
    expect(codeOf(() => new ConfigReader({ split_mode: 'diagonal' }).str('split_mode'))).toBe('none');
    expect(codeOf(() => modelParamsFrom({ ...defaults(), split_mode: 'diagonal' }, '/m'))).toBe(
      'HYDRA_ERR_INTERNAL',
    );
    // An "auto" value the planner has not resolved yet is no offload count.
    expect(codeOf(() => modelParamsFrom({ ...defaults(), n_gpu_layers: 'auto' }, '/m'))).toBe(
      'HYDRA_ERR_INTERNAL',
    );
  });

  it('refuses a read as another type than the registry has, or of an alias', () => {
    expect(() => new ConfigReader({}).bool('n_ctx')).toThrow(/n_ctx is int in the registry/);
    expect(codeOf(() => new ConfigReader({}).int('ngl'))).toBe('HYDRA_ERR_INTERNAL');
    expect(codeOf(() => new ConfigReader({}).int('no_such_key'))).toBe('HYDRA_ERR_INTERNAL');
  });

  it('refuses an enum read whose native values miss one of the registry', () => {
    expect(() => new ConfigReader({}).oneOf('split_mode', ['none', 'layer'])).toThrow(/has no row/);
    // Every enum key of the registry that a spec reads is covered by its native type (the specs
    // above read them all from the defaults without throwing); an absent key reads as undefined.
    expect(new ConfigReader({}).oneOf('flash_attn', ['auto', 'on', 'off'])).toBeUndefined();
    expect(FIELDS.some((f) => f.key === 'pooling_type')).toBe(true);
  });
});
