import { errorCode as code } from '@hydra-engine/test-kit';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { decodeSlotState, encodeSlotState } from '../src/core/slot-state.js';

const limits = { nVocab: 1000, nCtxSeq: 64 };

describe('slot-state codec', () => {
  it('round-trips tokens and KV bytes', () => {
    fc.assert(
      fc.property(
        fc.array(fc.integer({ min: 0, max: 999 }), { maxLength: 63 }),
        fc.uint8Array({ maxLength: 256 }),
        (toks, kv) => {
          const back = decodeSlotState(encodeSlotState(Int32Array.from(toks), kv), limits);
          expect([...back.tokens]).toEqual(toks);
          expect(Buffer.compare(back.kv, Buffer.from(kv))).toBe(0);
        },
      ),
    );
  });

  it('refuses anything else with HYDRA_ERR_STATE_INVALID, never another error', () => {
    const good = encodeSlotState(Int32Array.from([1, 2, 3]), new Uint8Array([9, 9]));
    const bad = (b: Buffer) => code(() => decodeSlotState(b, limits));
    expect(bad(Buffer.from('nope'))).toBe('HYDRA_ERR_STATE_INVALID');
    const v2 = Buffer.from(good);
    v2.writeUInt32LE(2, 4);
    expect(bad(v2)).toBe('HYDRA_ERR_STATE_INVALID');
    expect(bad(good.subarray(0, 16))).toBe('HYDRA_ERR_STATE_INVALID');
    expect(bad(encodeSlotState(new Int32Array(64), new Uint8Array(0)))).toBe('HYDRA_ERR_STATE_INVALID');
    expect(bad(encodeSlotState(Int32Array.from([1000]), new Uint8Array(0)))).toBe('HYDRA_ERR_STATE_INVALID');
    expect(bad(encodeSlotState(Int32Array.from([-1]), new Uint8Array(0)))).toBe('HYDRA_ERR_STATE_INVALID');
    fc.assert(
      fc.property(fc.uint8Array({ maxLength: 64 }), (bytes) => {
        const c = code(() => decodeSlotState(bytes, limits));
        expect(c === undefined || c === 'HYDRA_ERR_STATE_INVALID').toBe(true);
      }),
    );
  });
});
