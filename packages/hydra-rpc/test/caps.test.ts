import { once } from 'node:events';
import { connect, type Socket } from 'node:net';
import { afterEach, describe, expect, it, vi } from 'vitest';
import type { HydraPort } from '../src/index.js';
import { frame, memoryLogger, splitFrames, startPort } from './helpers.js';

// Connection and session caps, idle timeouts and half-close on the Hydra half of the port (real
// sockets on loopback; 127.0.0.2 is a second source address). The ggml-RPC caps are in
// pool.test.ts and native-port.test.ts.
const opened: HydraPort[] = [];
const sockets: Socket[] = [];
afterEach(async () => {
  for (const s of sockets.splice(0)) s.destroy();
  await Promise.all(opened.splice(0).map((p) => p.close()));
});

async function serve(options: Parameters<typeof startPort>[0] = {}) {
  const logger = memoryLogger();
  const started = await startPort({
    shutdownTimeoutMs: 2000,
    logger,
    handlers: { STATUS: () => ({ state: 'empty' }) },
    ...options,
  });
  opened.push(started.port);
  return { ...started, logger };
}

/** Opens a connection, optionally writes, and tracks when the server closes it. */
async function open(portNumber: number, localAddress = '127.0.0.1', bytes?: Buffer) {
  const socket = connect({ port: portNumber, host: '127.0.0.1', localAddress });
  sockets.push(socket);
  socket.on('error', () => {});
  const chunks: Buffer[] = [];
  socket.on('data', (d) => chunks.push(d));
  let closed = false;
  const closedP = new Promise<void>((resolve) =>
    socket.once('close', () => {
      closed = true;
      resolve();
    }),
  );
  await once(socket, 'connect');
  if (bytes) socket.write(bytes);
  return { socket, closed: closedP, isClosed: () => closed, received: () => Buffer.concat(chunks) };
}

async function status(portNumber: number, localAddress: string, timeoutMs = 2000): Promise<unknown> {
  const c = await open(portNumber, localAddress, frame(0x31, '{}'));
  const t0 = Date.now();
  while (Date.now() - t0 < timeoutMs) {
    const frames = splitFrames(c.received());
    if (frames.length > 0) {
      c.socket.destroy();
      return JSON.parse(frames[0]!.payload.toString());
    }
    if (c.isClosed()) throw new Error('closed without a reply');
    await new Promise((r) => setTimeout(r, 10));
  }
  throw new Error('no reply');
}

