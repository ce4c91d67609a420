import { describe, expect, it } from 'vitest';
import { ConfigLayers, DeferralPolicy, defaults } from '../src/index.js';
import { code } from './codes.js';

describe('ConfigLayers', () => {
  it('merges defaults < startup < configure and keeps each source', () => {
    const layers = new ConfigLayers({
      n_ctx: 8192,
      cache_type_k: 'q8_0',
      port: 9000,
      sampling: { temp: 0.3 },
    });
    expect(layers.sourceOf('n_batch')).toBe('default');
    expect(layers.sourceOf('n_ctx')).toBe('startup');
    expect(layers.get('n_ctx')).toBe(8192);
    expect(layers.startOnly().port).toBe(9000);
    expect(layers.effective().port).toBeUndefined();

    const r = layers.configure({ n_ctx: 16384, sampling: { temp: 0.3 }, n_predict: 64 });
    expect(r.changes.map((c) => [c.key, c.from, c.to])).toEqual([
      ['n_predict', -1, 64],
      ['n_ctx', 8192, 16384],
    ]);
    expect(layers.sourceOf('n_ctx')).toBe('configure');
    // Same value as startup: not a change, so it keeps its startup source.
    expect(layers.sourceOf('sampling.temp')).toBe('startup');
    expect(layers.sourceOf('sampling.seed')).toBe('default');
    expect(layers.sourceOf('nope')).toBeUndefined();
    expect(layers.overrides()).toEqual({
      'sampling.temp': 0.3,
      n_predict: 64,
      n_ctx: 16384,
      cache_type_k: 'q8_0',
      port: 9000,
    });
    expect({ ...defaults(), ...layers.overrides(), port: undefined }).toEqual({
      ...layers.effective(),
      port: undefined,
    });
  });

  it('explains each value with all its layers', () => {
    const layers = new ConfigLayers({ cache_type_k: 'q8_0' });
    layers.configure({ cache_type_k: 'q4_0' });
    const row = layers.explain().find((r) => r.key === 'cache_type_k');
    expect(row).toEqual({
      key: 'cache_type_k',
      value: 'q4_0',
      source: 'configure',
      tier: 'T2',
      via: 'context',
      layers: { default: 'f16', startup: 'q8_0', configure: 'q4_0' },
    });
    expect(layers.explain({ overriddenOnly: true }).map((r) => r.key)).toEqual(['cache_type_k']);
    expect(layers.explain().some((r) => r.key === 'mmproj')).toBe(false);
    expect(layers.explain().find((r) => r.key === 'port')).toMatchObject({ tier: 'T4', source: 'default' });
  });

  it('accepts T4 at startup but never through configure, and rejects bad startup config whole', () => {
    const layers = new ConfigLayers({ host: '0.0.0.0' });
    expect(code(() => layers.configure({ host: '127.0.0.1' }))).toBe('HYDRA_ERR_T4_FIELD');
    expect(layers.startOnly().host).toBe('0.0.0.0');
    expect(code(() => new ConfigLayers({ n_ctx: -5 }))).toBe('HYDRA_ERR_BAD_VALUE');
    expect(code(() => new ConfigLayers({ n_ctxx: 5 }))).toBe('HYDRA_ERR_UNKNOWN_KEY');
    expect(code(() => new ConfigLayers({ mmproj: 'x' }))).toBe('HYDRA_ERR_UNSUPPORTED_FIELD');
  });

  it('records what a DeferralPolicy decision applied, once it applied', () => {
    const layers = new ConfigLayers({ n_ctx: 4096 });
    const policy = new DeferralPolicy({ drainTimeoutMs: 100, applied: layers.effective() });
    policy.slotBusy(0);
    const first = policy.configure({ n_ctx: 8192, seed: 1 }, 1).decision;
    layers.record(first.apply);
    expect([layers.sourceOf('seed'), layers.sourceOf('n_ctx')]).toEqual(['configure', 'startup']);
    layers.record(policy.slotFree(2).apply);
    expect(layers.get('n_ctx')).toBe(8192);
    expect(layers.effective()).toEqual(policy.applied);
  });

  it('does not let callers mutate its layers through returned values', () => {
    const layers = new ConfigLayers({ devices: ['a'] });
    (layers.get('devices') as string[]).push('b');
    (layers.effective().devices as string[]).push('c');
    expect(layers.get('devices')).toEqual(['a']);
  });
});
