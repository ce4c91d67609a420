import { fail } from '../errors.js';
import { type GgmlTypeInfo, ggmlTypeById } from './ggml-types.js';

/** Reads `length` bytes at `offset` of the file; may return fewer only at the end of the file. */
export type ByteReader = (offset: number, length: number) => Promise<Uint8Array>;

/** A GGUF file as the reader sees it: a byte reader and the file size in bytes. */
export interface GgufSource {
  readonly read: ByteReader;
  readonly size: number;
}

/** A source that holds a resource (a file handle) to release once it has been read. */
export interface ClosableGgufSource extends GgufSource {
  close(): Promise<void>;
}

/** GGUF metadata value types (gguf.h `enum gguf_type`). */
export const GgufType = {
  UINT8: 0,
  INT8: 1,
  UINT16: 2,
  INT16: 3,
  UINT32: 4,
  INT32: 5,
  FLOAT32: 6,
  BOOL: 7,
  STRING: 8,
  ARRAY: 9,
  UINT64: 10,
  INT64: 11,
  FLOAT64: 12,
} as const;
export type GgufTypeId = (typeof GgufType)[keyof typeof GgufType];

/** A scalar value; 64-bit integers outside the safe range stay bigint. */
export type GgufScalar = number | bigint | boolean | string;
export type GgufValue = GgufScalar | GgufScalar[];

/** One metadata entry. `arrayType` is the element type when `type` is ARRAY. */
export interface GgufKv {
  readonly key: string;
  readonly type: GgufTypeId;
  readonly arrayType?: GgufTypeId;
  readonly value: GgufValue;
}

/** One tensor of the tensor table; `offset` is relative to the data section. */
export interface GgufTensorInfo {
  readonly name: string;
  readonly dims: readonly number[];
  readonly type: GgmlTypeInfo;
  readonly offset: number;
  readonly bytes: number;
}

/** Header, metadata and tensor table of a GGUF file (no tensor data is read). */
export interface GgufFile {
  readonly version: number;
  readonly alignment: number;
  readonly kv: readonly GgufKv[];
  readonly tensors: readonly GgufTensorInfo[];
  /** Absolute offset of the data section. */
  readonly dataOffset: number;
  /** The metadata value of `key`, or undefined. */
  get(key: string): GgufValue | undefined;
}

/** Options of {@link readGguf}. */
export interface ReadGgufOptions {
  /** Bytes fetched per read call (default 1 MiB). */
  chunkSize?: number;
  /** Reject a file whose tensor data would extend past `size` (default true). */
  checkDataBounds?: boolean;
  /**
   * Longest metadata array (elements) and string (bytes) accepted (default 2^24 and 2^26): a
   * header may declare any length the file's size allows, and each element becomes a JS value.
   * Real vocabularies and merge lists stay well below 2^24 entries.
   */
  maxArrayLength?: number;
  maxStringBytes?: number;
}