describe('caps', () => {
  it('1024 idle Hydra sessions from one address do not lock out another address ', async () => {
    const { port, portNumber, logger } = await serve();
    const idle = [];
    for (let i = 0; i < 1024; i++) idle.push(await open(portNumber, '127.0.0.1', frame(0x31, '{}')));
    await vi.waitFor(
      () => expect(port.stats().hydra.refused + port.stats().connections.refusedByCap).toBe(1024 - 64),
      {
        timeout: 10_000,
      },
    );
    expect(port.stats().hydra.active).toBe(64);
    // the admitted ones got their reply and are held open, idle
    expect(idle.filter((c) => !c.isClosed())).toHaveLength(64);
    const t0 = Date.now();
    await expect(status(portNumber, '127.0.0.2')).resolves.toMatchObject({ success: true, state: 'empty' });
    expect(Date.now() - t0).toBeLessThan(1000);
    // refusals are logged, but not one line each
    const lines = logger.lines.filter(
      (l) => l.level === 'warn' && l.message.includes('refused Hydra session'),
    );
    expect(lines.length).toBeGreaterThan(0);
    expect(lines.length).toBeLessThan(20);
  }, 60_000);

  it('maxConnectionsPerSource: connections that send nothing cannot hold the port', async () => {
    const { port, portNumber } = await serve({ maxConnectionsPerSource: 4, firstByteTimeoutMs: 30_000 });
    const silent = [];
    for (let i = 0; i < 10; i++) silent.push(await open(portNumber));
    await vi.waitFor(() => expect(port.stats().connections.refusedByCap).toBe(6));
    await Promise.all(silent.slice(4).map((c) => c.closed));
    await expect(status(portNumber, '127.0.0.2')).resolves.toMatchObject({ success: true });
    // a slot frees when one closes
    silent[0]!.socket.destroy();
    await silent[0]!.closed;
    await vi.waitFor(async () =>
      expect(await status(portNumber, '127.0.0.1')).toMatchObject({ success: true }),
    );
  });

  it('maxConnections caps all connections together', async () => {
    const { port, portNumber } = await serve({ maxConnections: 3, firstByteTimeoutMs: 30_000 });
    for (let i = 0; i < 3; i++) await open(portNumber, `127.0.0.${i + 1}`);
    const fourth = await open(portNumber, '127.0.0.9');
    await fourth.closed;
    expect(port.stats().connections.refusedByCap).toBe(1);
  });

  it('maxHydraSessions caps sessions of every address together', async () => {
    const { port, portNumber } = await serve({ maxHydraSessions: 2 });
    await status(portNumber, '127.0.0.1').catch(() => undefined);
    const a = await open(portNumber, '127.0.0.1', frame(0x31, '{}'));
    const b = await open(portNumber, '127.0.0.2', frame(0x31, '{}'));
    await vi.waitFor(() => expect(port.stats().hydra.active).toBe(2));
    const c = await open(portNumber, '127.0.0.3', frame(0x31, '{}'));
    await c.closed;
    expect(c.received()).toHaveLength(0);
    expect(port.stats().hydra.refused).toBe(1);
    expect(a.isClosed() || b.isClosed()).toBe(false);
  });
});

describe('idle timeout', () => {
  it('closes a Hydra session that sends no frame for idleTimeoutMs; a STATUS poller stays', async () => {
    const { port, portNumber } = await serve({ idleTimeoutMs: 400 });
    const quiet = await open(portNumber, '127.0.0.1', frame(0x31, '{}'));
    const poller = await open(portNumber, '127.0.0.1', frame(0x31, '{}'));
    const timer = setInterval(() => poller.socket.write(frame(0x31, '{}')), 100);
    try {
      const t0 = Date.now();
      await quiet.closed;
      const took = Date.now() - t0;
      expect(took).toBeGreaterThanOrEqual(300);
      expect(took).toBeLessThan(2000);
      expect(splitFrames(quiet.received())).toHaveLength(1); // its reply came first
      await new Promise((r) => setTimeout(r, 800));
      expect(poller.isClosed()).toBe(false);
      expect(port.stats().hydra.idleTimeouts).toBe(1);
    } finally {
      clearInterval(timer);
    }
  });

  it('a request still being answered is not idle', async () => {
    const { portNumber } = await serve({
      idleTimeoutMs: 200,
      handlers: { STATUS: () => new Promise((r) => setTimeout(() => r({ state: 'empty' }), 700)) },
    });
    const c = await open(portNumber, '127.0.0.1', frame(0x31, '{}'));
    await vi.waitFor(() => expect(splitFrames(c.received())).toHaveLength(1), { timeout: 3000 });
    await c.closed; // then idle, and closed
  });
});

describe('half-close', () => {
  it('a client that shuts down its sending side after its requests gets every reply, then the FIN', async () => {
    // The engine's handlers answer later than the FIN arrives (they await native work).
    const { portNumber } = await serve({
      handlers: { STATUS: () => new Promise((r) => setTimeout(() => r({ state: 'empty' }), 50)) },
    });
    const c = await open(portNumber, '127.0.0.1', Buffer.concat([frame(0x31, '{}'), frame(0x31, '{}')]));
    c.socket.end();
    await c.closed;
    const frames = splitFrames(c.received());
    expect(frames).toHaveLength(2);
    expect(JSON.parse(frames[1]!.payload.toString())).toMatchObject({ success: true, state: 'empty' });
  });
});
