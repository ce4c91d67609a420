// `--slot-save-path` files: a slot state (core/slot-state.ts) in an envelope that names the model
// it came from and carries the payload's length and SHA-256, so that a truncated, altered or
// foreign file is refused before llama.cpp reads a byte of it.
import { createHash } from 'node:crypto';
import { HydraError } from '../errors.js';

const MAGIC = 'HYSLOTF1';
const HEAD = 8 + 4 + 8 + 32;

/** What ties a saved slot to a model: a state restores only into a model with the same facts. */
export interface ModelFingerprint {
  arch: string;
  nVocab: number;
  nLayer: number;
  nEmbd: number;
  nParams: number;
  size: number;
}

function fingerprintBytes(f: ModelFingerprint): Buffer {
  return Buffer.from(JSON.stringify([f.arch, f.nVocab, f.nLayer, f.nEmbd, f.nParams, f.size]), 'utf8');
}

/** The file: magic, fingerprint length (u32 LE), payload length (u64 LE), SHA-256, fingerprint, payload. */
export function encodeSlotFile(state: Uint8Array, model: ModelFingerprint): Buffer {
  const fp = fingerprintBytes(model);
  const head = Buffer.alloc(HEAD);
  head.write(MAGIC, 0, 'latin1');
  head.writeUInt32LE(fp.length, 8);
  head.writeBigUInt64LE(BigInt(state.length), 12);
  createHash('sha256').update(fp).update(state).digest().copy(head, 20);
  return Buffer.concat([head, fp, state]);
}

/** The slot state inside {@link encodeSlotFile} output; `HYDRA_ERR_STATE_INVALID` for anything else. */
export function decodeSlotFile(data: Buffer, model: ModelFingerprint): Buffer {
  const bad = (why: string) => new HydraError('HYDRA_ERR_STATE_INVALID', `slot file refused: ${why}`);
  if (data.length < HEAD || data.toString('latin1', 0, 8) !== MAGIC) throw bad('not a hydra slot file');
  const fpLength = data.readUInt32LE(8);
  const stateLength = data.readBigUInt64LE(12);
  if (BigInt(HEAD + fpLength) + stateLength !== BigInt(data.length))
    throw bad(`the file is ${data.length} bytes, its header says ${BigInt(HEAD + fpLength) + stateLength}`);
  const fp = data.subarray(HEAD, HEAD + fpLength);
  const state = data.subarray(HEAD + fpLength);
  const digest = createHash('sha256').update(fp).update(state).digest();
  if (!digest.equals(data.subarray(20, 52))) throw bad('the checksum does not match the contents');
  if (!fp.equals(fingerprintBytes(model)))
    throw bad(`it was saved from another model (${fp.toString('utf8')})`);
  return state;
}

/** llama.cpp's fs_validate_filename without subdirectories: a plain file name or false. */
export function validSlotFilename(name: unknown): name is string {
  if (typeof name !== 'string' || name.length === 0 || Buffer.byteLength(name) > 255) return false;
  if (name.startsWith(' ') || name.endsWith(' ') || name.endsWith('.')) return false;
  for (const ch of name) {
    const c = ch.codePointAt(0)!;
    if (
      c <= 0x1f ||
      c === 0x7f ||
      (c >= 0x80 && c <= 0x9f) ||
      c === 0xff0e ||
      c === 0x2215 ||
      c === 0x2216 ||
      (c >= 0xd800 && c <= 0xdfff) ||
      c === 0xfffd ||
      c === 0xfeff ||
      ':*?"<>|/\\'.includes(ch)
    )
      return false;
  }
  return true;
}