const MAGIC = 0x46554747; // "GGUF" read as little-endian u32
const DEFAULT_ALIGNMENT = 32;
const MAX_DIMS = 4;
const SCALAR_SIZES: Record<number, number> = {
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

/**
 * Reads the header, the metadata and the tensor table of a GGUF v2/v3 file through an injected
 * byte reader, fetching only the bytes it parses. Malformed input throws HYDRA_ERR_GGUF_INVALID;
 * a version or tensor type this reader does not know throws HYDRA_ERR_GGUF_UNSUPPORTED.
 */
export async function readGguf(source: GgufSource, options: ReadGgufOptions = {}): Promise<GgufFile> {
  if (typeof source?.read !== 'function') fail('HYDRA_ERR_BAD_VALUE', 'source.read must be a function');
  if (!Number.isSafeInteger(source.size) || source.size < 0) {
    fail('HYDRA_ERR_BAD_VALUE', 'source.size must be a non-negative integer');
  }
  const chunkSize = options.chunkSize ?? 1 << 20;
  if (!Number.isSafeInteger(chunkSize) || chunkSize <= 0) {
    fail('HYDRA_ERR_BAD_VALUE', 'options.chunkSize must be a positive integer');
  }
  const limit = (key: 'maxArrayLength' | 'maxStringBytes', dflt: number): number => {
    const v = options[key] ?? dflt;
    if (!Number.isSafeInteger(v) || v <= 0)
      fail('HYDRA_ERR_BAD_VALUE', `options.${key} must be a positive integer`);
    return v;
  };
  const maxArray = limit('maxArrayLength', 1 << 24);
  const c = new Cursor(source, chunkSize, limit('maxStringBytes', 1 << 26));

  const magic = await c.u32();
  if (magic !== MAGIC) {
    if (magic === 0x47475546) fail('HYDRA_ERR_GGUF_UNSUPPORTED', 'big-endian GGUF files are not supported');
    fail('HYDRA_ERR_GGUF_INVALID', 'not a GGUF file (bad magic)');
  }
  const version = await c.u32();
  if (version !== 2 && version !== 3) {
    fail('HYDRA_ERR_GGUF_UNSUPPORTED', `GGUF version ${version} is not supported (2 and 3 are)`, {
      details: { version },
    });
  }
  const nTensors = await c.count('tensor count', 8 + 4 + 4 + 8);
  const nKv = await c.count('metadata count', 8 + 4);

  const kv: GgufKv[] = [];
  const byKey = new Map<string, GgufValue>();
  for (let i = 0; i < nKv; i++) {
    const key = await c.string();
    if (byKey.has(key)) fail('HYDRA_ERR_GGUF_INVALID', `duplicate metadata key ${JSON.stringify(key)}`);
    const type = await c.u32();
    if (type === GgufType.ARRAY) {
      const arrayType = await c.u32();
      if (arrayType === GgufType.ARRAY || !(arrayType in SCALAR_SIZES || arrayType === GgufType.STRING)) {
        fail('HYDRA_ERR_GGUF_INVALID', `metadata ${key}: bad array element type ${arrayType}`);
      }
      const n = await c.count(`metadata ${key} array length`, SCALAR_SIZES[arrayType] ?? 8);
      if (n > maxArray) {
        fail(
          'HYDRA_ERR_GGUF_INVALID',
          `metadata ${key}: array of ${n} elements is over the ${maxArray} accepted`,
        );
      }
      const values: GgufScalar[] = new Array(n);
      for (let j = 0; j < n; j++) values[j] = await c.scalar(arrayType as GgufTypeId, key);
      kv.push({ key, type, arrayType: arrayType as GgufTypeId, value: values });
      byKey.set(key, values);
    } else {
      if (!(type in SCALAR_SIZES || type === GgufType.STRING)) {
        fail('HYDRA_ERR_GGUF_INVALID', `metadata ${key}: bad value type ${type}`);
      }
      const value = await c.scalar(type as GgufTypeId, key);
      kv.push({ key, type: type as GgufTypeId, value });
      byKey.set(key, value);
    }
  }

  let alignment = DEFAULT_ALIGNMENT;
  const alignValue = byKey.get('general.alignment');
  if (alignValue !== undefined) {
    if (typeof alignValue !== 'number' || alignValue <= 0 || (alignValue & (alignValue - 1)) !== 0) {
      fail('HYDRA_ERR_GGUF_INVALID', 'general.alignment must be a power of two');
    }
    alignment = alignValue;
  }

  const tensors: GgufTensorInfo[] = [];
  const names = new Set<string>();
  for (let i = 0; i < nTensors; i++) {
    const name = await c.string();
    if (names.has(name)) fail('HYDRA_ERR_GGUF_INVALID', `duplicate tensor name ${JSON.stringify(name)}`);
    names.add(name);
    const nDims = await c.u32();
    if (nDims < 1 || nDims > MAX_DIMS) fail('HYDRA_ERR_GGUF_INVALID', `tensor ${name}: ${nDims} dimensions`);
    const dims: number[] = [];
    let elements = 1;
    for (let d = 0; d < nDims; d++) {
      const ne = await c.u64();
      if (ne > BigInt(Number.MAX_SAFE_INTEGER))
        fail('HYDRA_ERR_GGUF_INVALID', `tensor ${name}: dimension too large`);
      dims.push(Number(ne));
      elements *= Number(ne);
      if (!Number.isSafeInteger(elements))
        fail('HYDRA_ERR_GGUF_INVALID', `tensor ${name}: too many elements`);
    }
    const typeId = await c.u32();
    const type = ggmlTypeById(typeId);
    if (type === undefined) {
      fail('HYDRA_ERR_GGUF_UNSUPPORTED', `tensor ${name}: unknown ggml type ${typeId}`, {
        details: { typeId },
      });
    }
    if ((dims[0] as number) % type.blockSize !== 0) {
      fail(
        'HYDRA_ERR_GGUF_INVALID',
        `tensor ${name}: row of ${dims[0]} is not a multiple of ${type.blockSize}`,
      );
    }
    const offset = Number(await c.u64());
    if (!Number.isSafeInteger(offset) || offset % alignment !== 0) {
      fail('HYDRA_ERR_GGUF_INVALID', `tensor ${name}: offset ${offset} is not aligned to ${alignment}`);
    }
    tensors.push({ name, dims, type, offset, bytes: (elements / type.blockSize) * type.typeSize });
  }
  const dataOffset = Math.ceil(c.position / alignment) * alignment;

  if (options.checkDataBounds ?? true) {
    for (const t of tensors) {
      if (dataOffset + t.offset + t.bytes > source.size) {
        fail('HYDRA_ERR_GGUF_INVALID', `tensor ${t.name}: data extends past the end of the file`);
      }
    }
  }

  return {
    version,
    alignment,
    kv,
    tensors,
    dataOffset,
    get: (key: string) => byKey.get(key),
  };
}

class Cursor {
  readonly #source: GgufSource;
  readonly #chunkSize: number;
  #buf = new Uint8Array(0);
  #view = new DataView(this.#buf.buffer);
  #bufStart = 0;
  #pos = 0;
  readonly #decoder = new TextDecoder('utf-8', { fatal: true });

  readonly #maxString: number;

  constructor(source: GgufSource, chunkSize: number, maxString: number) {
    this.#source = source;
    this.#chunkSize = chunkSize;
    this.#maxString = maxString;
  }

  get position(): number {
    return this.#pos;
  }

  /** Makes `n` bytes at the position available; returns their index in the buffer. */
  async #need(n: number): Promise<number> {
    if (this.#pos + n > this.#source.size) fail('HYDRA_ERR_GGUF_INVALID', 'GGUF file is truncated');
    const rel = this.#pos - this.#bufStart;
    if (rel + n <= this.#buf.length) return rel;
    const kept = this.#buf.subarray(rel);
    const want = Math.min(
      Math.max(this.#chunkSize, n - kept.length),
      this.#source.size - this.#pos - kept.length,
    );
    const got = await this.#source.read(this.#pos + kept.length, want);
    if (!(got instanceof Uint8Array)) fail('HYDRA_ERR_BAD_VALUE', 'source.read must resolve to a Uint8Array');
    const fresh = got.subarray(0, want);
    if (kept.length + fresh.length < n) fail('HYDRA_ERR_GGUF_INVALID', 'GGUF file is truncated');
    const next = new Uint8Array(kept.length + fresh.length);
    next.set(kept, 0);
    next.set(fresh, kept.length);
    this.#buf = next;
    this.#view = new DataView(next.buffer);
    this.#bufStart = this.#pos;
    return 0;
  }

  async u32(): Promise<number> {
    const i = await this.#need(4);
    this.#pos += 4;
    return this.#view.getUint32(i, true);
  }

  async u64(): Promise<bigint> {
    const i = await this.#need(8);
    this.#pos += 8;
    return this.#view.getBigUint64(i, true);
  }

  /** A u64 count whose items take at least `minItemBytes` each: bounded by the bytes left. */
  async count(what: string, minItemBytes: number): Promise<number> {
    const n = await this.u64();
    if (n * BigInt(minItemBytes) > BigInt(this.#source.size - this.#pos)) {
      fail('HYDRA_ERR_GGUF_INVALID', `${what} ${n} does not fit in the file`);
    }
    return Number(n);
  }

  async string(): Promise<string> {
    const len = await this.count('string length', 1);
    if (len > this.#maxString)
      fail('HYDRA_ERR_GGUF_INVALID', `string of ${len} bytes is over the ${this.#maxString} accepted`);
    const i = await this.#need(len);
    this.#pos += len;
    try {
      return this.#decoder.decode(this.#buf.subarray(i, i + len));
    } catch (cause) {
      return fail('HYDRA_ERR_GGUF_INVALID', 'string is not valid UTF-8', { cause });
    }
  }

  async scalar(type: GgufTypeId, key: string): Promise<GgufScalar> {
    if (type === GgufType.STRING) return this.string();
    const size = SCALAR_SIZES[type];
    if (size === undefined) return fail('HYDRA_ERR_GGUF_INVALID', `metadata ${key}: bad value type ${type}`);
    const i = await this.#need(size);
    this.#pos += size;
    const v = this.#view;
    switch (type) {
      case GgufType.UINT8:
        return v.getUint8(i);
      case GgufType.INT8:
        return v.getInt8(i);
      case GgufType.UINT16:
        return v.getUint16(i, true);
      case GgufType.INT16:
        return v.getInt16(i, true);
      case GgufType.UINT32:
        return v.getUint32(i, true);
      case GgufType.INT32:
        return v.getInt32(i, true);
      case GgufType.FLOAT32:
        return v.getFloat32(i, true);
      case GgufType.BOOL: {
        const b = v.getUint8(i);
        if (b > 1) fail('HYDRA_ERR_GGUF_INVALID', `metadata ${key}: bool byte ${b}`);
        return b === 1;
      }
      case GgufType.UINT64:
        return narrow(v.getBigUint64(i, true));
      case GgufType.INT64:
        return narrow(v.getBigInt64(i, true));
      default:
        return v.getFloat64(i, true);
    }
  }
}

function narrow(x: bigint): number | bigint {
  return x >= BigInt(Number.MIN_SAFE_INTEGER) && x <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(x) : x;
}

/**
 * Opens a source with `open`, reads its GGUF and closes the source whether or not the read
 * succeeded: the one place where a caller's file handle is released after a header read.
 */
export async function readGgufFrom(
  open: () => Promise<ClosableGgufSource>,
  options: ReadGgufOptions = {},
): Promise<GgufFile> {
  const source = await open();
  try {
    return await readGguf(source, options);
  } finally {
    await source.close();
  }
}
