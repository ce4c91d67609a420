import { connect } from 'node:net';
import fc from 'fast-check';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { decodePayload, encodePayload } from '../src/codec.js';
import { ERROR_CODES } from '../src/errors.js';
import { HydraClient, HydraError, type HydraPort, OPCODES, type OpcodeName } from '../src/index.js';
import { frame, memoryLogger, rawExchange, splitFrames, startPort } from './helpers.js';

const opened: HydraPort[] = [];
const clients: HydraClient[] = [];
afterEach(async () => {
  await Promise.all(clients.splice(0).map((c) => c.close()));
  await Promise.all(opened.splice(0).map((p) => p.close()));
});

async function serve(options: Parameters<typeof startPort>[0] = {}) {
  const started = await startPort({ shutdownTimeoutMs: 2000, ...options });
  opened.push(started.port);
  return started;
}

async function client(portNumber: number, options: Partial<Parameters<typeof HydraClient.connect>[0]> = {}) {
  const c = await HydraClient.connect({ port: portNumber, timeoutMs: 3000, ...options });
  clients.push(c);
  return c;
}

// Echo handlers: every defined opcode answers with its name and the request it saw.
function echoHandlers() {
  const handlers: Partial<Record<OpcodeName, (req: Record<string, unknown>) => unknown>> = {};
  for (const name of Object.keys(OPCODES) as OpcodeName[]) {
    if (name === 'PIPELINE_ATTACH') continue;
    handlers[name] = (req) => ({ op: name, req });
  }
  return handlers;
}

describe('first-byte dispatch', () => {
  it('routes every defined opcode to its handler, in JSON and MessagePack', async () => {
    const { portNumber } = await serve({ handlers: echoHandlers() });
    for (const encoding of ['json', 'msgpack'] as const) {
      const c = await client(portNumber, { encoding });
      for (const [name, op] of Object.entries(OPCODES)) {
        if (name === 'PIPELINE_ATTACH') continue;
        const reply = await c.request(op, { n: op });
        expect(reply).toEqual({ success: true, op: name, req: { n: op } });
      }
    }
  });

  it.each([
    0x00, 0x2f, 0x47, 0xff, 0x0e,
  ])('closes a connection opening with 0x%s without a reply', async (byte) => {
    const { port, portNumber } = await serve({ handlers: echoHandlers() });
    const result = await rawExchange(portNumber, frame(byte, '{}'), 2000);
    expect(result).toEqual({ received: Buffer.alloc(0), closed: true });
    const stats = port.stats().connections;
    if (byte === 0x0e) expect(stats.rpcNotServed).toBe(1);
    else expect(stats.badFirstByte).toBe(1);
  });

  it('closes a connection that sends nothing within the first-byte timeout', async () => {
    const { port, portNumber } = await serve({ firstByteTimeoutMs: 150 });
    const started = Date.now();
    const result = await rawExchange(portNumber, Buffer.alloc(0), 3000);
    expect(result.closed).toBe(true);
    expect(Date.now() - started).toBeLessThan(2000);
    expect(port.stats().connections.noFirstByte).toBe(1);
  });

  it('refuses a peer outside the allowlist before reading', async () => {
    const logger = memoryLogger();
    const { port, portNumber } = await serve({
      allowFrom: ['127.0.0.1/32'],
      handlers: echoHandlers(),
      logger,
    });
    const refused = await rawExchange(portNumber, frame(0x31, '{}'), 2000, '127.0.0.2');
    expect(refused).toEqual({ received: Buffer.alloc(0), closed: true });
    const rpcRefused = await rawExchange(
      portNumber,
      Buffer.from([0x0e, 0, 0, 0, 0, 0, 0, 0, 0]),
      2000,
      '127.0.0.2',
    );
    expect(rpcRefused).toEqual({ received: Buffer.alloc(0), closed: true });
    expect(port.stats().connections.refusedByAllowlist).toBe(2);
    // refusals of one kind are logged at most once a second (the count says how many)
    expect(logger.lines.filter((l) => l.level === 'warn' && l.message.includes('127.0.0.2'))).toHaveLength(1);
    const allowed = await rawExchange(portNumber, frame(0x31, '{}'), 300, '127.0.0.1');
    expect(splitFrames(allowed.received)).toHaveLength(1);
  });
});

