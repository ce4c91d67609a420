import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { decodeBinaryFields } from '../src/codec.js';
import {
  decodePayload,
  encodeFrame,
  encodePayload,
  FrameReader,
  HEADER_BYTES,
  HydraError,
  isHydraOpcode,
} from '../src/index.js';

// msgpackr renames a `__proto__` key (prototype-pollution guard), so it is left out of round trips.
const key = fc.string().filter((k) => k !== '__proto__');
const jsonObject = fc.dictionary(key, fc.jsonValue({ noUnicodeString: false }), { maxKeys: 8 });

function codeOf(fn: () => unknown): string | undefined {
  try {
    fn();
    return undefined;
  } catch (err) {
    expect(err).toBeInstanceOf(HydraError);
    return (err as HydraError).code;
  }
}

describe('payload codec', () => {
  it('round-trips JSON objects', () => {
    fc.assert(
      fc.property(jsonObject, (value) => {
        const decoded = decodePayload(encodePayload(value, 'json'));
        expect(decoded.encoding).toBe('json');
        expect(decoded.value).toEqual(JSON.parse(JSON.stringify(value)));
      }),
    );
  });

  it('round-trips MessagePack maps, bytes included', () => {
    // msgpackr renames `__proto__` keys on decode (its prototype-pollution guard; see README), so
    // values holding one do not round-trip by design.
    const withBytes = fc
      .dictionary(key, fc.oneof(fc.jsonValue(), fc.uint8Array({ maxLength: 64 })), { maxKeys: 8 })
      .filter((v) => !JSON.stringify(v).includes('"__proto__"'));
    fc.assert(
      fc.property(withBytes, (value) => {
        const bytes = encodePayload(value, 'msgpack');
        const decoded = decodePayload(bytes);
        expect(decoded.encoding).toBe('msgpack');
        const expected = Object.fromEntries(
          Object.entries(value).map(([k, v]) => [k, v instanceof Uint8Array ? Buffer.from(v) : v]),
        );
        // -0 packs as integer 0; compare after the same normalisation JSON applies to numbers.
        expect(normaliseZero(decoded.value)).toEqual(normaliseZero(expected));
      }),
    );
  });

  it('carries binary fields as base64 in JSON and bin in MessagePack', () => {
    fc.assert(
      fc.property(
        fc.uint8Array({ maxLength: 300 }),
        fc.constantFrom('json' as const, 'msgpack' as const),
        (data, enc) => {
          const decoded = decodePayload(encodePayload({ offset: 0, data }, enc));
          if (enc === 'json') expect(decoded.value.data).toBe(Buffer.from(data).toString('base64'));
          const restored = decodeBinaryFields(decoded.value, ['data']);
          expect(Buffer.compare(restored.data as Buffer, Buffer.from(data))).toBe(0);
        },
      ),
    );
    expect(codeOf(() => decodeBinaryFields({ data: 'not base64!' }, ['data']))).toBe('HYDRA_ERR_BAD_VALUE');
    expect(codeOf(() => decodeBinaryFields({ data: 5 }, ['data']))).toBe('HYDRA_ERR_BAD_VALUE');
  });

  it('sniffs: empty is {}, leading spaces before { are JSON', () => {
    expect(decodePayload(Buffer.alloc(0))).toEqual({ encoding: 'json', value: {} });
    expect(decodePayload(Buffer.from(' \r\n\t{"a":1}'))).toEqual({ encoding: 'json', value: { a: 1 } });
    expect(decodePayload(Buffer.from([0x80]))).toEqual({ encoding: 'msgpack', value: {} });
  });

  it.each([
    ['a JSON array', Buffer.from('[1,2]')],
    ['JSON null', Buffer.from('null')],
    ['truncated JSON', Buffer.from('{"a":')],
    ['invalid UTF-8', Buffer.from([0x7b, 0x22, 0xff, 0x22, 0x3a, 0x31, 0x7d])],
    ['a MessagePack array', Buffer.from([0x91, 0x01])],
    ['truncated MessagePack', Buffer.from([0x81, 0xa1])],
    ['MessagePack with trailing bytes', Buffer.from([0x80, 0x01])],
    ['a bare string', Buffer.from('"x"')],
  ])('rejects %s with HYDRA_ERR_BAD_PAYLOAD', (_name, bytes) => {
    expect(codeOf(() => decodePayload(bytes))).toBe('HYDRA_ERR_BAD_PAYLOAD');
  });

  it('never throws anything but HYDRA_ERR_BAD_PAYLOAD on random bytes', () => {
    const prefixed = fc.oneof(
      fc.uint8Array({ maxLength: 64 }),
      fc.uint8Array({ maxLength: 64 }).map((b) => Buffer.concat([Buffer.from([0x7b]), b])),
      fc.uint8Array({ maxLength: 64 }).map((b) => Buffer.concat([Buffer.from([0x83]), b])),
      fc.uint8Array({ maxLength: 64 }).map((b) => Buffer.concat([Buffer.from([0xde, 0, 2]), b])),
    );
    fc.assert(
      fc.property(prefixed, (bytes) => {
        const code = codeOf(() => decodePayload(bytes));
        expect(code === undefined || code === 'HYDRA_ERR_BAD_PAYLOAD').toBe(true);
      }),
      { numRuns: 2000 },
    );
  });
});

