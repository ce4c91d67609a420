import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { ggmlTypeByName, ggmlTypes, rowBytes } from '../src/gguf/ggml-types.js';
import { type GgufScalar, GgufType, type GgufTypeId, readGguf, readGgufFrom } from '../src/gguf/reader.js';
import { type KvSpec, kvArr, kvStr, kvU32, type TensorSpec, writeGguf } from './helpers/gguf-writer.js';

const f32 = (x: number) => Math.fround(x);

const scalarArb = (type: GgufTypeId): fc.Arbitrary<GgufScalar> => {
  switch (type) {
    case GgufType.UINT8:
      return fc.integer({ min: 0, max: 255 });
    case GgufType.INT8:
      return fc.integer({ min: -128, max: 127 });
    case GgufType.UINT16:
      return fc.integer({ min: 0, max: 65535 });
    case GgufType.INT16:
      return fc.integer({ min: -32768, max: 32767 });
    case GgufType.UINT32:
      return fc.integer({ min: 0, max: 2 ** 32 - 1 });
    case GgufType.INT32:
      return fc.integer({ min: -(2 ** 31), max: 2 ** 31 - 1 });
    case GgufType.FLOAT32:
      return fc.float({ noNaN: true }).map(f32);
    case GgufType.BOOL:
      return fc.boolean();
    case GgufType.STRING:
      return fc.string({ maxLength: 12, unit: 'grapheme' });
    case GgufType.UINT64:
      return fc
        .bigInt({ min: 0n, max: 2n ** 64n - 1n })
        .map((b) => (b <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(b) : b));
    case GgufType.INT64:
      return fc
        .bigInt({ min: -(2n ** 63n), max: 2n ** 63n - 1n })
        .map((b) =>
          b >= BigInt(Number.MIN_SAFE_INTEGER) && b <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(b) : b,
        );
    default:
      return fc.double({ noNaN: true });
  }
};
const SCALAR_TYPES: GgufTypeId[] = [0, 1, 2, 3, 4, 5, 6, 7, 8, 10, 11, 12];

const kvArb: fc.Arbitrary<KvSpec> = fc.oneof(
  fc
    .constantFrom(...SCALAR_TYPES)
    .chain((type) => scalarArb(type).map((value) => ({ key: '', type, value }))),
  fc
    .constantFrom(...SCALAR_TYPES)
    .chain((arrayType) =>
      fc
        .array(scalarArb(arrayType), { maxLength: 6 })
        .map((value) => ({ key: '', type: GgufType.ARRAY, arrayType, value })),
    ),
);
const tensorArb: fc.Arbitrary<Omit<TensorSpec, 'name'>> = fc
  .constantFrom(
    'f32',
    'f16',
    'bf16',
    'q4_0',
    'q4_1',
    'q5_0',
    'q5_1',
    'q8_0',
    'q2_k',
    'q3_k',
    'q4_k',
    'q5_k',
    'q6_k',
    'iq4_nl',
    'iq4_xs',
    'mxfp4',
  )
  .chain((type) => {
    const bs = (ggmlTypeByName(type) as { blockSize: number }).blockSize;
    return fc
      .tuple(
        fc.integer({ min: 1, max: 4 }),
        fc.array(fc.integer({ min: 1, max: 5 }), { minLength: 0, maxLength: 3 }),
      )
      .map(([blocks, rest]) => ({ type, dims: [blocks * bs, ...rest] }));
  });

