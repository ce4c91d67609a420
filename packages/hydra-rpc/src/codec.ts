import { Packr, Unpackr } from 'msgpackr';
import { HydraError } from './errors.js';

/*
 * Hydra frame (protocol.md, "Frames"); requests and responses share it, a response echoes the
 * request's opcode. Integers are little-endian.
 *
 *    byte 0      bytes 1..8                  bytes 9 .. 9+length-1
 *   +--------+----------------------------+---------------------------+
 *   | opcode |  length (u64 LE)           |  payload (length bytes)   |
 *   |  u8    |                            |  JSON object | MsgPack map|
 *   +--------+----------------------------+---------------------------+
 *
 * Payload sniffing: length 0 -> `{}` (answered in JSON); first non-space byte `{` -> JSON;
 * first byte 0x80..0x8f, 0xde or 0xdf -> MessagePack map; anything else -> HYDRA_ERR_BAD_PAYLOAD.
 */

/** Bytes of the fixed frame header: opcode u8 + length u64. */
export const HEADER_BYTES = 9;

/** Payload encoding of one frame. */
export type Encoding = 'json' | 'msgpack';

/** A plain payload object as it crosses the wire. */
export type Payload = Record<string, unknown>;

const packr = new Packr({ useRecords: false });
const unpackr = new Unpackr({ useRecords: false, mapsAsObjects: true });

/** Encodes one frame: header followed by `payload`. */
export function encodeFrame(opcode: number, payload: Uint8Array): Buffer {
  const frame = Buffer.allocUnsafe(HEADER_BYTES + payload.byteLength);
  frame.writeUInt8(opcode, 0);
  frame.writeBigUInt64LE(BigInt(payload.byteLength), 1);
  frame.set(payload, HEADER_BYTES);
  return frame;
}

function jsonReplacer(this: unknown, key: string, value: unknown): unknown {
  // Buffer.toJSON runs before the replacer, so the raw value is read from the holder.
  const raw = (this as Record<string, unknown>)[key];
  if (raw instanceof Uint8Array)
    return Buffer.from(raw.buffer, raw.byteOffset, raw.byteLength).toString('base64');
  return value;
}

/** Encodes a payload object; Uint8Array values become base64 strings in JSON and `bin` in MessagePack. */
export function encodePayload(value: Payload, encoding: Encoding): Buffer {
  if (encoding === 'msgpack') return packr.pack(value);
  return Buffer.from(JSON.stringify(value, jsonReplacer), 'utf8');
}

function isPlainObject(value: unknown): value is Payload {
  return (
    typeof value === 'object' && value !== null && !Array.isArray(value) && !(value instanceof Uint8Array)
  );
}

/** The encoding a payload claims by its first byte(s), or undefined when it claims none. */
export function sniffEncoding(payload: Uint8Array): Encoding | undefined {
  if (payload.byteLength === 0) return 'json';
  const first = payload[0]!;
  if ((first >= 0x80 && first <= 0x8f) || first === 0xde || first === 0xdf) return 'msgpack';
  for (const byte of payload) {
    if (byte === 0x20 || byte === 0x09 || byte === 0x0a || byte === 0x0d) continue;
    return byte === 0x7b ? 'json' : undefined;
  }
  return undefined;
}

/**
 * Decodes a payload by sniffing its encoding. Throws HYDRA_ERR_BAD_PAYLOAD when it is neither one
 * JSON object nor one MessagePack map (trailing bytes included).
 */
export function decodePayload(payload: Uint8Array): { encoding: Encoding; value: Payload } {
  const encoding = sniffEncoding(payload);
  if (payload.byteLength === 0) return { encoding: 'json', value: {} };
  if (encoding === undefined) {
    throw new HydraError('HYDRA_ERR_BAD_PAYLOAD', 'payload is neither a JSON object nor a MessagePack map');
  }
  let value: unknown;
  try {
    value =
      encoding === 'json'
        ? JSON.parse(new TextDecoder('utf-8', { fatal: true }).decode(payload))
        : unpackr.unpack(payload);
  } catch (cause) {
    throw new HydraError(
      'HYDRA_ERR_BAD_PAYLOAD',
      `payload is not valid ${encoding === 'json' ? 'JSON' : 'MessagePack'}`,
      {
        cause,
      },
    );
  }
  if (!isPlainObject(value)) {
    throw new HydraError('HYDRA_ERR_BAD_PAYLOAD', 'payload is not a single object/map');
  }
  return { encoding, value };
}

