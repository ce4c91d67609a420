import { connect, type Socket } from 'node:net';
import { HydraPort, type HydraPortOptions } from '../src/index.js';
import type { Logger } from '../src/logger.js';

export interface LogLine {
  level: 'info' | 'warn' | 'error';
  message: string;
  fields: Record<string, unknown> | undefined;
}

export function memoryLogger(): Logger & { lines: LogLine[] } {
  const lines: LogLine[] = [];
  return {
    lines,
    info: (message, fields) => lines.push({ level: 'info', message, fields }),
    warn: (message, fields) => lines.push({ level: 'warn', message, fields }),
    error: (message, fields) => lines.push({ level: 'error', message, fields }),
  };
}

export async function startPort(
  options: HydraPortOptions = {},
): Promise<{ port: HydraPort; portNumber: number }> {
  const port = new HydraPort({ logger: memoryLogger(), ...options });
  const address = await port.listen();
  return { port, portNumber: address.port };
}

/** Result of a raw exchange: every byte the server sent and whether it closed the connection. */
export interface RawResult {
  received: Buffer;
  closed: boolean;
}

/**
 * Connects, writes `bytes`, and collects what comes back until the server closes or `waitMs` passes
 * (then the client closes).
 */
export function rawExchange(
  portNumber: number,
  bytes: Uint8Array,
  waitMs = 500,
  localAddress?: string,
): Promise<RawResult> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    const socket: Socket = connect({
      port: portNumber,
      host: '127.0.0.1',
      ...(localAddress === undefined ? {} : { localAddress }),
    });
    let closedByServer = false;
    const timer = setTimeout(() => socket.destroy(), waitMs);
    socket.on('connect', () => {
      if (bytes.byteLength > 0) socket.write(bytes);
    });
    socket.on('data', (chunk) => chunks.push(chunk));
    socket.on('end', () => {
      closedByServer = true;
    });
    socket.on('error', (err: NodeJS.ErrnoException) => {
      // A refused or reset connection is the server closing on us; anything else is a test failure.
      if (err.code === 'ECONNRESET' || err.code === 'EPIPE' || err.code === 'ECONNREFUSED')
        closedByServer = true;
      else reject(err);
    });
    socket.on('close', () => {
      clearTimeout(timer);
      resolve({ received: Buffer.concat(chunks), closed: closedByServer });
    });
  });
}

export function frame(opcode: number, payload: Uint8Array | string): Buffer {
  const body = typeof payload === 'string' ? Buffer.from(payload, 'utf8') : Buffer.from(payload);
  const header = Buffer.alloc(9);
  header.writeUInt8(opcode, 0);
  header.writeBigUInt64LE(BigInt(body.byteLength), 1);
  return Buffer.concat([header, body]);
}

/** Splits a byte stream of complete frames into [opcode, payload] pairs. */
export function splitFrames(bytes: Buffer): { opcode: number; payload: Buffer }[] {
  const out: { opcode: number; payload: Buffer }[] = [];
  let at = 0;
  while (at + 9 <= bytes.byteLength) {
    const length = Number(bytes.readBigUInt64LE(at + 1));
    if (at + 9 + length > bytes.byteLength) break;
    out.push({ opcode: bytes[at]!, payload: bytes.subarray(at + 9, at + 9 + length) });
    at += 9 + length;
  }
  return out;
}