describe('readGguf', () => {
  it('round-trips metadata of every type and tensor tables of every common ggml type', async () => {
    await fc.assert(
      fc.asyncProperty(
        fc.array(kvArb, { maxLength: 8 }),
        fc.array(tensorArb, { maxLength: 6 }),
        fc.constantFrom(1, 7, 64, 1 << 20),
        fc.constantFrom(8, 32, 64),
        async (kvs, ts, chunkSize, alignment) => {
          const kv = [kvU32('general.alignment', alignment), ...kvs.map((k, i) => ({ ...k, key: `k.${i}` }))];
          const tensors = ts.map((t, i) => ({ ...t, name: `t.${i}` }));
          const { source } = writeGguf(kv, tensors, { alignment, withData: true });
          const g = await readGguf(source, { chunkSize });
          expect(g.version).toBe(3);
          expect(g.alignment).toBe(alignment);
          expect(
            g.kv.map((e) => ({ key: e.key, type: e.type, arrayType: e.arrayType, value: e.value })),
          ).toEqual(kv.map((e) => ({ key: e.key, type: e.type, arrayType: e.arrayType, value: e.value })));
          expect(g.dataOffset % alignment).toBe(0);
          let expectedOffset = 0;
          for (const [i, t] of tensors.entries()) {
            const info = g.tensors[i];
            const type = ggmlTypeByName(t.type) as { blockSize: number; typeSize: number };
            const n = t.dims.reduce((a, x) => a * x, 1);
            expect(info?.name).toBe(t.name);
            expect(info?.dims).toEqual(t.dims);
            expect(info?.type.name).toBe(t.type);
            expect(info?.bytes).toBe((n / type.blockSize) * type.typeSize);
            expect(info?.offset).toBe(expectedOffset);
            expectedOffset += Math.ceil((info?.bytes as number) / alignment) * alignment;
          }
        },
      ),
      { numRuns: 150 },
    );
  });

  it('rejects every truncation of a valid file with HYDRA_ERR_GGUF_INVALID', async () => {
    const { bytes } = writeGguf(
      [kvStr('general.architecture', 'llama'), kvU32('llama.block_count', 2)],
      [{ name: 'a', dims: [32, 2], type: 'q8_0' }],
      { withData: true },
    );
    await fc.assert(
      // The last 28 bytes are alignment padding after the 68 data bytes, which a file may omit.
      fc.asyncProperty(fc.integer({ min: 0, max: bytes.length - 29 }), async (cut) => {
        const part = bytes.subarray(0, cut);
        await expect(
          readGguf({ size: part.length, read: async (o, l) => part.subarray(o, o + l) }),
        ).rejects.toMatchObject({
          code: 'HYDRA_ERR_GGUF_INVALID',
        });
      }),
    );
  });

  it('reads only the header and tensor table, never the tensor data', async () => {
    const { bytes } = writeGguf(
      [kvStr('general.architecture', 'x')],
      [{ name: 'big', dims: [4096, 4096], type: 'f32' }],
      {
        withData: true,
      },
    );
    let maxEnd = 0;
    const g = await readGguf(
      {
        size: bytes.length,
        read: async (o, l) => {
          maxEnd = Math.max(maxEnd, o + l);
          return bytes.subarray(o, o + l);
        },
      },
      { chunkSize: 256 },
    );
    expect(g.tensors[0]?.bytes).toBe(4096 * 4096 * 4);
    expect(maxEnd).toBeLessThanOrEqual(g.dataOffset + 256);
  });

  it('names unsupported versions, byte orders and tensor types', async () => {
    const good = writeGguf([], [{ name: 'a', dims: [32], type: 'q8_0' }], { withData: true }).bytes;
    const patch = (at: number, v: number) => {
      const b = good.slice();
      new DataView(b.buffer).setUint32(at, v, true);
      return { size: b.length, read: async (o: number, l: number) => b.subarray(o, o + l) };
    };
    await expect(readGguf(patch(4, 1))).rejects.toMatchObject({ code: 'HYDRA_ERR_GGUF_UNSUPPORTED' });
    await expect(readGguf(patch(0, 0x47475546))).rejects.toMatchObject({
      code: 'HYDRA_ERR_GGUF_UNSUPPORTED',
    });
    await expect(readGguf(patch(0, 0x12345678))).rejects.toMatchObject({ code: 'HYDRA_ERR_GGUF_INVALID' });
    // tensor type field: after header (24) + name (8 + 1) + n_dims (4) + ne (8)
    await expect(readGguf(patch(24 + 9 + 4 + 8, 4))).rejects.toMatchObject({
      code: 'HYDRA_ERR_GGUF_UNSUPPORTED',
    });
    await expect(readGguf({ size: -1, read: async () => new Uint8Array() })).rejects.toMatchObject({
      code: 'HYDRA_ERR_BAD_VALUE',
    });
  });

  it('rejects data past the end of the file and misaligned offsets', async () => {
    const { bytes } = writeGguf([], [{ name: 'a', dims: [64], type: 'f32' }], { withData: true });
    const short = bytes.subarray(0, bytes.length - 1);
    await expect(
      readGguf({ size: short.length, read: async (o, l) => short.subarray(o, o + l) }),
    ).rejects.toMatchObject({
      code: 'HYDRA_ERR_GGUF_INVALID',
    });
  });
});

