import { execFile } from 'node:child_process';
import { connect, createServer, type Server, type Socket } from 'node:net';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { completion, type EngineProcess, REPO, sleep, spawnEngine, tinyModel } from './lib/engine.js';
import { recordFigures } from './lib/figures.js';
import { CMD, command, RPC_TENSOR_BYTES, RpcConn } from './lib/ggml-rpc.js';

/**
 * A bounded ggml-RPC fuzzer. A recording proxy on loopback sits between a stock llama.cpp client
 * (the tiny model, every layer on the peer) and the engine's merged port and keeps every message of
 * that real session. Each case replays the session on a fresh connection (buffer ids and data
 * addresses remapped to the new session's, so the replay is valid) up to one message, which it
 * mutates (bit flips; node, source and view ids; ne, nb, op, type, buffer, data, offsets; size
 * headers; truncation), then sends a few more. The engine must stay up through every case, answer
 * HTTP, and afterwards an unmutated replay and a fresh stock client must still compute the right
 * logits.
 */

const CASES = 300;
const AFTER = 6; // messages sent after the mutated one
const BUDGET_MS = 220_000; // 9-63 s on an idle 2-core machine; 145 cases in 150 s beside other test runs

interface Msg {
  cmd: number;
  payload: Buffer;
  /** Upstream's reply payload, when the command has one. */
  reply?: Buffer;
}

/** Reply sizes of the commands that have one (GET_TENSOR: its requested size). */
function replySize(cmd: number, payload: Buffer): number | undefined {
  switch (cmd) {
    case CMD.HELLO:
      return 28;
    case CMD.ALLOC_BUFFER:
    case CMD.GET_DEVICE_MEMORY:
      return 16;
    case CMD.GET_ALIGNMENT:
    case CMD.GET_MAX_SIZE:
    case CMD.BUFFER_GET_BASE:
    case CMD.GET_ALLOC_SIZE:
      return 8;
    case CMD.DEVICE_COUNT:
      return 4;
    case CMD.SET_TENSOR_HASH:
    case CMD.COPY_TENSOR:
      return 1;
    case CMD.GET_TENSOR:
      return Number(payload.readBigUInt64LE(RPC_TENSOR_BYTES + 8));
    default:
      return undefined;
  }
}

