// The slot-state codec (pure): `HYST` magic, version 1, token count (u32 LE each), the tokens
// (i32 LE) whose KV the slot holds, then llama.cpp's sequence state bytes.
import { HydraError } from '../errors.js';

const MAGIC = 'HYST';
const VERSION = 1;
const HEAD = 12;

/** A slot's tokens and llama.cpp sequence state as one buffer. */
export function encodeSlotState(tokens: Int32Array, kv: Uint8Array): Buffer {
  const head = Buffer.alloc(HEAD + tokens.length * 4);
  head.write(MAGIC, 0, 'latin1');
  head.writeUInt32LE(VERSION, 4);
  head.writeUInt32LE(tokens.length, 8);
  for (let i = 0; i < tokens.length; i++) head.writeInt32LE(tokens[i]!, HEAD + i * 4);
  return Buffer.concat([head, kv]);
}

/**
 * Parses {@link encodeSlotState} output; throws `HYDRA_ERR_STATE_INVALID` for anything else, for
 * more tokens than a slot holds (`nCtxSeq`) and for token ids outside the vocabulary (`nVocab`).
 */
export function decodeSlotState(
  data: Uint8Array,
  limits: { nVocab: number; nCtxSeq: number },
): { tokens: Int32Array; kv: Buffer } {
  const buf = Buffer.from(data.buffer, data.byteOffset, data.byteLength);
  const bad = (why: string) => new HydraError('HYDRA_ERR_STATE_INVALID', `slot state rejected: ${why}`);
  if (buf.length < HEAD || buf.toString('latin1', 0, 4) !== MAGIC) throw bad('not a hydra slot state');
  if (buf.readUInt32LE(4) !== VERSION) throw bad(`version ${buf.readUInt32LE(4)} is not ${VERSION}`);
  const n = buf.readUInt32LE(8);
  if (HEAD + n * 4 > buf.length) throw bad('truncated token list');
  if (n >= limits.nCtxSeq) throw bad(`${n} tokens do not fit a slot of ${limits.nCtxSeq}`);
  const tokens = new Int32Array(n);
  for (let i = 0; i < n; i++) {
    const t = buf.readInt32LE(HEAD + i * 4);
    if (t < 0 || t >= limits.nVocab) throw bad(`token ${t} is outside the vocabulary`);
    tokens[i] = t;
  }
  return { tokens, kv: buf.subarray(HEAD + n * 4) };
}