describe('Hydra session', () => {
  it('answers pipelined requests in order, even when handlers finish out of order', async () => {
    const { portNumber } = await serve({
      handlers: {
        CONFIGURE: async (req) => {
          await new Promise((r) => setTimeout(r, Number(req.delay)));
          return { delay: req.delay };
        },
      },
    });
    const c = await client(portNumber);
    const delays = [40, 0, 25, 5, 0, 10];
    const replies = await Promise.all(delays.map((delay) => c.request(OPCODES.CONFIGURE, { delay })));
    expect(replies.map((r) => r.delay)).toEqual(delays);
  });

  it('answers in the request encoding; an empty payload gets JSON', async () => {
    const { portNumber } = await serve({ handlers: { STATUS: () => ({ state: 'empty' }) } });
    const bytes = Buffer.concat([
      frame(0x31, ''),
      frame(0x31, encodePayload({}, 'msgpack')),
      frame(0x31, ' {}'),
    ]);
    const { received } = await rawExchange(portNumber, bytes, 400);
    const frames = splitFrames(received);
    expect(frames.map((f) => decodePayload(f.payload).encoding)).toEqual(['json', 'msgpack', 'json']);
    for (const f of frames) expect(decodePayload(f.payload).value).toEqual({ state: 'empty', success: true });
  });

  it('keeps the connection after a bad payload or an unknown opcode', async () => {
    const { port, portNumber } = await serve({ handlers: echoHandlers() });
    const c = await client(portNumber);
    const bad = await c.requestRaw(0x31, Buffer.from('[1]'));
    expect(bad).toMatchObject({ success: false, error: { code: 'HYDRA_ERR_BAD_PAYLOAD' } });
    const unknown = await c.request(0x32, {});
    expect(unknown).toMatchObject({ success: false, error: { code: 'HYDRA_ERR_UNKNOWN_OPCODE' } });
    expect(await c.request(0x31, {})).toMatchObject({ success: true, op: 'STATUS' });
    expect(port.stats().hydra.errors).toEqual({ HYDRA_ERR_BAD_PAYLOAD: 1, HYDRA_ERR_UNKNOWN_OPCODE: 1 });
  });

  it('answers a frame over the limit with HYDRA_ERR_FRAME_TOO_LARGE and closes', async () => {
    const { portNumber } = await serve({ maxFrameBytes: 1024, handlers: echoHandlers() });
    const header = Buffer.alloc(9);
    header[0] = 0x40;
    header.writeBigUInt64LE(1025n, 1);
    const result = await rawExchange(portNumber, Buffer.concat([frame(0x31, '{}'), header]), 2000);
    const frames = splitFrames(result.received);
    expect(frames.map((f) => f.opcode)).toEqual([0x31, 0x40]);
    expect(decodePayload(frames[1]!.payload).value).toMatchObject({
      success: false,
      error: { code: 'HYDRA_ERR_FRAME_TOO_LARGE' },
    });
    expect(result.closed).toBe(true);
    const c = await client(portNumber);
    await expect(c.configure({ x: 'y'.repeat(2000) })).rejects.toMatchObject({
      code: 'HYDRA_ERR_FRAME_TOO_LARGE',
    });
  });

  it('delivers every reply before a FRAME_TOO_LARGE close, even with client bytes still unread', async () => {
    // Closing a socket with unread input makes the kernel send RST at once, which throws away the
    // replies still in the server's send queue (the client reads slowly here, so megabytes wait
    // there). The session lingers instead: it reads and drops input until the client closes.
    const { portNumber } = await serve({ maxFrameBytes: 1 << 20, handlers: echoHandlers() });
    const header = Buffer.alloc(9);
    header[0] = 0x40;
    header.writeBigUInt64LE(BigInt((1 << 20) + 1), 1);
    const big = JSON.stringify({ blob: 'x'.repeat(400_000) });
    const requests = Array.from({ length: 20 }, () => frame(0x40, big));
    const junk = Buffer.alloc(256 * 1024, 0x41);
    const received = await new Promise<Buffer>((resolve, reject) => {
      const chunks: Buffer[] = [];
      const socket = connect({ port: portNumber, host: '127.0.0.1' }, () => {
        socket.write(Buffer.concat([...requests, header, junk]));
        socket.pause();
        setTimeout(() => socket.resume(), 300);
      });
      socket.on('data', (c) => chunks.push(c));
      socket.on('error', (err: NodeJS.ErrnoException) =>
        err.code === 'ECONNRESET' || err.code === 'EPIPE' ? undefined : reject(err),
      );
      socket.on('close', () => resolve(Buffer.concat(chunks)));
    });
    const frames = splitFrames(received);
    expect(frames.map((f) => f.opcode)).toEqual([...requests.map(() => 0x40), 0x40]);
    expect(decodePayload(frames[20]!.payload).value).toMatchObject({
      error: { code: 'HYDRA_ERR_FRAME_TOO_LARGE' },
    });
  });

  it('closes when a later frame opens with a byte outside 0x30..0x46, after earlier replies', async () => {
    const { portNumber } = await serve({ handlers: echoHandlers() });
    const result = await rawExchange(portNumber, Buffer.concat([frame(0x31, '{}'), frame(0x0e, '')]), 2000);
    expect(splitFrames(result.received).map((f) => f.opcode)).toEqual([0x31]);
    expect(result.closed).toBe(true);
  });

  it('closes a connection whose frame stops arriving', async () => {
    const { port, portNumber } = await serve({ readTimeoutMs: 150, handlers: echoHandlers() });
    const partialHeader = await rawExchange(portNumber, frame(0x31, '{}').subarray(0, 4), 3000);
    expect(partialHeader).toEqual({ received: Buffer.alloc(0), closed: true });
    const partialPayload = await rawExchange(portNumber, frame(0x31, '{"a":1}').subarray(0, 12), 3000);
    expect(partialPayload).toEqual({ received: Buffer.alloc(0), closed: true });
    expect(port.stats().hydra.readTimeouts).toBe(2);
  });

  it('turns handler failures into error replies and keeps serving', async () => {
    const logger = memoryLogger();
    const { portNumber } = await serve({
      logger,
      handlers: {
        CONFIGURE: () => {
          throw new HydraError('HYDRA_ERR_T4_FIELD', 'port is start-only', { keys: ['port'] });
        },
        PLAN: async () => {
          throw new TypeError('boom');
        },
        STATUS: () => 42,
        HELLO: () => ({ big: 10n }),
      },
    });
    const c = await client(portNumber);
    await expect(c.configure({ port: 1 })).rejects.toMatchObject({
      code: 'HYDRA_ERR_T4_FIELD',
      keys: ['port'],
    });
    await expect(c.plan({})).rejects.toMatchObject({ code: 'HYDRA_ERR_INTERNAL' });
    await expect(c.status()).rejects.toMatchObject({ code: 'HYDRA_ERR_INTERNAL' });
    await expect(c.hello()).rejects.toMatchObject({ code: 'HYDRA_ERR_INTERNAL' });
    await expect(c.stateGet()).rejects.toMatchObject({ code: 'HYDRA_ERR_NO_HANDLER' });
    await expect(c.pipelineAttach()).rejects.toMatchObject({ code: 'HYDRA_ERR_RETIRED' });
    expect(
      logger.lines.some((l) => l.level === 'error' && (l.fields?.err as Error)?.message === 'boom'),
    ).toBe(true);
  });

  it('moves state chunks as bytes in both encodings', async () => {
    const state = Buffer.from(Array.from({ length: 1000 }, (_, i) => (i * 7) % 256));
    let uploaded: unknown;
    const { portNumber } = await serve({
      handlers: {
        STATE_GET: (req) => ({
          total: state.byteLength,
          offset: req.offset ?? 0,
          data: state.subarray(0, 100),
        }),
        STATE_PUT: (req) => {
          uploaded = req.data;
          return { received: (req.data as Buffer).byteLength, complete: false };
        },
      },
    });
    for (const encoding of ['json', 'msgpack'] as const) {
      const c = await client(portNumber, { encoding });
      const got = await c.stateGet({ offset: 0 });
      expect(Buffer.compare(Buffer.from(got.data), state.subarray(0, 100))).toBe(0);
      expect(await c.statePut({ offset: 0, total: 1000, data: state })).toEqual({
        success: true,
        received: 1000,
        complete: false,
      });
      expect(Buffer.isBuffer(uploaded) && Buffer.compare(uploaded, state)).toBe(0);
    }
    const c = await client(portNumber);
    await expect(c.request(OPCODES.STATE_PUT, { offset: 0, total: 1, data: '%%%' })).resolves.toMatchObject({
      success: false,
      error: { code: 'HYDRA_ERR_BAD_VALUE', keys: ['data'] },
    });
  });

  it('survives fuzzed and truncated streams: a documented error or a close, never an exception', async () => {
    const { port, portNumber } = await serve({
      readTimeoutMs: 100,
      maxFrameBytes: 4096,
      handlers: echoHandlers(),
    });
    const validFrame = fc
      .record({
        op: fc.integer({ min: 0x30, max: 0x46 }),
        body: fc.oneof(fc.uint8Array({ maxLength: 40 }), fc.constant(Buffer.from('{"a":1}'))),
      })
      .map(({ op, body }) => frame(op, body));
    const stream = fc.oneof(
      fc.uint8Array({ minLength: 1, maxLength: 64 }).map((b) => Buffer.from([0x31, ...b])),
      fc.array(validFrame, { minLength: 1, maxLength: 4 }).chain((frames) => {
        const all = Buffer.concat(frames);
        return fc.integer({ min: 1, max: all.byteLength }).map((cut) => all.subarray(0, cut));
      }),
    );
    // Any documented code but INTERNAL (e.g. RETIRED for a well-formed 0x46 frame).
    const documented = new Set<string>(ERROR_CODES.filter((code) => code !== 'HYDRA_ERR_INTERNAL'));
    await fc.assert(
      fc.asyncProperty(stream, async (bytes) => {
        const { received } = await rawExchange(portNumber, bytes, 400);
        for (const f of splitFrames(received)) {
          const reply = decodePayload(f.payload).value as { success: boolean; error?: { code: string } };
          if (!reply.success) expect(documented.has(reply.error!.code)).toBe(true);
        }
      }),
      { numRuns: 40 },
    );
    const c = await client(portNumber);
    expect(await c.request(0x31, {})).toMatchObject({ success: true });
    expect(port.stats().hydra.errors.HYDRA_ERR_INTERNAL).toBeUndefined();
  }, 60_000);
});

