import { connect } from 'node:net';
import { afterEach, describe, expect, it, vi } from 'vitest';
import type { HydraPort } from '../src/index.js';
import { frame, memoryLogger, rawExchange, startPort } from './helpers.js';
import { loadNativeGgml } from './native.js';

// What the port logs about each connection it closes and each ggml-RPC session that ends, with the
// real native host: a stock client that reports a failed HELLO must leave a line saying which
// session it was, how it ended, in which host, and how long it waited for one.
const loaded = await loadNativeGgml();
const native = loaded?.native;
const rpcHostPath = loaded?.rpcHostPath ?? '';

const ports: HydraPort[] = [];
afterEach(async () => {
  await Promise.all(ports.splice(0).map((p) => p.close()));
});

async function serveNative(options: Parameters<typeof startPort>[0] = {}) {
  const logger = memoryLogger();
  const started = await startPort({
    native: { peekFirstByte: native!.peekFirstByte },
    rpcHost: { args: [rpcHostPath] },
    shutdownTimeoutMs: 3000,
    logger,
    ...options,
  });
  ports.push(started.port);
  return { ...started, logger };
}

describe.skipIf(native === undefined)('merged port: one line per ended ggml-RPC session', () => {
  it('a session whose client left before its HELLO was answered is a warning naming host and queue wait; a served one is info', async () => {
    const { port, portNumber, logger } = await serveNative();
    // HELLO cut after its header: the guard waits for the rest, then sees the client leave.
    const partial = Buffer.alloc(9);
    partial[0] = 0x0e;
    partial.writeBigUInt64LE(24n, 1);
    const s = connect({ port: portNumber, host: '127.0.0.1' });
    s.on('error', () => {});
    await new Promise<void>((resolve) => s.once('connect', () => resolve()));
    s.write(partial);
    const label = `127.0.0.1:${s.localPort}`;
    await vi.waitFor(() => expect(port.stats().rpc.active).toBe(1), { timeout: 10_000 });
    s.destroy();
    await vi.waitFor(() => expect(port.stats().rpc.served).toBe(1), { timeout: 10_000 });
    const warned = logger.lines.filter((l) => l.level === 'warn' && l.message.includes(label));
    expect(warned).toHaveLength(1);
    expect(warned[0]!.message).toMatch(
      /ended \(client\) before its HELLO was answered, host \d+, \d+ ms served, \d+ ms queued/,
    );

    await native!.probeRpcServer(`127.0.0.1:${portNumber}`, 5000);
    await vi.waitFor(() => expect(port.stats().rpc.served).toBe(2), { timeout: 10_000 });
    const served = logger.lines.filter(
      (l) => l.message.includes('ggml-RPC session for') && !l.message.includes(label),
    );
    expect(served).toHaveLength(1);
    expect(served[0]!.level).toBe('info');
    expect(served[0]!.message).toMatch(/ended \(client\) after 1 messages, host \d+, .* \d+ bytes in/);
  });

  it('a connection closed for its first byte, or for sending none, leaves a line', async () => {
    const { port, portNumber, logger } = await serveNative({ firstByteTimeoutMs: 200 });
    await rawExchange(portNumber, frame(0x2f, '{}'), 2000);
    await vi.waitFor(() => expect(port.stats().connections.badFirstByte).toBe(1));
    expect(logger.lines.some((l) => l.level === 'warn' && l.message.includes('first byte 0x2f'))).toBe(true);
    await rawExchange(portNumber, Buffer.alloc(0), 3000);
    await vi.waitFor(() => expect(port.stats().connections.noFirstByte).toBe(1));
    expect(
      logger.lines.some((l) => l.level === 'warn' && l.message.includes('sent nothing within 200 ms')),
    ).toBe(true);
  });
});
