/**
 * ggml tensor types as GGUF files number them (ggml.h `enum ggml_type`), with the block size in
 * elements and the bytes per block (ggml.c `type_traits`, ggml-common.h block structs). Row and
 * tensor sizes follow ggml_row_size: ne0 / blockSize * typeSize.
 */
export interface GgmlTypeInfo {
  readonly id: number;
  readonly name: string;
  readonly blockSize: number;
  readonly typeSize: number;
}

const TABLE: readonly GgmlTypeInfo[] = [
  { id: 0, name: 'f32', blockSize: 1, typeSize: 4 },
  { id: 1, name: 'f16', blockSize: 1, typeSize: 2 },
  { id: 2, name: 'q4_0', blockSize: 32, typeSize: 18 },
  { id: 3, name: 'q4_1', blockSize: 32, typeSize: 20 },
  { id: 6, name: 'q5_0', blockSize: 32, typeSize: 22 },
  { id: 7, name: 'q5_1', blockSize: 32, typeSize: 24 },
  { id: 8, name: 'q8_0', blockSize: 32, typeSize: 34 },
  { id: 9, name: 'q8_1', blockSize: 32, typeSize: 36 },
  { id: 10, name: 'q2_k', blockSize: 256, typeSize: 84 },
  { id: 11, name: 'q3_k', blockSize: 256, typeSize: 110 },
  { id: 12, name: 'q4_k', blockSize: 256, typeSize: 144 },
  { id: 13, name: 'q5_k', blockSize: 256, typeSize: 176 },
  { id: 14, name: 'q6_k', blockSize: 256, typeSize: 210 },
  { id: 15, name: 'q8_k', blockSize: 256, typeSize: 292 },
  { id: 16, name: 'iq2_xxs', blockSize: 256, typeSize: 66 },
  { id: 17, name: 'iq2_xs', blockSize: 256, typeSize: 74 },
  { id: 18, name: 'iq3_xxs', blockSize: 256, typeSize: 98 },
  { id: 19, name: 'iq1_s', blockSize: 256, typeSize: 50 },
  { id: 20, name: 'iq4_nl', blockSize: 32, typeSize: 18 },
  { id: 21, name: 'iq3_s', blockSize: 256, typeSize: 110 },
  { id: 22, name: 'iq2_s', blockSize: 256, typeSize: 82 },
  { id: 23, name: 'iq4_xs', blockSize: 256, typeSize: 136 },
  { id: 24, name: 'i8', blockSize: 1, typeSize: 1 },
  { id: 25, name: 'i16', blockSize: 1, typeSize: 2 },
  { id: 26, name: 'i32', blockSize: 1, typeSize: 4 },
  { id: 27, name: 'i64', blockSize: 1, typeSize: 8 },
  { id: 28, name: 'f64', blockSize: 1, typeSize: 8 },
  { id: 29, name: 'iq1_m', blockSize: 256, typeSize: 56 },
  { id: 30, name: 'bf16', blockSize: 1, typeSize: 2 },
  { id: 34, name: 'tq1_0', blockSize: 256, typeSize: 54 },
  { id: 35, name: 'tq2_0', blockSize: 256, typeSize: 66 },
  { id: 39, name: 'mxfp4', blockSize: 32, typeSize: 17 },
  { id: 40, name: 'nvfp4', blockSize: 64, typeSize: 36 },
  { id: 41, name: 'q1_0', blockSize: 128, typeSize: 18 },
  { id: 42, name: 'q2_0', blockSize: 64, typeSize: 18 },
];

const BY_ID = new Map(TABLE.map((t) => [t.id, t]));
const BY_NAME = new Map(TABLE.map((t) => [t.name, t]));

/** The ggml type with this GGUF id, or undefined for ids this version does not know. */
export function ggmlTypeById(id: number): GgmlTypeInfo | undefined {
  return BY_ID.get(id);
}

/** The ggml type named as llama.cpp's `--cache-type-k` spells it (`q8_0`, `f16`, `Q6_K` ...). */
export function ggmlTypeByName(name: string): GgmlTypeInfo | undefined {
  return BY_NAME.get(name.toLowerCase());
}

/** Every known ggml type. */
export function ggmlTypes(): readonly GgmlTypeInfo[] {
  return TABLE;
}

/** KV cache types llama.cpp accepts for `cache_type_k` / `cache_type_v` (common/arg.cpp). */
export const KV_CACHE_TYPES = [
  'f32',
  'f16',
  'bf16',
  'q8_0',
  'q4_0',
  'q4_1',
  'iq4_nl',
  'q5_0',
  'q5_1',
] as const;

/** Bytes of `n` elements of a type, as ggml_row_size computes them (n must be a whole number of blocks). */
export function rowBytes(type: GgmlTypeInfo, n: number): number {
  return (n / type.blockSize) * type.typeSize;
}