describe('shutdown', () => {
  it('closes idle sessions at once and busy ones within 1 s of their end', async () => {
    let release!: () => void;
    const { port, portNumber } = await startPort({
      handlers: {
        STATUS: () => ({ state: 'ready' }),
        CONFIGURE: () =>
          new Promise((resolve) => {
            release = () => resolve({ tier: 'none' });
          }),
      },
    });
    const idle = await client(portNumber);
    await idle.status();
    const busy = await client(portNumber);
    const pending = busy.configure({});
    await new Promise((r) => setTimeout(r, 50));
    let closedAt = 0;
    const closing = port.close().then(() => {
      closedAt = Date.now();
    });
    await new Promise((r) => setTimeout(r, 200));
    expect(idle.closed).toBe(true);
    expect(busy.closed).toBe(false);
    expect(closedAt).toBe(0);
    await expect(rawExchange(portNumber, frame(0x31, '{}'), 300)).resolves.toMatchObject({
      received: Buffer.alloc(0),
    });
    const endedAt = Date.now();
    release();
    await expect(pending).resolves.toMatchObject({ tier: 'none' });
    await closing;
    expect(closedAt - endedAt).toBeLessThan(1000);
    await vi.waitFor(() => expect(busy.closed).toBe(true), { timeout: 500 });
  });

  it('cuts a session still busy at the shutdown timeout', async () => {
    const { port, portNumber } = await startPort({
      shutdownTimeoutMs: 300,
      handlers: { CONFIGURE: () => new Promise(() => {}) },
    });
    const c = await client(portNumber);
    const pending = c.configure({}).catch((err: unknown) => Promise.reject(err));
    pending.catch(() => {});
    await new Promise((r) => setTimeout(r, 50));
    const started = Date.now();
    await port.close();
    expect(Date.now() - started).toBeLessThan(1300);
    await expect(pending).rejects.toMatchObject({ code: 'HYDRA_ERR_CONNECTION_CLOSED' });
  });
});

