import { connect, type Socket } from 'node:net';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { HydraClient, type HydraPort } from '../src/index.js';
import { frame, memoryLogger, rawExchange, startPort } from './helpers.js';
import { loadNativeGgml } from './native.js';

const loaded = await loadNativeGgml();
const native = loaded?.native;
const rpcHostPath = loaded?.rpcHostPath ?? '';
const nativeAvailable = native !== undefined;

// ggml-RPC protocol 6 HELLO: cmd u8, size u64 = 24, 24 request bytes; reply size u64 = 28, then
// major, minor, patch first.
const HELLO_REQ_SIZE = 24;
const HELLO_RSP_SIZE = 28;
function helloRest(): Buffer {
  const rest = Buffer.alloc(8 + HELLO_REQ_SIZE);
  rest.writeBigUInt64LE(BigInt(HELLO_REQ_SIZE), 0);
  return rest;
}

function readExactly(socket: Socket, n: number, timeoutMs = 5000): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let got = 0;
    const timer = setTimeout(
      () => reject(new Error(`no ${n} bytes in ${timeoutMs} ms (got ${got})`)),
      timeoutMs,
    );
    const onData = (chunk: Buffer) => {
      chunks.push(chunk);
      got += chunk.byteLength;
      if (got >= n) {
        clearTimeout(timer);
        socket.off('data', onData);
        resolve(Buffer.concat(chunks));
      }
    };
    socket.on('data', onData);
    socket.once('close', () => {
      clearTimeout(timer);
      reject(new Error(`closed after ${got} bytes`));
    });
  });
}

function openRpc(portNumber: number, localAddress = '127.0.0.1'): Promise<Socket> {
  return new Promise((resolve, reject) => {
    const s = connect({ port: portNumber, host: '127.0.0.1', localAddress }, () => {
      s.write(Buffer.from([0x0e]));
      resolve(s);
    });
    s.on('error', reject);
  });
}

const ports: HydraPort[] = [];
afterEach(async () => {
  await Promise.all(ports.splice(0).map((p) => p.close()));
});

async function serveNative(options: Parameters<typeof startPort>[0] = {}) {
  const started = await startPort({
    native: { peekFirstByte: native!.peekFirstByte },
    rpcHost: { args: [rpcHostPath] },
    shutdownTimeoutMs: 3000,
    handlers: { STATUS: () => ({ state: 'empty' }) },
    ...options,
  });
  ports.push(started.port);
  return started;
}