describe('readGguf bounds what a header may declare', () => {
  it('refuses arrays and strings over the caps before building them, and validates the caps', async () => {
    const arr = writeGguf([kvArr('big.array', GgufType.UINT8, new Array(1000).fill(1))], []);
    await expect(readGguf(arr.source, { maxArrayLength: 999 })).rejects.toMatchObject({
      code: 'HYDRA_ERR_GGUF_INVALID',
    });
    expect((await readGguf(arr.source, { maxArrayLength: 1000 })).get('big.array')).toHaveLength(1000);
    const str = writeGguf([kvStr('long.string', 'x'.repeat(5000))], []);
    await expect(readGguf(str.source, { maxStringBytes: 4999 })).rejects.toMatchObject({
      code: 'HYDRA_ERR_GGUF_INVALID',
    });
    expect((await readGguf(str.source)).get('long.string')).toHaveLength(5000);
    for (const o of [{ maxArrayLength: 0 }, { maxStringBytes: 1.5 }]) {
      await expect(readGguf(str.source, o)).rejects.toMatchObject({ code: 'HYDRA_ERR_BAD_VALUE' });
    }
  });
});

describe('readGgufFrom', () => {
  it('closes the source once read, and when the read fails', async () => {
    const { bytes } = writeGguf(
      [kvStr('general.architecture', 'llama')],
      [{ name: 'a', dims: [32], type: 'f32' }],
      {
        withData: true,
      },
    );
    let closed = 0;
    const opener = (b: Uint8Array) => async () => ({
      size: b.length,
      read: async (o: number, l: number) => b.subarray(o, o + l),
      close: async () => {
        closed += 1;
      },
    });
    const g = await readGgufFrom(opener(bytes));
    expect(g.get('general.architecture')).toBe('llama');
    expect(closed).toBe(1);
    const broken = bytes.slice();
    broken[0] = 0; // magic
    await expect(readGgufFrom(opener(broken))).rejects.toMatchObject({ code: 'HYDRA_ERR_GGUF_INVALID' });
    expect(closed).toBe(2);
  });
});

describe('ggml types', () => {
  it('has the block sizes of ggml-common.h', () => {
    const sizes = Object.fromEntries(ggmlTypes().map((t) => [t.name, [t.blockSize, t.typeSize]]));
    expect(sizes).toMatchObject({
      f32: [1, 4],
      f16: [1, 2],
      bf16: [1, 2],
      q4_0: [32, 18],
      q4_1: [32, 20],
      q5_0: [32, 22],
      q5_1: [32, 24],
      q8_0: [32, 34],
      q2_k: [256, 84],
      q3_k: [256, 110],
      q4_k: [256, 144],
      q5_k: [256, 176],
      q6_k: [256, 210],
      iq4_nl: [32, 18],
      iq4_xs: [256, 136],
      mxfp4: [32, 17],
    });
    // q8_0 K of 1024 values per token: 32 blocks of 34 bytes, the 1088 B/token of the split-limit notes.
    expect(rowBytes(ggmlTypeByName('q8_0') as never, 1024)).toBe(1088);
  });
});
