import { connect, type Socket } from 'node:net';

export const HYDRA_MIN = 0x30;
export const HYDRA_MAX = 0x46;
export const DEFAULT_MAX_FRAME = 64 * 2 ** 20;

export interface RawReply {
  opcode: number;
  payload: Buffer;
}

/**
 * Sends `bytes` on a fresh connection and collects reply frames until the server closes; with
 * `endAfter`, once `expected` replies are in, it half-closes first. `closed: false` means the
 * server neither closed nor, with `endAfter`, answered within `timeoutMs`.
 */
export function exchange(
  port: number,
  bytes: Buffer,
  options: { expected: number; endAfter?: boolean; timeoutMs?: number; localAddress?: string },
): Promise<{ replies: RawReply[]; closed: boolean; error?: string }> {
  return new Promise((resolve) => {
    const s: Socket = connect({ port, host: '127.0.0.1', localAddress: options.localAddress });
    const replies: RawReply[] = [];
    let buf = Buffer.alloc(0);
    let done = false;
    let ended = false;
    const finish = (closed: boolean, error?: string) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      s.destroy();
      resolve({ replies, closed, ...(error ? { error } : {}) });
    };
    const timer = setTimeout(() => finish(false, 'timeout'), options.timeoutMs ?? 10_000);
    const maybeEnd = () => {
      if (replies.length < options.expected) return;
      if (options.endAfter && !ended) {
        ended = true;
        s.end();
      }
    };
    s.on('connect', () => {
      s.write(bytes);
      maybeEnd();
    });
    s.on('data', (d: Buffer) => {
      buf = Buffer.concat([buf, d]);
      while (buf.byteLength >= 9) {
        const len = Number(buf.readBigUInt64LE(1));
        if (buf.byteLength < 9 + len) break;
        replies.push({ opcode: buf[0]!, payload: buf.subarray(9, 9 + len) });
        buf = buf.subarray(9 + len);
      }
      maybeEnd();
    });
    s.on('close', () => finish(true));
    s.on('error', (e) => finish(true, (e as NodeJS.ErrnoException).code));
  });
}

/** `| opcode u8 | length u64 LE | payload |` with an optional lying length. */
export function frame(opcode: number, payload: Uint8Array, length?: bigint): Buffer {
  const b = Buffer.alloc(9 + payload.byteLength);
  b[0] = opcode;
  b.writeBigUInt64LE(length ?? BigInt(payload.byteLength), 1);
  b.set(payload, 9);
  return b;
}
