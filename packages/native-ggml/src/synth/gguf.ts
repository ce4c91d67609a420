// GGUF v3 encoding (ggml/src/gguf.cpp is the reference): a header of key/value pairs and tensor
// infos, padded to `general.alignment`, then each tensor's bytes, each padded to the alignment.

import { type GgmlTypeInfo, GgufType, ggmlTypeById } from '@hydra-engine/resolver';

export const GGUF_MAGIC = 0x46554747; // "GGUF" read as a little-endian u32
export const GGUF_VERSION = 3;
export const GGUF_ALIGNMENT = 32;

/** gguf_type: the type tag of a metadata value (the reader's table in resolver). */
export const GgufValueType = GgufType;

/** ggml_type ids of the tensor types the generator writes. */
export const GgmlType = { F32: 0, F16: 1, Q4_0: 2, Q8_0: 8 } as const;
export type GgmlTypeId = (typeof GgmlType)[keyof typeof GgmlType];

/** ggml type traits of those types: elements and bytes per block, from resolver's one table. */
export const GGML_TYPE_TRAITS: Readonly<Record<GgmlTypeId, GgmlTypeInfo>> = Object.fromEntries(
  Object.entries(GgmlType).map(([name, id]) => {
    const info = ggmlTypeById(id);
    // The writer's names must be the reader's ids, or a written file would not read back.
    if (info?.name !== name.toLowerCase()) throw new Error(`ggml type ${name} is not id ${id}`);
    return [id, info];
  }),
) as Record<GgmlTypeId, GgmlTypeInfo>;

export type GgufValue =
  | { type: 'u32'; value: number }
  | { type: 'i32'; value: number }
  | { type: 'f32'; value: number }
  | { type: 'bool'; value: boolean }
  | { type: 'str'; value: string }
  | { type: 'arr_str'; value: readonly string[] }
  | { type: 'arr_i32'; value: Int32Array }
  | { type: 'arr_f32'; value: Float32Array };

export interface GgufTensorInfo {
  name: string;
  /** ggml order: ne[0] is the row length. */
  dims: readonly number[];
  type: GgmlTypeId;
}

export function padTo(n: number, alignment: number): number {
  return Math.ceil(n / alignment) * alignment;
}

export function tensorElements(dims: readonly number[]): number {
  return dims.reduce((a, b) => a * b, 1);
}

export function tensorBytes(info: GgufTensorInfo): number {
  const traits = GGML_TYPE_TRAITS[info.type];
  const ne0 = info.dims[0] ?? 1;
  if (ne0 % traits.blockSize !== 0) {
    throw new RangeError(`tensor ${info.name}: row of ${ne0} is not a multiple of ${traits.blockSize}`);
  }
  return (tensorElements(info.dims) / traits.blockSize) * traits.typeSize;
}

/** A growable little-endian byte writer for the header. */
class ByteWriter {
  #buf = Buffer.alloc(1 << 16);
  #len = 0;

  #ensure(n: number): void {
    if (this.#len + n <= this.#buf.length) return;
    let size = this.#buf.length * 2;
    while (size < this.#len + n) size *= 2;
    const next = Buffer.alloc(size);
    this.#buf.copy(next, 0, 0, this.#len);
    this.#buf = next;
  }

  u32(v: number): void {
    this.#ensure(4);
    this.#buf.writeUInt32LE(v, this.#len);
    this.#len += 4;
  }

  i32(v: number): void {
    this.#ensure(4);
    this.#buf.writeInt32LE(v, this.#len);
    this.#len += 4;
  }

  f32(v: number): void {
    this.#ensure(4);
    this.#buf.writeFloatLE(v, this.#len);
    this.#len += 4;
  }

  u64(v: number): void {
    this.#ensure(8);
    this.#buf.writeBigUInt64LE(BigInt(v), this.#len);
    this.#len += 8;
  }

  u8(v: number): void {
    this.#ensure(1);
    this.#buf[this.#len++] = v;
  }

  str(s: string): void {
    const bytes = Buffer.from(s, 'utf8');
    this.u64(bytes.length);
    this.bytes(bytes);
  }

  bytes(b: Uint8Array): void {
    this.#ensure(b.length);
    this.#buf.set(b, this.#len);
    this.#len += b.length;
  }

  zeros(n: number): void {
    this.#ensure(n);
    this.#buf.fill(0, this.#len, this.#len + n);
    this.#len += n;
  }

  get length(): number {
    return this.#len;
  }

  result(): Buffer {
    return this.#buf.subarray(0, this.#len);
  }
}

function writeValue(w: ByteWriter, v: GgufValue): void {
  switch (v.type) {
    case 'u32':
      w.u32(GgufValueType.UINT32);
      w.u32(v.value);
      return;
    case 'i32':
      w.u32(GgufValueType.INT32);
      w.i32(v.value);
      return;
    case 'f32':
      w.u32(GgufValueType.FLOAT32);
      w.f32(v.value);
      return;
    case 'bool':
      w.u32(GgufValueType.BOOL);
      w.u8(v.value ? 1 : 0);
      return;
    case 'str':
      w.u32(GgufValueType.STRING);
      w.str(v.value);
      return;
    case 'arr_str':
      w.u32(GgufValueType.ARRAY);
      w.u32(GgufValueType.STRING);
      w.u64(v.value.length);
      for (const s of v.value) w.str(s);
      return;
    case 'arr_i32':
      w.u32(GgufValueType.ARRAY);
      w.u32(GgufValueType.INT32);
      w.u64(v.value.length);
      w.bytes(new Uint8Array(v.value.buffer, v.value.byteOffset, v.value.byteLength));
      return;
    case 'arr_f32':
      w.u32(GgufValueType.ARRAY);
      w.u32(GgufValueType.FLOAT32);
      w.u64(v.value.length);
      w.bytes(new Uint8Array(v.value.buffer, v.value.byteOffset, v.value.byteLength));
      return;
  }
}

export interface GgufLayout {
  /** Header bytes including the padding up to the data section. */
  header: Buffer;
  /** Offset of each tensor relative to the data section, in the order given. */
  offsets: number[];
  /** Unpadded byte size of each tensor. */
  sizes: number[];
  /** Size of the data section, every tensor padded to the alignment. */
  dataBytes: number;
}

/**
 * Encodes the header of a GGUF v3 file. Typed arrays are copied in host byte order, which GGUF
 * (little-endian) matches on every platform Node supports in practice; the assertion keeps it so.
 */
export function encodeGgufHeader(
  kv: ReadonlyArray<readonly [string, GgufValue]>,
  tensors: readonly GgufTensorInfo[],
  alignment = GGUF_ALIGNMENT,
): GgufLayout {
  if (new Uint8Array(new Uint16Array([1]).buffer)[0] !== 1) {
    throw new Error('synthetic GGUF writing needs a little-endian host');
  }
  const w = new ByteWriter();
  w.u32(GGUF_MAGIC);
  w.u32(GGUF_VERSION);
  w.u64(tensors.length);
  w.u64(kv.length);
  for (const [key, value] of kv) {
    w.str(key);
    writeValue(w, value);
  }
  const offsets: number[] = [];
  const sizes: number[] = [];
  let offset = 0;
  for (const t of tensors) {
    const size = tensorBytes(t);
    w.str(t.name);
    w.u32(t.dims.length);
    for (const d of t.dims) w.u64(d);
    w.u32(t.type);
    w.u64(offset);
    offsets.push(offset);
    sizes.push(size);
    offset += padTo(size, alignment);
  }
  w.zeros(padTo(w.length, alignment) - w.length);
  return { header: w.result(), offsets, sizes, dataBytes: offset };
}
