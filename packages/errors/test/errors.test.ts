import { describe, expect, it } from 'vitest';
import { documentedCodes, HydraError, isHydraError, undocumentedCodes } from '../src/index.js';

describe('HydraError', () => {
  it('keeps code, keys and details and serialises to the wire shape', () => {
    const err = new HydraError('HYDRA_ERR_T4_FIELD', 'port is start-only', { keys: ['port'] });
    expect(err.code).toBe('HYDRA_ERR_T4_FIELD');
    expect(err.name).toBe('HydraError');
    expect(err).toBeInstanceOf(Error);
    expect(err.toJSON()).toEqual({
      code: 'HYDRA_ERR_T4_FIELD',
      message: 'port is start-only',
      keys: ['port'],
    });
    expect(isHydraError(err)).toBe(true);
    expect(isHydraError({ code: 'ENOENT', message: 'x' })).toBe(false);
  });

  it('names subclasses after themselves', () => {
    class QueueFullError extends HydraError {}
    expect(new QueueFullError('HYDRA_ERR_QUEUE_FULL', 'full').name).toBe('QueueFullError');
  });

  it('rejects codes outside the convention', () => {
    expect(() => new HydraError('queue_full', 'x')).toThrow(TypeError);
  });

  it('finds documented and undocumented codes in markdown', () => {
    const md = '| `HYDRA_ERR_A` | a |\nsee HYDRA_ERR_B_2.';
    expect([...documentedCodes(md)].sort()).toEqual(['HYDRA_ERR_A', 'HYDRA_ERR_B_2']);
    expect(undocumentedCodes(['HYDRA_ERR_A', 'HYDRA_ERR_C'], md)).toEqual(['HYDRA_ERR_C']);
  });
});