describe.skipIf(!nativeAvailable)('merged port with the native ggml-RPC half', () => {
  it('0x0E reaches the native ggml-RPC session with the first byte unread', async () => {
    const { port, portNumber } = await serveNative();
    const version = await native!.probeRpcServer(`127.0.0.1:${portNumber}`, 5000);
    expect(version.major).toBe(6);
    await vi.waitFor(() => expect(port.stats().rpc.served).toBe(1), { timeout: 5000 });
    expect(port.stats().rpc.bytesIn).toBeGreaterThanOrEqual(1 + 8 + HELLO_REQ_SIZE);
  });

  it('0x30..0x46 reach Hydra through the native peek; other bytes close without a reply', async () => {
    const { port, portNumber } = await serveNative();
    const c = await HydraClient.connect({ port: portNumber });
    await expect(c.request(0x31, {})).resolves.toMatchObject({ success: true, state: 'empty' });
    await c.close();
    for (const byte of [0x00, 0x2f, 0x47, 0xff]) {
      await expect(rawExchange(portNumber, frame(byte, '{}'), 2000)).resolves.toEqual({
        received: Buffer.alloc(0),
        closed: true,
      });
    }
    expect(port.stats().connections.badFirstByte).toBe(4);
  });

  it('closes a connection that sends nothing', async () => {
    const { port, portNumber } = await serveNative({ firstByteTimeoutMs: 200 });
    const result = await rawExchange(portNumber, Buffer.alloc(0), 3000);
    expect(result.closed).toBe(true);
    await vi.waitFor(() => expect(port.stats().connections.noFirstByte).toBe(1));
  });

  it('refuses 127.0.0.2 for both protocols when only 127.0.0.1 is allowed', async () => {
    const { port, portNumber } = await serveNative({ allowFrom: ['127.0.0.1/32'] });
    for (const bytes of [frame(0x31, '{}'), Buffer.concat([Buffer.from([0x0e]), helloRest()])]) {
      await expect(rawExchange(portNumber, bytes, 2000, '127.0.0.2')).resolves.toEqual({
        received: Buffer.alloc(0),
        closed: true,
      });
    }
    expect(port.stats().connections.refusedByAllowlist).toBe(2);
    expect(port.stats().rpc.served).toBe(0);
  });

  it('pool size 2, queue 1: the 4th connection is refused, the first two keep working, the queued one starts', async () => {
    const logger = memoryLogger();
    const { port, portNumber } = await serveNative({ poolSize: 2, queueSize: 1, rpcMaxPerSource: 3, logger });
    const a = await openRpc(portNumber);
    const b = await openRpc(portNumber);
    await vi.waitFor(() => expect(port.stats().rpc.active).toBe(2), { timeout: 5000 });
    const queued = await openRpc(portNumber);
    await vi.waitFor(() => expect(port.stats().rpc.queued).toBe(1), { timeout: 5000 });
    const refused = await rawExchange(portNumber, Buffer.concat([Buffer.from([0x0e]), helloRest()]), 2000);
    expect(refused).toEqual({ received: Buffer.alloc(0), closed: true });
    expect(port.stats().rpc).toMatchObject({ active: 2, queued: 1, refused: 1 });
    expect(logger.lines.some((l) => l.level === 'warn' && l.message.includes('refused ggml-RPC'))).toBe(true);

    for (const s of [a, b]) {
      const reply = readExactly(s, 8 + HELLO_RSP_SIZE);
      s.write(helloRest());
      const bytes = await reply;
      expect(bytes.readBigUInt64LE(0)).toBe(BigInt(HELLO_RSP_SIZE));
      expect(bytes[8]).toBe(6);
    }
    a.destroy();
    await vi.waitFor(() => expect(port.stats().rpc).toMatchObject({ queued: 0, active: 2, served: 1 }), {
      timeout: 5000,
    });
    const reply = readExactly(queued, 8 + HELLO_RSP_SIZE);
    queued.write(helloRest());
    expect((await reply)[8]).toBe(6);
    b.destroy();
    queued.destroy();
    await vi.waitFor(() => expect(port.stats().rpc).toMatchObject({ active: 0, served: 3 }), {
      timeout: 5000,
    });
  });

  it('shutdown completes within 1 s of the last ggml-RPC session ending', async () => {
    const { port, portNumber } = await serveNative();
    const s = await openRpc(portNumber);
    await vi.waitFor(() => expect(port.stats().rpc.active).toBe(1), { timeout: 5000 });
    let closedAt = 0;
    const closing = port.close().then(() => {
      closedAt = Date.now();
    });
    await new Promise((r) => setTimeout(r, 200));
    expect(closedAt).toBe(0);
    const endedAt = Date.now();
    s.destroy();
    await closing;
    expect(closedAt - endedAt).toBeLessThan(1000);
  });

  it('a host process that dies (SIGSEGV) ends its session only: the other session and new ones are served', async () => {
    const logger = memoryLogger();
    const { port, portNumber } = await serveNative({ logger });
    const a = await openRpc(portNumber);
    const b = await openRpc(portNumber, '127.0.0.2');
    await vi.waitFor(() => expect(port.rpcSessions()).toHaveLength(2), { timeout: 5000 });
    const local = a.localPort;
    const pidA = port.rpcSessions().find((s) => s.label.endsWith(`:${local}`))!.pid!;
    const aClosed = new Promise((r) => a.once('close', r));
    process.kill(pidA, 'SIGSEGV');
    await aClosed;
    await vi.waitFor(() => expect(port.stats().rpc).toMatchObject({ crashed: 1, active: 1 }), {
      timeout: 5000,
    });
    expect(
      logger.lines.some((l) => l.level === 'error' && l.message.includes(`${pidA} killed by SIGSEGV`)),
    ).toBe(true);
    const reply = readExactly(b, 8 + HELLO_RSP_SIZE);
    b.write(helloRest());
    expect((await reply)[8]).toBe(6);
    const version = await native!.probeRpcServer(`127.0.0.1:${portNumber}`, 5000);
    expect(version.major).toBe(6);
    b.destroy();
    await vi.waitFor(() => expect(port.stats().rpc).toMatchObject({ active: 0, served: 2 }), {
      timeout: 5000,
    });
  });

  it('connections that send only 0x0E: one address runs at most rpcMaxPerSource (pool - 1) sessions, another still gets HELLO', async () => {
    const { port, portNumber } = await serveNative({ poolSize: 4 });
    const stalled = await Promise.all([0, 1, 2, 3].map(() => openRpc(portNumber)));
    await vi.waitFor(() => expect(port.stats().rpc).toMatchObject({ active: 3, queued: 1 }), {
      timeout: 5000,
    });
    const other = await openRpc(portNumber, '127.0.0.2');
    const reply = readExactly(other, 8 + HELLO_RSP_SIZE);
    other.write(helloRest());
    expect((await reply)[8]).toBe(6);
    other.destroy();
    for (const s of stalled) s.destroy();
  });

  it("a running session's counters reach stats() live, before it ends", async () => {
    const { port, portNumber } = await serveNative();
    const s = await openRpc(portNumber);
    const reply = readExactly(s, 8 + HELLO_RSP_SIZE);
    s.write(helloRest());
    await reply;
    // RPC_CMD_DEVICE_COUNT (15, no payload): reply size u64 = 4, then a u32 count
    for (let i = 0; i < 5; i++) {
      const r = readExactly(s, 12);
      s.write(Buffer.concat([Buffer.from([15]), Buffer.alloc(8)]));
      await r;
    }
    await vi.waitFor(() => expect(port.stats().rpc.commands).toBeGreaterThanOrEqual(5), { timeout: 5000 });
    expect(port.stats().rpc).toMatchObject({ active: 1, served: 0 });
    s.destroy();
    await vi.waitFor(() => expect(port.stats().rpc.served).toBe(1), { timeout: 5000 });
    expect(port.stats().rpc.commands).toBeGreaterThanOrEqual(5);
  }, 15_000);

  it('no host process outlives close()', async () => {
    const { port, portNumber } = await serveNative();
    const s = await openRpc(portNumber);
    await vi.waitFor(() => expect(port.stats().rpc.active).toBe(1), { timeout: 5000 });
    // the serving one and, a moment later, the next warm one
    await vi.waitFor(() => expect(port.hostPids().length).toBe(2), { timeout: 5000 });
    const pids = port.hostPids();
    s.destroy();
    await port.close();
    for (const pid of pids) expect(() => process.kill(pid, 0)).toThrow();
  });
});