describe('client', () => {
  it('times out a request and still matches later replies in order', async () => {
    const { portNumber } = await serve({
      handlers: {
        CONFIGURE: (req) => new Promise((r) => setTimeout(() => r({ n: req.n }), Number(req.wait))),
      },
    });
    const c = await client(portNumber);
    const slow = c.request(OPCODES.CONFIGURE, { n: 1, wait: 300 }, { timeoutMs: 50 });
    const next = c.request(OPCODES.CONFIGURE, { n: 2, wait: 0 });
    await expect(slow).rejects.toMatchObject({ code: 'HYDRA_ERR_TIMEOUT' });
    await expect(next).resolves.toMatchObject({ n: 2 });
  });

  it('rejects pending requests when the server closes', async () => {
    const { port, portNumber } = await startPort({
      shutdownTimeoutMs: 100,
      handlers: { CONFIGURE: () => new Promise(() => {}) },
    });
    const c = await client(portNumber);
    const pending = c.configure({});
    pending.catch(() => {});
    await port.close();
    await expect(pending).rejects.toMatchObject({ code: 'HYDRA_ERR_CONNECTION_CLOSED' });
    await expect(c.status()).rejects.toMatchObject({ code: 'HYDRA_ERR_CONNECTION_CLOSED' });
  });

  it('fails to connect with HYDRA_ERR_CONNECTION_CLOSED when nothing listens', async () => {
    const { port, portNumber } = await startPort();
    await port.close();
    await expect(HydraClient.connect({ port: portNumber })).rejects.toMatchObject({
      code: 'HYDRA_ERR_CONNECTION_CLOSED',
    });
  });
});