describe('FrameReader', () => {
  const frameArb = fc.record({
    opcode: fc.integer({ min: 0x30, max: 0x46 }),
    payload: fc.uint8Array({ maxLength: 200 }),
  });

  it('reassembles frames from any split of the stream', () => {
    fc.assert(
      fc.property(
        fc.array(frameArb, { maxLength: 10 }),
        fc.array(fc.nat(), { maxLength: 20 }),
        (frames, cuts) => {
          const stream = Buffer.concat(frames.map((f) => encodeFrame(f.opcode, f.payload)));
          const points = [
            ...new Set(cuts.map((c) => (stream.byteLength === 0 ? 0 : c % stream.byteLength))),
          ].sort((a, b) => a - b);
          const reader = new FrameReader(1024, isHydraOpcode);
          const got: { opcode: number; payload: Buffer }[] = [];
          let from = 0;
          for (const to of [...points, stream.byteLength]) {
            reader.push(stream.subarray(from, to));
            from = to;
            for (let r = reader.next(); r.kind === 'frame'; r = reader.next()) got.push(r.frame);
          }
          expect(got.map((f) => f.opcode)).toEqual(frames.map((f) => f.opcode));
          for (const [i, f] of got.entries()) {
            expect(Buffer.compare(f.payload, Buffer.from(frames[i]!.payload))).toBe(0);
          }
          expect(reader.next()).toEqual({ kind: 'need-more', partial: false });
        },
      ),
    );
  });

  it('reports a partial header or payload, a frame over the limit, and a bad opcode', () => {
    const reader = new FrameReader(16, isHydraOpcode);
    reader.push(encodeFrame(0x31, Buffer.alloc(4)).subarray(0, 5));
    expect(reader.next()).toEqual({ kind: 'need-more', partial: true });
    reader.push(Buffer.alloc(HEADER_BYTES - 5 + 2));
    expect(reader.next()).toEqual({ kind: 'need-more', partial: true });

    const big = new FrameReader(16, isHydraOpcode);
    big.push(encodeFrame(0x40, Buffer.alloc(17)).subarray(0, HEADER_BYTES));
    expect(big.next()).toEqual({ kind: 'too-large', opcode: 0x40, length: 17n });

    const huge = new FrameReader(16, isHydraOpcode);
    const header = Buffer.alloc(HEADER_BYTES, 0xff);
    header[0] = 0x31;
    huge.push(header);
    expect(huge.next().kind).toBe('too-large');

    const bad = new FrameReader(16, isHydraOpcode);
    bad.push(Buffer.from([0x47]));
    expect(bad.next()).toEqual({ kind: 'bad-opcode', opcode: 0x47 });
  });
});

function normaliseZero(value: unknown): unknown {
  if (Object.is(value, -0)) return 0;
  if (Array.isArray(value)) return value.map(normaliseZero);
  if (value instanceof Uint8Array) return value;
  if (typeof value === 'object' && value !== null) {
    return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, normaliseZero(v)]));
  }
  return value;
}
