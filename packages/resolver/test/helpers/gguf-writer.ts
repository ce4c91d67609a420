import { type GgmlTypeInfo, ggmlTypeByName } from '../../src/gguf/ggml-types.js';
import {
  type GgufKv,
  type GgufScalar,
  type GgufSource,
  GgufType,
  type GgufTypeId,
} from '../../src/gguf/reader.js';

/** A tensor to write: name, dims (ne) and ggml type name; data is zeros unless `withData`. */
export interface TensorSpec {
  name: string;
  dims: number[];
  type: string;
}

/** Metadata value with an explicit GGUF type, as the writer needs it. */
export type KvSpec = Omit<GgufKv, 'value'> & { value: GgufScalar | GgufScalar[] };

/** Shorthands for common metadata entries. */
export const kvU32 = (key: string, value: number): KvSpec => ({ key, type: GgufType.UINT32, value });
export const kvF32 = (key: string, value: number): KvSpec => ({ key, type: GgufType.FLOAT32, value });
export const kvStr = (key: string, value: string): KvSpec => ({ key, type: GgufType.STRING, value });
export const kvArr = (key: string, arrayType: GgufTypeId, value: GgufScalar[]): KvSpec => ({
  key,
  type: GgufType.ARRAY,
  arrayType,
  value,
});

class Bytes {
  #parts: Uint8Array[] = [];
  length = 0;
  push(b: Uint8Array): void {
    this.#parts.push(b);
    this.length += b.length;
  }
  u32(x: number): void {
    const b = new Uint8Array(4);
    new DataView(b.buffer).setUint32(0, x, true);
    this.push(b);
  }
  u64(x: number | bigint): void {
    const b = new Uint8Array(8);
    new DataView(b.buffer).setBigUint64(0, BigInt(x), true);
    this.push(b);
  }
  str(s: string): void {
    const e = new TextEncoder().encode(s);
    this.u64(e.length);
    this.push(e);
  }
  scalar(type: GgufTypeId, v: GgufScalar): void {
    const sizes: Record<number, number> = {
      0: 1,
      1: 1,
      2: 2,
      3: 2,
      4: 4,
      5: 4,
      6: 4,
      7: 1,
      10: 8,
      11: 8,
      12: 8,
    };
    if (type === GgufType.STRING) {
      this.str(v as string);
      return;
    }
    const b = new Uint8Array(sizes[type] as number);
    const d = new DataView(b.buffer);
    switch (type) {
      case GgufType.UINT8:
        d.setUint8(0, v as number);
        break;
      case GgufType.INT8:
        d.setInt8(0, v as number);
        break;
      case GgufType.UINT16:
        d.setUint16(0, v as number, true);
        break;
      case GgufType.INT16:
        d.setInt16(0, v as number, true);
        break;
      case GgufType.UINT32:
        d.setUint32(0, v as number, true);
        break;
      case GgufType.INT32:
        d.setInt32(0, v as number, true);
        break;
      case GgufType.FLOAT32:
        d.setFloat32(0, v as number, true);
        break;
      case GgufType.BOOL:
        d.setUint8(0, v ? 1 : 0);
        break;
      case GgufType.UINT64:
        d.setBigUint64(0, BigInt(v as number), true);
        break;
      case GgufType.INT64:
        d.setBigInt64(0, BigInt(v as number), true);
        break;
      case GgufType.FLOAT64:
        d.setFloat64(0, v as number, true);
        break;
      default:
        throw new Error(`bad type ${type}`);
    }
    this.push(b);
  }
  concat(): Uint8Array {
    const out = new Uint8Array(this.length);
    let o = 0;
    for (const p of this.#parts) {
      out.set(p, o);
      o += p.length;
    }
    return out;
  }
}

/**
 * A minimal GGUF v3 writer for tests: header, metadata, tensor table, and (optionally) a zero data
 * section. Without data the returned `size` still covers the data so the reader's bounds check holds.
 */
export function writeGguf(
  kv: KvSpec[],
  tensors: TensorSpec[],
  opts: { version?: number; alignment?: number; withData?: boolean } = {},
): { bytes: Uint8Array; size: number; source: GgufSource } {
  const alignment = opts.alignment ?? 32;
  const b = new Bytes();
  b.u32(0x46554747);
  b.u32(opts.version ?? 3);
  b.u64(tensors.length);
  b.u64(kv.length);
  for (const e of kv) {
    b.str(e.key);
    b.u32(e.type);
    if (e.type === GgufType.ARRAY) {
      const arr = e.value as GgufScalar[];
      b.u32(e.arrayType as number);
      b.u64(arr.length);
      for (const v of arr) b.scalar(e.arrayType as GgufTypeId, v);
    } else {
      b.scalar(e.type, e.value as GgufScalar);
    }
  }
  let offset = 0;
  for (const t of tensors) {
    const type = ggmlTypeByName(t.type) as GgmlTypeInfo;
    b.str(t.name);
    b.u32(t.dims.length);
    for (const d of t.dims) b.u64(d);
    b.u32(type.id);
    b.u64(offset);
    const n = t.dims.reduce((a, x) => a * x, 1);
    offset += Math.ceil(((n / type.blockSize) * type.typeSize) / alignment) * alignment;
  }
  const headerLen = b.length;
  const dataOffset = Math.ceil(headerLen / alignment) * alignment;
  if (opts.withData) b.push(new Uint8Array(dataOffset - headerLen + offset));
  const bytes = b.concat();
  const size = dataOffset + offset;
  const source: GgufSource = {
    size: opts.withData ? bytes.length : size,
    read: async (off, len) => bytes.subarray(off, Math.min(off + len, bytes.length)),
  };
  return { bytes, size, source };
}