describe('options', () => {
  it.each([
    [{ poolSize: 0 }, 'poolSize'],
    [{ maxFrameBytes: -1 }, 'maxFrameBytes'],
    [{ allowFrom: ['300.0.0.1'] }, 'allowFrom'],
    [{ port: 70000 }, 'port'],
    [{ rpcHost: { args: ['/x.mjs'] } }, 'native'],
    [{ native: { peekFirstByte: async (): Promise<number> => -1 } }, 'rpcHost'],
    [{ native: { peekFirstByte: async (): Promise<number> => -1 }, rpcHost: { args: 'x' } }, 'rpcHost'],
    [{ maxConnectionsPerSource: 0 }, 'maxConnectionsPerSource'],
    [{ maxHydraSessions: 1.5 }, 'maxHydraSessions'],
    [{ maxHydraSessionsPerSource: -2 }, 'maxHydraSessionsPerSource'],
    [{ idleTimeoutMs: 0 }, 'idleTimeoutMs'],
    [{ queueTimeoutMs: 'x' }, 'queueTimeoutMs'],
    [{ rpcMaxPerSource: 0 }, 'rpcMaxPerSource'],
  ])('rejects %j', async (options, key) => {
    const { HydraPort } = await import('../src/index.js');
    try {
      new HydraPort(options as never);
      expect.unreachable();
    } catch (err) {
      expect((err as HydraError).code).toBe('HYDRA_ERR_BAD_OPTION');
      expect((err as HydraError).keys).toEqual([key]);
    }
  });

  it('answers the retired PIPELINE_ATTACH itself and takes no handler for it', async () => {
    const { HydraPort } = await import('../src/index.js');
    const retired = () => ({ attached: true });
    expect(() => new HydraPort({ handlers: { PIPELINE_ATTACH: retired } })).toThrow(
      expect.objectContaining({ code: 'HYDRA_ERR_BAD_OPTION', keys: ['handlers.PIPELINE_ATTACH'] }),
    );
    const { port, portNumber } = await serve();
    expect(() => port.handle('PIPELINE_ATTACH', retired)).toThrow(
      expect.objectContaining({ code: 'HYDRA_ERR_BAD_OPTION' }),
    );
    const c = await client(portNumber);
    await expect(c.pipelineAttach()).rejects.toMatchObject({ code: 'HYDRA_ERR_RETIRED' });
  });

  it('serves on a dual-stack socket: ::ffff:127.0.0.1 passes the loopback allowlist', async () => {
    const { port, portNumber } = await serve({ host: '::', handlers: echoHandlers() });
    const reply = await new Promise<Buffer>((resolve, reject) => {
      const s = connect({ port: portNumber, host: '127.0.0.1' }, () => s.write(frame(0x31, '{}')));
      s.once('data', (d) => {
        resolve(d);
        s.destroy();
      });
      s.on('error', reject);
    });
    expect(splitFrames(reply)).toHaveLength(1);
    expect(port.stats().connections.refusedByAllowlist).toBe(0);
  });
});