const BASE64 = /^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$/;

/**
 * Turns the named binary fields of a decoded payload into Buffers (base64 in JSON, bin in
 * MessagePack). A present field that is neither bytes nor strict base64 is HYDRA_ERR_BAD_VALUE.
 */
export function decodeBinaryFields(value: Payload, fields: readonly string[] | undefined): Payload {
  if (fields === undefined) return value;
  let out = value;
  for (const field of fields) {
    if (!Object.hasOwn(value, field)) continue;
    const raw = value[field];
    let bytes: Buffer;
    if (raw instanceof Uint8Array) bytes = Buffer.from(raw.buffer, raw.byteOffset, raw.byteLength);
    else if (typeof raw === 'string' && BASE64.test(raw)) bytes = Buffer.from(raw, 'base64');
    else
      throw new HydraError('HYDRA_ERR_BAD_VALUE', `${field} must be bytes (base64 in JSON)`, {
        keys: [field],
      });
    if (out === value) out = { ...value };
    out[field] = bytes;
  }
  return out;
}

/** One complete frame read off the wire. */
export interface Frame {
  opcode: number;
  payload: Buffer;
}

/** What {@link FrameReader.next} found in the buffered bytes. */
export type ReadResult =
  | { kind: 'frame'; frame: Frame }
  | { kind: 'need-more'; partial: boolean }
  | { kind: 'too-large'; opcode: number; length: bigint }
  | { kind: 'bad-opcode'; opcode: number };

/**
 * Incremental frame parser. Bytes go in with {@link push}; {@link next} returns one result at a time
 * and never throws: limits come back as results so the session can answer them in request order.
 */
export class FrameReader {
  #chunks: Buffer[] = [];
  #buffered = 0;
  readonly #maxPayload: number;
  readonly #acceptOpcode: (opcode: number) => boolean;

  constructor(maxPayload: number, acceptOpcode: (opcode: number) => boolean = () => true) {
    this.#maxPayload = maxPayload;
    this.#acceptOpcode = acceptOpcode;
  }

  /** Bytes held that are not yet part of a returned frame. */
  get buffered(): number {
    return this.#buffered;
  }

  push(chunk: Buffer): void {
    if (chunk.byteLength === 0) return;
    this.#chunks.push(chunk);
    this.#buffered += chunk.byteLength;
  }

  next(): ReadResult {
    if (this.#buffered === 0) return { kind: 'need-more', partial: false };
    const first = this.#chunks[0]!;
    const opcode = first[0]!;
    if (!this.#acceptOpcode(opcode)) return { kind: 'bad-opcode', opcode };
    if (this.#buffered < HEADER_BYTES) return { kind: 'need-more', partial: true };
    const header = this.#peek(HEADER_BYTES);
    const length = header.readBigUInt64LE(1);
    if (length > BigInt(this.#maxPayload)) return { kind: 'too-large', opcode, length };
    const total = HEADER_BYTES + Number(length);
    if (this.#buffered < total) return { kind: 'need-more', partial: true };
    const frame = this.#take(total);
    return { kind: 'frame', frame: { opcode, payload: frame.subarray(HEADER_BYTES) } };
  }

  #peek(n: number): Buffer {
    const first = this.#chunks[0]!;
    if (first.byteLength >= n) return first.subarray(0, n);
    const merged = Buffer.concat(this.#chunks);
    this.#chunks = [merged];
    return merged.subarray(0, n);
  }

  #take(n: number): Buffer {
    const first = this.#chunks[0]!;
    let out: Buffer;
    if (first.byteLength >= n) {
      out = first.subarray(0, n);
      if (first.byteLength === n) this.#chunks.shift();
      else this.#chunks[0] = first.subarray(n);
    } else {
      const merged = Buffer.concat(this.#chunks);
      out = merged.subarray(0, n);
      this.#chunks = merged.byteLength > n ? [merged.subarray(n)] : [];
    }
    this.#buffered -= n;
    return out;
  }
}
