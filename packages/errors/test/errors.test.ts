import { describe, expect, it } from 'vitest';
import {
  defineErrors,
  documentedCodes,
  errorTableMismatch,
  HydraError,
  httpStatusOf,
  isHydraError,
  tableCodes,
  undocumentedCodes,
} from '../src/index.js';

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

describe('defineErrors', () => {
  const table = defineErrors({
    HYDRA_ERR_A: { status: 400, meaning: 'a bad input' },
    HYDRA_ERR_B: { status: 503, meaning: 'not ready' },
  });

  it('keeps each code with its status and meaning, frozen', () => {
    expect(table.HYDRA_ERR_B).toEqual({ status: 503, meaning: 'not ready' });
    expect(Object.isFrozen(table) && Object.isFrozen(table.HYDRA_ERR_A)).toBe(true);
    // Typed: a HydraError of this table's codes refuses another code at compile time.
    const e = new HydraError<keyof typeof table>('HYDRA_ERR_A', 'x');
    expect(e.code).toBe('HYDRA_ERR_A');
  });

  it('maps a declared code to its status and an undeclared one to 500', () => {
    expect(httpStatusOf(table, 'HYDRA_ERR_A')).toBe(400);
    expect(httpStatusOf(table, 'HYDRA_ERR_B')).toBe(503);
    expect(httpStatusOf(table, 'HYDRA_ERR_C')).toBe(500);
    expect(httpStatusOf(table, 'toString')).toBe(500);
  });

  it('refuses a code outside the convention, a status outside 400..599 and an empty meaning', () => {
    expect(() => defineErrors({ queue_full: { status: 429, meaning: 'x' } })).toThrow(TypeError);
    expect(() => defineErrors({ HYDRA_ERR_X: { status: 200, meaning: 'x' } })).toThrow(TypeError);
    expect(() => defineErrors({ HYDRA_ERR_X: { status: 400.5, meaning: 'x' } })).toThrow(TypeError);
    expect(() => defineErrors({ HYDRA_ERR_X: { status: 400, meaning: ' ' } })).toThrow(TypeError);
  });

  it('reports both directions of a table against the declared codes', () => {
    const md = '| `HYDRA_ERR_A` | 400 |\n| `HYDRA_ERR_Z` | 500 |\nprose: HYDRA_ERR_B';
    expect(errorTableMismatch(['HYDRA_ERR_A', 'HYDRA_ERR_B'], md)).toEqual({
      undocumented: ['HYDRA_ERR_B'],
      undeclared: ['HYDRA_ERR_Z'],
    });
  });

  it('reads the codes of a markdown table, not codes named in prose', () => {
    const md =
      '| code | HTTP |\n| --- | --- |\n| `HYDRA_ERR_A` | 400 |\n|`HYDRA_ERR_B`| 503 |\nsee `HYDRA_ERR_C`.';
    expect([...tableCodes(md)].sort()).toEqual(['HYDRA_ERR_A', 'HYDRA_ERR_B']);
  });
});
