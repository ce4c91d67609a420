import { once } from 'node:events';
import { connect, createServer, type Server, type Socket } from 'node:net';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { RpcPool } from '../src/pool.js';
import { memoryLogger } from './helpers.js';

// The pool's admission, accounting and supervision with real child processes and real TCP
// connections: the host fixture serves a handed-over connection in JS (echo-host.mjs), so a
// session's life and its host's death are driven from the client side. ggml-RPC through the port
// is in native-port.test.ts.
const host = { args: [new URL('./fixtures/echo-host.mjs', import.meta.url).pathname] };
const cleanup: (() => Promise<unknown>)[] = [];
afterEach(async () => {
  for (const fn of cleanup.splice(0).reverse()) await fn();
});

interface Client {
  socket: Socket;
  /** The opening line of the session: what the host received with it. */
  opening: Promise<{ task: Record<string, unknown>; setups: unknown[]; pid: number }>;
  closed: Promise<void>;
}

async function harness(
  size: number,
  queueSize: number,
  extra: { maxPerSource?: number; queueTimeoutMs?: number; idleLingerMs?: number } = {},
) {
  const logger = memoryLogger();
  const pool = new RpcPool({
    host,
    size,
    queueSize,
    maxPerSource: extra.maxPerSource ?? size + queueSize,
    queueTimeoutMs: extra.queueTimeoutMs ?? 30_000,
    idleLingerMs: extra.idleLingerMs ?? 10_000,
    warmDelayMs: 0,
    logger,
  });
  cleanup.push(() => pool.close(500));
  const ended: string[] = [];
  const aborted: string[] = [];
  // The server side of each connection goes to the pool, as the merged port hands over its sockets.
  const server: Server = createServer({ pauseOnConnect: true }, (socket) => {
    const label = `session-${socket.remotePort}`;
    const admitted = pool.admit({
      label,
      source: socket.remoteAddress ?? '',
      start: () => ({
        task: { label },
        handle: (socket as unknown as { _handle: object })._handle,
      }),
      sent: () => socket.destroy(),
      abort: () => {
        aborted.push(label);
        socket.destroy();
      },
      ended: () => ended.push(label),
    });
    if (!admitted) socket.destroy();
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  cleanup.push(() => new Promise((r) => server.close(r)));
  const portNumber = (server.address() as { port: number }).port;
  const open = async (localAddress = '127.0.0.1'): Promise<Client> => {
    const socket = connect({ port: portNumber, host: '127.0.0.1', localAddress });
    socket.on('error', () => {});
    await once(socket, 'connect');
    cleanup.push(async () => socket.destroy());
    let text = '';
    const opening = new Promise<Client['opening'] extends Promise<infer T> ? T : never>((resolve) => {
      const onData = (d: Buffer) => {
        text += d.toString();
        const nl = text.indexOf('\n');
        if (nl >= 0) {
          socket.off('data', onData);
          resolve(JSON.parse(text.slice(0, nl)));
        }
      };
      socket.on('data', onData);
    });
    const closed = new Promise<void>((resolve) => socket.once('close', () => resolve()));
    return { socket, opening, closed };
  };
  return { pool, logger, open, ended, aborted };
}

describe('RpcPool (child process hosts)', () => {
  it('size 2, queue 1: the 4th session is refused, the first two keep running, the queued one starts when a slot frees', async () => {
    const h = await harness(2, 1);
    const [a, b, c] = [await h.open(), await h.open(), await h.open()];
    await a.opening;
    await b.opening;
    await vi.waitFor(() => expect(h.pool.stats()).toMatchObject({ active: 2, queued: 1, refused: 0 }));
    const d = await h.open();
    await d.closed;
    expect(h.pool.stats()).toMatchObject({ active: 2, queued: 1, refused: 1 });
    expect(
      h.logger.lines.filter((l) => l.level === 'warn' && l.message.includes('refused ggml-RPC')),
    ).toHaveLength(1);

    a.socket.write('e');
    const third = await c.opening;
    expect(third.task.label).toMatch(/^session-/);
    expect(h.pool.stats()).toMatchObject({ active: 2, queued: 0, served: 1 });
    b.socket.write('e');
    c.socket.write('pe');
    await vi.waitFor(() => expect(h.pool.stats().served).toBe(3));
    expect(h.pool.stats()).toMatchObject({ active: 0, queued: 0, refused: 1, failed: 0, crashed: 0 });
    expect(h.pool.stats().bytesIn).toBe(1 + 1 + 2);
    expect(h.pool.stats().setTensorBytes).toBe(300);
    expect(h.ended).toHaveLength(3);
  });

  it('keeps at most one idle host warm, and reuses it', async () => {
    const h = await harness(3, 0, { idleLingerMs: 200 });
    h.pool.warm();
    await vi.waitFor(() => expect(h.pool.stats().hosts).toBe(1));
    const clients = [await h.open(), await h.open(), await h.open()];
    const pids = await Promise.all(clients.map(async (c) => (await c.opening).pid));
    expect(new Set(pids).size).toBe(3);
    // three busy and none idle: a fourth process waits warm
    await vi.waitFor(() => expect(h.pool.stats().hosts).toBe(4));
    for (const c of clients) c.socket.write('e');
    await vi.waitFor(() => expect(h.pool.stats()).toMatchObject({ served: 3, hosts: 1 }));
    const live = h.pool.hostPids();
    const again = await h.open();
    expect(live).toContain((await again.opening).pid);
    // the warm one went to work: one more is started to wait warm
    await vi.waitFor(() => expect(h.pool.stats()).toMatchObject({ hosts: 2, hostsSpawned: 5 }));
  });

  it('short sessions one after another reuse the warm host instead of starting a process each', async () => {
    const h = await harness(2, 0);
    h.pool.warm();
    for (let i = 0; i < 10; i++) {
      const c = await h.open();
      await c.opening;
      c.socket.write('e');
      await vi.waitFor(() => expect(h.pool.stats().served).toBe(i + 1));
    }
    expect(h.pool.stats().hostsSpawned).toBeLessThanOrEqual(2);
  });

  it('a host that aborts ends its session only: counted as crashed, logged with the signal, replaced', async () => {
    const h = await harness(2, 0);
    const a = await h.open();
    const b = await h.open();
    const pidA = (await a.opening).pid;
    await b.opening;
    a.socket.write('p');
    await vi.waitFor(() => expect(h.pool.stats().commands).toBe(1));
    a.socket.write('k');
    await a.closed;
    await vi.waitFor(() => expect(h.pool.stats()).toMatchObject({ crashed: 1, active: 1 }));
    expect(h.pool.hostPids()).not.toContain(pidA);
    expect(
      h.logger.lines.some(
        (l) => l.level === 'error' && l.message.includes(`process ${pidA} killed by SIGABRT`),
      ),
    ).toBe(true);
    // the other session is untouched and a new one is served
    b.socket.write('z');
    await vi.waitFor(() => expect(b.socket.bytesRead).toBeGreaterThan(0));
    const c = await h.open();
    await c.opening;
    c.socket.write('x');
    await c.closed;
    await vi.waitFor(() => expect(h.pool.stats().crashed).toBe(2));
    expect(h.logger.lines.some((l) => l.message.includes('exited with code 3'))).toBe(true);
    b.socket.write('e');
    await vi.waitFor(() => expect(h.pool.stats()).toMatchObject({ served: 1, active: 0 }));
    // counters of the crashed session are kept
    expect(h.pool.stats().commands).toBeGreaterThanOrEqual(1);
  });

  it('counts how sessions ended and the refusals hosts report, with one line per refused session', async () => {
    const h = await harness(1, 0);
    const a = await h.open();
    await a.opening;
    a.socket.write('r');
    await vi.waitFor(() => expect(h.pool.stats().served).toBe(1));
    const b = await h.open();
    await b.opening;
    b.socket.write('e');
    await vi.waitFor(() => expect(h.pool.stats().served).toBe(2));
    expect(h.pool.stats()).toMatchObject({ ended: { refused: 1, client: 1 }, refusals: 1, failed: 0 });
    const lines = h.logger.lines.filter((l) => l.level === 'warn' && l.message.includes('ended by the host'));
    expect(lines).toHaveLength(1);
    expect(lines[0]!.message).toContain('refused (GRAPH_COMPUTE): node id 0');
  });

  it('a job whose start() throws is aborted (its caller lets go of the connection) and counted failed', async () => {
    const h = await harness(1, 0);
    const calls: string[] = [];
    const admitted = h.pool.admit({
      label: 'gone',
      source: '127.0.0.1',
      start: () => {
        throw new Error('connection closed while queued');
      },
      sent: () => calls.push('sent'),
      abort: () => calls.push('abort'),
      ended: () => calls.push('ended'),
    });
    expect(admitted).toBe(true);
    expect(calls).toEqual(['abort']);
    expect(h.pool.stats()).toMatchObject({ failed: 1, active: 0, queued: 0 });
    const a = await h.open();
    await a.opening;
  });

  it('counts a failed session and keeps serving', async () => {
    const h = await harness(1, 0);
    const a = await h.open();
    await a.opening;
    a.socket.write('f');
    await vi.waitFor(() => expect(h.pool.stats()).toMatchObject({ failed: 1, active: 0 }));
    expect(h.logger.lines.some((l) => l.level === 'error' && l.message.includes('failed'))).toBe(true);
    const b = await h.open();
    await b.opening;
    b.socket.write('e');
    await vi.waitFor(() => expect(h.pool.stats().served).toBe(1));
  });

  it('one source address runs at most maxPerSource sessions: its next ones wait, another address is served, half the queue is its share', async () => {
    const h = await harness(4, 4, { maxPerSource: 2 });
    const mine = [await h.open(), await h.open()];
    for (const c of mine) await c.opening;
    const waiting = [await h.open(), await h.open()];
    await vi.waitFor(() => expect(h.pool.stats()).toMatchObject({ active: 2, queued: 2, refused: 0 }));
    // its share is full (2 running + 2 waiting): the next one is refused
    const refused = await h.open();
    await refused.closed;
    expect(h.pool.stats()).toMatchObject({ refused: 1, refusedBySource: 1 });
    // another address goes past the waiting ones
    const other = await h.open('127.0.0.2');
    await other.opening;
    expect(h.pool.stats()).toMatchObject({ active: 3, queued: 2 });
    // one of mine ends: the first waiting one of mine starts
    mine[0]!.socket.write('e');
    await waiting[0]!.opening;
    expect(h.pool.stats()).toMatchObject({ active: 3, queued: 1 });
  });

  it('a queued connection is closed after queueTimeoutMs and its source slot freed', async () => {
    const h = await harness(1, 2, { queueTimeoutMs: 300 });
    const a = await h.open();
    await a.opening;
    const waiting = await h.open();
    await vi.waitFor(() => expect(h.pool.stats().queued).toBe(1));
    const t0 = Date.now();
    await waiting.closed;
    expect(Date.now() - t0).toBeLessThan(2000);
    expect(h.pool.stats()).toMatchObject({ queued: 0, queueTimeouts: 1, active: 1 });
    expect(h.aborted).toHaveLength(1);
    expect(h.logger.lines.some((l) => l.level === 'warn' && l.message.includes('no free host'))).toBe(true);
  });

  it('setup broadcasts reach every host before its sessions, including hosts spawned later', async () => {
    const h = await harness(2, 0);
    h.pool.warm();
    h.pool.broadcast({ weights: '/a.gguf' });
    const a = await h.open();
    expect((await a.opening).setups).toEqual([{ weights: '/a.gguf' }]);
    h.pool.broadcast({ weights: '/b.gguf' });
    const b = await h.open();
    expect((await b.opening).setups).toEqual([{ weights: '/a.gguf' }, { weights: '/b.gguf' }]);
  });

  it('close waits for running sessions, then kills their hosts at the timeout; no host outlives it', async () => {
    const h = await harness(2, 1);
    const a = await h.open();
    await a.opening;
    const queued = [await h.open(), await h.open()];
    await vi.waitFor(() => expect(h.pool.stats().queued).toBe(1));
    const pids = h.pool.hostPids();
    const t0 = Date.now();
    await h.pool.close(300);
    expect(Date.now() - t0).toBeLessThan(3000);
    await a.closed;
    expect(h.aborted).toHaveLength(1);
    for (const pid of pids) expect(() => process.kill(pid, 0)).toThrow();
    expect(h.pool.stats().hosts).toBe(0);
    void queued;
  });

  it('close resolves soon after the running sessions end', async () => {
    const h = await harness(2, 0);
    const a = await h.open();
    await a.opening;
    const closing = h.pool.close(10_000);
    setTimeout(() => a.socket.write('e'), 100);
    const t0 = Date.now();
    await closing;
    expect(Date.now() - t0).toBeLessThan(2500);
    expect(h.pool.stats().served).toBe(1);
  });
});