/** Reads exact byte counts from a socket. */
class Reader {
  #buf: Buffer = Buffer.alloc(0);
  #wait: (() => void) | undefined;
  #ended = false;
  constructor(s: Socket) {
    s.on('data', (d: Buffer) => {
      this.#buf = this.#buf.byteLength ? Buffer.concat([this.#buf, d]) : d;
      this.#wait?.();
    });
    s.on('close', () => {
      this.#ended = true;
      this.#wait?.();
    });
    s.on('error', () => {});
  }
  async read(n: number): Promise<Buffer | undefined> {
    while (this.#buf.byteLength < n) {
      if (this.#ended) return undefined;
      await new Promise<void>((r) => {
        this.#wait = r;
      });
      this.#wait = undefined;
    }
    const out = this.#buf.subarray(0, n);
    this.#buf = this.#buf.subarray(n);
    return out;
  }
}

/** A sequential recording relay: every client message, and upstream's reply to it. */
async function startRecorder(target: number): Promise<{ port: number; sessions: Msg[][]; server: Server }> {
  const sessions: Msg[][] = [];
  const server = createServer((client) => {
    const up = connect({ port: target, host: '127.0.0.1', noDelay: true });
    client.setNoDelay(true);
    const fromClient = new Reader(client);
    const fromUp = new Reader(up);
    const msgs: Msg[] = [];
    sessions.push(msgs);
    const end = () => {
      client.destroy();
      up.destroy();
    };
    void (async () => {
      while (true) {
        const head = await fromClient.read(9);
        if (!head) break;
        const payload = await fromClient.read(Number(head.readBigUInt64LE(1)));
        if (!payload) break;
        const msg: Msg = { cmd: head[0]!, payload: Buffer.from(payload) };
        msgs.push(msg);
        up.write(Buffer.concat([head, payload]));
        const size = replySize(msg.cmd, payload);
        if (size === undefined) continue;
        const rh = await fromUp.read(8);
        const rp = rh && (await fromUp.read(Number(rh.readBigUInt64LE(0))));
        if (!rh || !rp) break;
        msg.reply = Buffer.from(rp);
        client.write(Buffer.concat([rh, rp]));
      }
      end();
    })();
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const addr = server.address();
  if (addr === null || typeof addr === 'string') throw new Error('no port');
  return { port: addr.port, sessions, server };
}

/** Offsets of every rpc_tensor inside a message's payload. */
function tensorOffsets(cmd: number, p: Buffer): number[] {
  switch (cmd) {
    case CMD.SET_TENSOR:
    case CMD.SET_TENSOR_HASH:
    case CMD.GET_TENSOR:
    case CMD.INIT_TENSOR:
    case CMD.MEMSET_TENSOR:
      return p.byteLength >= RPC_TENSOR_BYTES ? [0] : [];
    case CMD.COPY_TENSOR:
      return [0, RPC_TENSOR_BYTES];
    case CMD.GET_ALLOC_SIZE:
      return Array.from({ length: 11 }, (_, i) => 4 + i * RPC_TENSOR_BYTES);
    case CMD.GRAPH_COMPUTE: {
      if (p.byteLength < 12) return [];
      const nNodes = p.readUInt32LE(4);
      const at = 8 + 8 * nNodes;
      if (p.byteLength < at + 4) return [];
      const n = p.readUInt32LE(at);
      const out: number[] = [];
      for (let i = 0; i < n && at + 4 + (i + 1) * RPC_TENSOR_BYTES <= p.byteLength; i++)
        out.push(at + 4 + i * RPC_TENSOR_BYTES);
      return out;
    }
    default:
      return [];
  }
}

/** The recorded session's buffer ids and bases, mapped to a replay's as it learns them. */
class Remap {
  readonly ptr = new Map<bigint, bigint>();
  /** recorded buffer id -> [recorded base, replay base] */
  readonly base = new Map<bigint, [bigint, bigint]>();

  rewrite(msg: Msg): Buffer {
    const p = Buffer.from(msg.payload);
    const mapPtr = (at: number) => {
      const v = p.readBigUInt64LE(at);
      const to = this.ptr.get(v);
      if (to !== undefined) p.writeBigUInt64LE(to, at);
      return v;
    };
    if ([CMD.BUFFER_GET_BASE, CMD.FREE_BUFFER, CMD.BUFFER_CLEAR].includes(msg.cmd as 3) && p.byteLength >= 8)
      mapPtr(0);
    for (const at of tensorOffsets(msg.cmd, p)) {
      const buffer = mapPtr(at + 12);
      const b = this.base.get(buffer);
      if (b) p.writeBigUInt64LE(BigInt.asUintN(64, p.readBigUInt64LE(at + 220) - b[0] + b[1]), at + 220);
    }
    return p;
  }

  learn(msg: Msg, sent: Buffer, reply: Buffer): void {
    if (msg.cmd === CMD.ALLOC_BUFFER && msg.reply && reply.byteLength === 16)
      this.ptr.set(msg.reply.readBigUInt64LE(0), reply.readBigUInt64LE(0));
    if (msg.cmd === CMD.BUFFER_GET_BASE && msg.reply && reply.byteLength === 8)
      this.base.set(msg.payload.readBigUInt64LE(0), [msg.reply.readBigUInt64LE(0), reply.readBigUInt64LE(0)]);
    void sent;
  }
}

/** xorshift32: a fixed seed makes every run send the same cases. */
function rng(seed: number) {
  let s = seed >>> 0 || 1;
  const next = () => {
    s ^= s << 13;
    s >>>= 0;
    s ^= s >>> 17;
    s ^= s << 5;
    s >>>= 0;
    return s / 2 ** 32;
  };
  return {
    next,
    int: (n: number) => Math.floor(next() * n),
    pick: <T>(a: readonly T[]) => a[Math.floor(next() * a.length)]!,
  };
}

type Rng = ReturnType<typeof rng>;

const INTERESTING = [
  0n,
  1n,
  2n,
  7n,
  0xffffffffn,
  0x7fffffffn,
  0x80000000n,
  (1n << 32n) + 1n,
  1n << 63n,
  (1n << 64n) - 1n,
];

/** One mutation of a (remapped) message: the bytes to send and what was done. */
function mutate(r: Rng, cmd: number, payload: Buffer): { bytes: Buffer; kind: string; truncated?: boolean } {
  const p = Buffer.from(payload);
  const tensors = tensorOffsets(cmd, p);
  const kinds = [
    'bitflip',
    'size',
    'truncate',
    ...(tensors.length ? ['field', 'field', 'field', 'field'] : []),
  ];
  if (cmd === CMD.GRAPH_COMPUTE) kinds.push('node', 'node', 'counts');
  const kind = r.pick(kinds);
  const u64 = (at: number, v: bigint) =>
    at + 8 <= p.byteLength && p.writeBigUInt64LE(BigInt.asUintN(64, v), at);
  const u32 = (at: number, v: number) => at + 4 <= p.byteLength && p.writeUInt32LE(v >>> 0, at);
  const otherId = () => (tensors.length ? p.readBigUInt64LE(r.pick(tensors)) : 1n);
  switch (kind) {
    case 'bitflip': {
      for (let i = 0, n = 1 + r.int(4); i < n && p.byteLength; i++) {
        const at = r.int(p.byteLength);
        p[at] = p[at]! ^ (1 << r.int(8));
      }
      break;
    }
    case 'field': {
      const t = r.pick(tensors);
      const field = r.pick([
        'id',
        'type',
        'buffer',
        'ne',
        'nb',
        'op',
        'src',
        'view_src',
        'view_offs',
        'data',
        'op_params',
      ]);
      switch (field) {
        case 'id':
          u64(t, r.next() < 0.5 ? 0n : otherId());
          break;
        case 'type':
          u32(t + 8, r.pick([2, 4, 8, 26, 27, 31, 39, 40, 0xffff]));
          break;
        case 'buffer':
          u64(t + 12, r.pick(INTERESTING));
          break;
        case 'ne':
          u32(t + 20 + 4 * r.int(4), Number(r.pick(INTERESTING) & 0xffffffffn) || r.int(1 << 20));
          break;
        case 'nb':
          u32(t + 36 + 4 * r.int(4), r.pick([0, 1, 3, 0xffffffff, 1 << 30, r.int(1 << 16)]));
          break;
        case 'op':
          u32(t + 52, r.int(110));
          break;
        case 'src':
          u64(t + 124 + 8 * r.int(10), r.next() < 0.3 ? r.pick(INTERESTING) : otherId());
          break;
        case 'view_src':
          u64(t + 204, r.next() < 0.3 ? r.pick(INTERESTING) : otherId());
          break;
        case 'view_offs':
          u64(t + 212, r.pick(INTERESTING));
          break;
        case 'data':
          u64(t + 220, p.readBigUInt64LE(t + 220) + r.pick([-4096n, -1n, 1n, 4096n, 1n << 20n, 1n << 40n]));
          break;
        case 'op_params':
          u32(t + 56 + 4 * r.int(16), Number(r.pick(INTERESTING) & 0xffffffffn));
          break;
      }
      return { bytes: command(cmd, p), kind: `field:${field}` };
    }
    case 'node': {
      const n = p.readUInt32LE(4);
      if (n > 0)
        u64(8 + 8 * r.int(n), r.next() < 0.4 ? 0n : r.next() < 0.5 ? otherId() : r.pick(INTERESTING));
      break;
    }
    case 'counts': {
      const at = r.next() < 0.5 ? 4 : 8 + 8 * p.readUInt32LE(4);
      u32(at, p.readUInt32LE(Math.min(at, p.byteLength - 4)) + r.pick([-1, 1, 1000, 0x7fffffff]));
      break;
    }
    case 'size': {
      const claimed =
        BigInt(p.byteLength) + r.pick([-1n, 1n, 8n, 1n << 20n, 1n << 40n, -BigInt(p.byteLength)]);
      return {
        bytes: command(cmd, p, BigInt.asUintN(64, claimed)),
        kind,
        truncated: claimed > BigInt(p.byteLength),
      };
    }
    case 'truncate':
      return { bytes: command(cmd, p).subarray(0, r.int(9 + p.byteLength)), kind, truncated: true };
  }
  return { bytes: command(cmd, p), kind };
}

/**
 * Replays `msgs` on a fresh connection; `at` (when given) is mutated. Returns the replies of the
 * unmutated GET_TENSORs and whether the session stayed open to the end.
 */
async function replay(
  port: number,
  msgs: Msg[],
  mutation?: { at: number; r: Rng },
): Promise<{ sent: number; gets: Buffer[]; closed: boolean; kind?: string }> {
  const conn = await RpcConn.open(port);
  const remap = new Remap();
  const gets: Buffer[] = [];
  let sent = 0;
  let kind: string | undefined;
  const last = mutation ? Math.min(msgs.length, mutation.at + 1 + AFTER) : msgs.length;
  try {
    for (let i = 0; i < last; i++) {
      const msg = msgs[i]!;
      const payload = remap.rewrite(msg);
      let bytes = command(msg.cmd, payload);
      let truncated = false;
      if (mutation && i === mutation.at) {
        const m = mutate(mutation.r, msg.cmd, payload);
        ({ bytes, kind } = m);
        truncated = m.truncated === true;
      }
      conn.write(bytes);
      sent++;
      if (truncated) {
        await conn.waitClosed(100);
        break;
      }
      if (msg.reply === undefined) continue;
      const reply = await conn.reply(mutation && i >= mutation.at ? 250 : 10_000);
      if (reply === undefined) break;
      remap.learn(msg, payload, reply);
      if (msg.cmd === CMD.GET_TENSOR && !(mutation && i >= mutation.at)) gets.push(reply);
    }
    return { sent, gets, closed: conn.closed, kind };
  } finally {
    conn.destroy();
  }
}

const maxAbs = (a: Buffer, b: Buffer) => {
  const x = new Float32Array(a.buffer, a.byteOffset, a.byteLength / 4);
  const y = new Float32Array(b.buffer, b.byteOffset, b.byteLength / 4);
  let d = x.length === y.length ? 0 : Number.POSITIVE_INFINITY;
  for (let i = 0; i < x.length; i++) d = Math.max(d, Math.abs(x[i]! - y[i]!));
  return d;
};

const run = promisify(execFile);
async function stockClient(model: string, endpoint?: string) {
  const fixture = join(REPO, 'packages/native-ggml/test-native/fixtures/rpc-client.mjs');
  const args = [fixture, model, 'Hello world, this is a test', ...(endpoint ? [endpoint, '99'] : [])];
  const { stdout } = await run(process.execPath, args, { timeout: 120_000 });
  return JSON.parse(stdout.trim().split('\n').at(-1)!) as { logits: number[]; generated: number[] };
}

describe('ggml-RPC fuzzing of a recorded real session', () => {
  let model: string;
  let eng: EngineProcess;
  let session: Msg[];
  const figures: Record<string, unknown> = {};

  beforeAll(async () => {
    model = await tinyModel();
    eng = await spawnEngine(['-m', model, '-np', '2', '-t', '1', '-c', '512'], { rpc: true });
    const rec = await startRecorder(eng.rpcPort!);
    await stockClient(model, `127.0.0.1:${rec.port}`);
    await new Promise<void>((r) => rec.server.close(() => r()));
    session = rec.sessions.reduce((a, b) => (b.length > a.length ? b : a));
    const counts: Record<string, number> = {};
    for (const m of session) {
      const name = Object.entries(CMD).find(([, v]) => v === m.cmd)?.[0] ?? String(m.cmd);
      counts[name] = (counts[name] ?? 0) + 1;
    }
    // the ops of the recorded graphs (op ids of the pinned ggml.h), the allowlist's real workload
    const ops: Record<number, number> = {};
    for (const m of session.filter((x) => x.cmd === CMD.GRAPH_COMPUTE))
      for (const at of tensorOffsets(m.cmd, m.payload)) {
        const op = m.payload.readUInt32LE(at + 52);
        ops[op] = (ops[op] ?? 0) + 1;
      }
    Object.assign(figures, {
      recordedMessages: session.length,
      recordedCommands: counts,
      recordedGraphOps: ops,
    });
  }, 120_000);

  afterAll(async () => {
    const log = eng?.log() ?? '';
    figures.refusedSessions = (log.match(/hydra: refused a ggml-RPC/g) ?? []).length;
    const badInput = log.match(/hydra: ended a ggml-RPC session on bad input.*/g) ?? [];
    figures.upstreamEndedOnBadInput = badInput.length;
    if (badInput.length) figures.upstreamBadInput = badInput.slice(0, 5);
    await eng?.stop();
    recordFigures('ggml-rpc-fuzz', figures);
  });

  it('an unmutated replay computes what the recorded session computed', async () => {
    const recorded = session.filter((m) => m.cmd === CMD.GET_TENSOR).map((m) => m.reply!);
    const { gets, closed } = await replay(eng.rpcPort!, session);
    expect(closed).toBe(false);
    expect(gets.length).toBe(recorded.length);
    expect(recorded.length).toBeGreaterThan(0);
    const diff = Math.max(...gets.map((g, i) => maxAbs(g, recorded[i]!)));
    figures.cleanReplayMaxAbsDiff = diff;
    expect(diff).toBeLessThan(1e-4);
  });

  it(`${CASES} mutated replays: the engine stays up and keeps serving`, async () => {
    const r = rng(18);
    // mutate where a hostile client has most to work with: graphs, then tensor commands
    const where = session.map((m, i) => ({ i, m })).filter(({ m }) => m.cmd !== CMD.HELLO);
    const graphs = where.filter(({ m }) => m.cmd === CMD.GRAPH_COMPUTE);
    const tensorCmds = where.filter(({ m }) => tensorOffsets(m.cmd, m.payload).length > 0);
    const started = Date.now();
    let cases = 0;
    let sent = 0;
    let closedByServer = 0;
    const kinds: Record<string, number> = {};
    for (; cases < CASES && Date.now() - started < BUDGET_MS; cases++) {
      const pool = r.next() < 0.5 && graphs.length ? graphs : r.next() < 0.7 ? tensorCmds : where;
      const at = r.pick(pool).i;
      const out = await replay(eng.rpcPort!, session, { at, r });
      sent += out.sent;
      if (out.closed) closedByServer++;
      kinds[out.kind ?? 'none'] = (kinds[out.kind ?? 'none'] ?? 0) + 1;
      expect(eng.exited(), `case ${cases}: ${out.kind} at message ${at}`).toBeUndefined();
      if (cases % 50 === 49) {
        const res = await fetch(`${eng.url}/health`);
        expect(res.status).toBe(200);
      }
    }
    await sleep(100);
    expect(eng.exited()).toBeUndefined();
    // upstream asserting on a session (caught on its thread) means the guard let bad input through
    expect(eng.log().match(/hydra: ended a ggml-RPC session on bad input.*/g) ?? []).toEqual([]);
    Object.assign(figures, {
      cases,
      messagesSent: sent,
      sessionsClosedByEngine: closedByServer,
      crashes: eng.exited() ? 1 : 0,
      fuzzMs: Date.now() - started,
      mutationKinds: kinds,
    });
    // a bounded run: every planned case ran within the time budget
    expect(cases).toBe(CASES);
  }, 300_000);

  it('after the fuzzing, HTTP answers, a clean replay and a stock client compute the right values', async () => {
    expect((await completion(eng.url)).status).toBe(200);
    const recorded = session.filter((m) => m.cmd === CMD.GET_TENSOR).map((m) => m.reply!);
    const { gets } = await replay(eng.rpcPort!, session);
    expect(Math.max(...gets.map((g, i) => maxAbs(g, recorded[i]!)))).toBeLessThan(1e-4);
    const local = await stockClient(model);
    const remote = await stockClient(model, `127.0.0.1:${eng.rpcPort}`);
    const diff = Math.max(...remote.logits.map((v, i) => Math.abs(v - local.logits[i]!)));
    figures.stockClientMaxAbsDiff = diff;
    expect(diff).toBeLessThan(1e-4);
    expect(remote.generated).toEqual(local.generated);
  }, 120_000);
});
