import { execFile } from 'node:child_process';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  completion,
  type EngineProcess,
  metrics,
  REPO,
  rssBytes,
  sleep,
  spawnEngine,
  tinyModel,
} from './lib/engine.js';
import { recordFigures } from './lib/figures.js';
import {
  CMD,
  GGML_TENSOR_FLAG_COMPUTE as COMPUTE,
  command,
  encodeTensor,
  f32Tensor,
  GGML_OP_ADD,
  GGML_OP_ADD_ID,
  GGML_OP_CUSTOM,
  GGML_OP_MUL_MAT,
  GGML_OP_RMS_NORM,
  GGML_OP_SCALE,
  GGML_OP_SET_ROWS,
  GGML_OP_SSM_CONV,
  GGML_TYPE_I32,
  GGML_TYPE_I64,
  graphCompute,
  RPC_TENSOR_BYTES,
  RpcConn,
  type RpcTensor,
  startGuardedServer,
  u32,
  u64,
} from './lib/ggml-rpc.js';

/**
 * Hostile ggml-RPC input through the merged port, modelled on the pinned upstream wire structs and
 * the published llama.cpp RPC advisories (out-of-bounds tensor data/offset in SET/GET/COPY_TENSOR,
 * bogus buffer ids, huge ne/nb, graphs with bad node ids, oversized sizes, truncated commands), and
 * the six crash classes of issue 18 (node id 0, GGML_OP_CUSTOM, ADD of mismatched shapes, SET_ROWS
 * past its buffer, recompute after free, a deep source chain), each of which killed the engine at
 * 47a84fe. native-ggml's guard (hydra_rpc_guard.cpp) now refuses every one before upstream reads it.
 *
 * Each case runs on a fresh connection after HELLO, with one 4 KiB buffer allocated. The outcome
 * must be what the case expects (the session closes, or a reply of the right size), and then the
 * engine must still be alive and serve a ggml-RPC session that computes a graph (ADD) correctly,
 * and an HTTP completion. At the end a stock llama.cpp client computes the tiny model's logits on
 * the engine and gets what it computes locally.
 */

interface Ctx {
  conn: RpcConn;
  buf: bigint;
  base: bigint;
  size: bigint;
}

type Outcome = 'close' | { replyBytes: number };

interface Case {
  name: string;
  /** Sends the hostile bytes; returns what the server must do. */
  send(ctx: Ctx): Outcome;
}

const t = (over: Partial<RpcTensor>, ctx: Ctx): RpcTensor => ({
  ...f32Tensor(1n, ctx.buf, ctx.base, 16),
  ...over,
});
const setTensor = (tensor: RpcTensor, offset: bigint, data: Buffer) =>
  command(CMD.SET_TENSOR, Buffer.concat([encodeTensor(tensor), u64(offset), data]));
const getTensor = (tensor: RpcTensor, offset: bigint, size: bigint) =>
  command(CMD.GET_TENSOR, Buffer.concat([encodeTensor(tensor), u64(offset), u64(size)]));
const graph = graphCompute;
/** c = a + b over three 16-float tensors at base, base + 64 and base + 128. */
const addGraph = (ctx: Ctx) => {
  const a = f32Tensor(1n, ctx.buf, ctx.base, 16);
  const b = f32Tensor(2n, ctx.buf, ctx.base + 64n, 16);
  const c = {
    ...f32Tensor(3n, ctx.buf, ctx.base + 128n, 16),
    op: GGML_OP_ADD,
    src: [1n, 2n],
    flags: COMPUTE,
  };
  return { a, b, c, bytes: graph(0, [3n], [a, b, c]) };
};

/** The case sends `bytes` and the server must close the session. */
const closeAfter =
  (bytes: (ctx: Ctx) => Buffer) =>
  (ctx: Ctx): Outcome => {
    ctx.conn.write(bytes(ctx));
    return 'close';
  };

const SAFE: Case[] = [
  {
    name: 'truncated command header (cmd byte, 3 of 8 size bytes, FIN)',
    send: ({ conn }) => {
      conn.write(Buffer.from([CMD.ALLOC_BUFFER, 12, 0, 0]));
      conn.socket.end();
      return 'close';
    },
  },
  {
    name: 'truncated payload (ALLOC_BUFFER claims 12 bytes, sends 5, FIN)',
    send: ({ conn }) => {
      conn.write(command(CMD.ALLOC_BUFFER, Buffer.alloc(5), 12n));
      conn.socket.end();
      return 'close';
    },
  },
  {
    name: 'fixed-size command with a wrong size (ALLOC_BUFFER of 13 bytes)',
    send: closeAfter(() => command(CMD.ALLOC_BUFFER, Buffer.alloc(13))),
  },
  {
    name: 'command byte past RPC_CMD_COUNT (0x2f)',
    send: closeAfter(() => command(0x2f)),
  },
  { name: 'RPC_CMD_NONE', send: closeAfter(() => command(CMD.NONE)) },
  {
    name: 'a second HELLO',
    send: closeAfter(() => command(CMD.HELLO, Buffer.alloc(24))),
  },
  {
    name: 'SET_TENSOR claiming 2^62 bytes (allocation refused)',
    send: closeAfter(() => command(CMD.SET_TENSOR, Buffer.alloc(0), 1n << 62n)),
  },
  {
    name: 'SET_TENSOR shorter than rpc_tensor + offset',
    send: closeAfter(() => command(CMD.SET_TENSOR, Buffer.alloc(RPC_TENSOR_BYTES))),
  },
  {
    name: 'SET_TENSOR with a bogus buffer id',
    send: closeAfter((ctx) => setTensor(t({ buffer: 0xdeadbeef0n }, ctx), 0n, Buffer.alloc(64))),
  },
  {
    name: 'SET_TENSOR with type >= GGML_TYPE_COUNT',
    send: closeAfter((ctx) => setTensor(t({ type: 0xffff }, ctx), 0n, Buffer.alloc(64))),
  },
  {
    name: 'SET_TENSOR with a removed type (Q4_2, block size 0)',
    send: closeAfter((ctx) => setTensor(t({ type: 4 }, ctx), 0n, Buffer.alloc(64))),
  },
  {
    name: 'SET_TENSOR in-bounds tensor, offset past the buffer',
    send: closeAfter((ctx) => setTensor(t({}, ctx), 8192n, Buffer.alloc(64))),
  },
  {
    name: 'SET_TENSOR in-bounds tensor, data larger than the buffer',
    send: closeAfter((ctx) => setTensor(t({}, ctx), 0n, Buffer.alloc(8192))),
  },
  {
    name: 'SET_TENSOR offset that wraps the address space (2^64 - 8)',
    send: closeAfter((ctx) => setTensor(t({}, ctx), (1n << 64n) - 8n, Buffer.alloc(64))),
  },
  {
    name: 'GET_TENSOR size past the buffer end',
    send: closeAfter((ctx) => getTensor(t({}, ctx), 0n, 1n << 20n)),
  },
  {
    name: 'GET_TENSOR size 2^64 - 1',
    send: closeAfter((ctx) => getTensor(t({}, ctx), 0n, (1n << 64n) - 1n)),
  },
  {
    name: 'GET_TENSOR with a bogus buffer id',
    send: closeAfter((ctx) => getTensor(t({ buffer: 0x1000n }, ctx), 0n, 64n)),
  },
  {
    name: 'COPY_TENSOR whose source is larger than the room after dst',
    send: (ctx) => {
      const src = f32Tensor(1n, ctx.buf, ctx.base, 1024); // the whole 4 KiB buffer
      const dst = f32Tensor(2n, ctx.buf, ctx.base + 4032n, 16); // the last 64 bytes
      ctx.conn.write(command(CMD.COPY_TENSOR, Buffer.concat([encodeTensor(src), encodeTensor(dst)])));
      return 'close';
    },
  },
  {
    name: 'COPY_TENSOR to a bogus buffer id',
    send: (ctx) => {
      const src = f32Tensor(1n, ctx.buf, ctx.base, 16);
      const dst = f32Tensor(2n, 0x4242n, 0x4242n, 16);
      ctx.conn.write(command(CMD.COPY_TENSOR, Buffer.concat([encodeTensor(src), encodeTensor(dst)])));
      return 'close';
    },
  },
  {
    name: 'GRAPH_COMPUTE shorter than its header',
    send: closeAfter(() => command(CMD.GRAPH_COMPUTE, Buffer.alloc(5))),
  },
  {
    name: 'GRAPH_COMPUTE on device 7 (only device 0 exists)',
    send: closeAfter(() => graph(7, [], [])),
  },
  {
    name: 'GRAPH_COMPUTE claiming 2^32 - 1 nodes in a short message',
    send: closeAfter(() => graph(0, [1n], [], 0xffffffff)),
  },
  {
    name: 'GRAPH_COMPUTE with a node id that names no tensor',
    send: closeAfter((ctx) => graph(0, [77n], [t({ id: 1n }, ctx)])),
  },
  {
    name: 'GRAPH_COMPUTE with a src id that names no tensor',
    send: closeAfter((ctx) => graph(0, [1n], [t({ id: 1n, src: [99n] }, ctx)])),
  },
  {
    name: 'GRAPH_COMPUTE with a view_src id that names no tensor',
    send: closeAfter((ctx) => graph(0, [1n], [t({ id: 1n, viewSrc: 98n }, ctx)])),
  },
  {
    name: 'GRAPH_COMPUTE with a data pointer but no buffer',
    send: closeAfter((ctx) => graph(0, [1n], [t({ id: 1n, buffer: 0n, data: 0x1234n }, ctx)])),
  },
  {
    name: 'GRAPH_RECOMPUTE with no stored graph',
    send: closeAfter(() => command(CMD.GRAPH_RECOMPUTE, u32(0))),
  },
  {
    name: 'FREE_BUFFER of a bogus id',
    send: closeAfter(() => command(CMD.FREE_BUFFER, u64(0x1234567n))),
  },
  {
    name: 'BUFFER_CLEAR of a bogus id',
    send: closeAfter(() => command(CMD.BUFFER_CLEAR, Buffer.concat([u64(0x99n), Buffer.from([1])]))),
  },
  {
    name: 'BUFFER_GET_BASE of a bogus id',
    send: closeAfter(() => command(CMD.BUFFER_GET_BASE, u64(0x99n))),
  },
  ...(['GET_ALIGNMENT', 'GET_MAX_SIZE', 'GET_DEVICE_MEMORY'] as const).map(
    (name): Case => ({
      name: `${name} on device 99`,
      send: closeAfter(() => command(CMD[name], u32(99))),
    }),
  ),
  {
    name: 'GET_ALLOC_SIZE on device 99',
    send: closeAfter((ctx) =>
      command(
        CMD.GET_ALLOC_SIZE,
        Buffer.concat([u32(99), encodeTensor(t({}, ctx)), Buffer.alloc(RPC_TENSOR_BYTES * 10)]),
      ),
    ),
  },
  {
    name: 'MEMSET_TENSOR with an offset past the tensor',
    send: (ctx) => {
      const body = Buffer.concat([encodeTensor(t({}, ctx)), u64(1n << 40n), u64(16n), Buffer.from([7])]);
      ctx.conn.write(command(CMD.MEMSET_TENSOR, body));
      return 'close';
    },
  },
  {
    name: 'ALLOC_BUFFER of 2^62 bytes (refused, session continues)',
    send: ({ conn }) => {
      conn.write(command(CMD.ALLOC_BUFFER, Buffer.concat([u32(0), u64(1n << 62n)])));
      return { replyBytes: 16 };
    },
  },
  {
    name: 'INIT_TENSOR with a bogus buffer id',
    send: closeAfter((ctx) => command(CMD.INIT_TENSOR, encodeTensor(t({ buffer: 0x77n }, ctx)))),
  },
  {
    name: 'SET_TENSOR inside the buffer but past its tensor (ggml_backend_tensor_set asserts)',
    send: closeAfter((ctx) => setTensor(t({}, ctx), 64n, Buffer.alloc(64))),
  },
  {
    name: 'GET_TENSOR inside the buffer but past its tensor (ggml_backend_tensor_get asserts)',
    send: closeAfter((ctx) => getTensor(t({}, ctx), 32n, 64n)),
  },
  {
    name: 'GRAPH_COMPUTE announcing more than maxMessageBytes (refused at its header)',
    send: closeAfter(() => command(CMD.GRAPH_COMPUTE, Buffer.alloc(0), 65n << 20n)),
  },
  {
    name: 'ALLOC_BUFFER of 0 bytes (a stock client never sends one)',
    send: closeAfter(() => command(CMD.ALLOC_BUFFER, Buffer.concat([u32(0), u64(0n)]))),
  },
  {
    name: 'GRAPH_COMPUTE whose tensor sits in a bogus buffer',
    send: closeAfter((ctx) => graph(0, [1n], [t({ id: 1n, buffer: 0x5151n }, ctx)])),
  },
  {
    name: 'GRAPH_COMPUTE with two tensors of one id',
    send: closeAfter((ctx) => graph(0, [1n], [t({ id: 1n }, ctx), t({ id: 1n }, ctx)])),
  },
  {
    name: 'GRAPH_COMPUTE with a cycle of sources',
    send: closeAfter((ctx) =>
      graph(
        0,
        [1n],
        [
          t({ id: 1n, op: GGML_OP_ADD, src: [2n, 2n] }, ctx),
          t({ id: 2n, op: GGML_OP_ADD, src: [1n, 1n] }, ctx),
        ],
      ),
    ),
  },
  {
    name: 'SET_TENSOR_HASH of an unknown hash (no cache dir: result 0)',
    send: (ctx) => {
      ctx.conn.write(
        command(CMD.SET_TENSOR_HASH, Buffer.concat([encodeTensor(t({}, ctx)), u64(0n), u64(0xabcn)])),
      );
      return { replyBytes: 1 };
    },
  },
];

/**
 * Inputs on which upstream's rpc_server asserts (GGML_ASSERT/abort) or throws an uncaught
 * std::length_error. An abort hook first turned those into exceptions that end the session; the
 * guard now refuses them before upstream reads them.
 */
const UPSTREAM_ASSERTS: Case[] = [
  {
    name: 'GET_TENSOR of a tensor whose data lies past its (valid) buffer',
    send: closeAfter((ctx) => getTensor(t({ data: ctx.base + 8192n }, ctx), 0n, 64n)),
  },
  {
    name: 'SET_TENSOR of a tensor whose data lies past its (valid) buffer',
    send: closeAfter((ctx) => setTensor(t({ data: ctx.base + 8192n }, ctx), 0n, Buffer.alloc(64))),
  },
  {
    name: 'COPY_TENSOR whose dst data lies before its (valid) buffer',
    send: (ctx) => {
      const src = f32Tensor(1n, ctx.buf, ctx.base, 16);
      const dst = f32Tensor(2n, ctx.buf, ctx.base - 4096n, 16);
      ctx.conn.write(command(CMD.COPY_TENSOR, Buffer.concat([encodeTensor(src), encodeTensor(dst)])));
      return 'close';
    },
  },
  {
    name: 'SET_TENSOR of a tensor with huge ne/nb in a valid buffer',
    send: (ctx) => {
      const huge = t({ ne: [0xffffffff, 0xffff, 1, 1], nb: [4, 0xfffffff0, 0xfffffff0, 0xfffffff0] }, ctx);
      ctx.conn.write(setTensor(huge, 0n, Buffer.alloc(64)));
      return 'close';
    },
  },
  {
    name: 'GRAPH_COMPUTE of a node with an op id past GGML_OP_COUNT',
    send: closeAfter((ctx) => graph(0, [1n], [t({ id: 1n, op: 0xffff }, ctx)])),
  },
  {
    name: 'SET_TENSOR claiming 2^63 bytes (std::length_error is not caught)',
    send: closeAfter(() => command(CMD.SET_TENSOR, Buffer.alloc(0), 1n << 63n)),
  },
];

/** Issue 18's six classes: each killed (or corrupted) the engine at 47a84fe. */
const ISSUE_18: Case[] = [
  {
    name: 'GRAPH_COMPUTE whose node id is 0 (SIGSEGV, upstream #25299)',
    send: closeAfter((ctx) => graph(0, [0n], [t({ id: 1n }, ctx)])),
  },
  {
    name: 'a GGML_OP_CUSTOM node with a function pointer from the wire (#25289)',
    send: closeAfter((ctx) => {
      const fn = [0x41414140, 0x4141, 0x41414140, 0x4141, 1, 0, 0, 0];
      return graph(
        0,
        [2n],
        [t({ id: 1n }, ctx), t({ id: 2n, op: GGML_OP_CUSTOM, opParams: fn, src: [1n], flags: COMPUTE }, ctx)],
      );
    }),
  },
  {
    name: 'ADD of mismatched shapes (an assert in a compute thread: SIGABRT)',
    send: closeAfter((ctx) => {
      const a = t({ id: 1n }, ctx);
      const b = { ...f32Tensor(2n, ctx.buf, ctx.base + 64n, 5), name: 'b' };
      const c = {
        ...f32Tensor(3n, ctx.buf, ctx.base + 128n, 16),
        op: GGML_OP_ADD,
        src: [1n, 2n],
        flags: COMPUTE,
      };
      return graph(0, [3n], [a, b, c]);
    }),
  },
  {
    name: 'SET_ROWS whose rows outnumber its destination (writes past the buffer, #26912)',
    send: closeAfter((ctx) => {
      // 64 planes of 4 floats go to a one-plane destination at the buffer's end, 4 KiB apart
      const rows: RpcTensor = {
        ...f32Tensor(1n, ctx.buf, ctx.base, 4),
        ne: [4, 1, 64, 1],
        nb: [4, 16, 16, 1024],
      };
      const ids: RpcTensor = {
        ...f32Tensor(2n, ctx.buf, ctx.base + 2048n, 1),
        type: GGML_TYPE_I64,
        nb: [8, 8, 8, 8],
      };
      const dst: RpcTensor = {
        ...f32Tensor(3n, ctx.buf, ctx.base + 4096n - 16n, 4),
        nb: [4, 16, 4096, 4096],
        op: GGML_OP_SET_ROWS,
        src: [1n, 2n],
        flags: COMPUTE,
      };
      return graph(0, [3n], [rows, ids, dst]);
    }),
  },
  {
    name: 'GRAPH_COMPUTE, FREE_BUFFER, GRAPH_RECOMPUTE (use after free, GHSA-2phh-px2f-2qmx)',
    send: (ctx) => {
      ctx.conn.write(addGraph(ctx).bytes);
      ctx.conn.write(command(CMD.FREE_BUFFER, u64(ctx.buf)));
      ctx.conn.write(command(CMD.GRAPH_RECOMPUTE, u32(0)));
      return 'close';
    },
  },
  {
    name: 'a chain of 60,000 tensor sources (recursion: the engine died at ~52k)',
    send: closeAfter((ctx) => {
      const n = 60_000;
      const tensors: RpcTensor[] = [];
      for (let i = 1; i <= n; i++)
        tensors.push(t({ id: BigInt(i), src: i > 1 ? [BigInt(i - 1)] : [], name: '' }, ctx));
      return graph(0, [BigInt(n)], tensors);
    }),
  },
];

let model: string;
let shared: EngineProcess | undefined;
const figures: Record<string, unknown> & {
  rpcSessions: number;
  safeCases: number;
  issue18Survived: number;
  upstreamAssertsSurvived: number;
} = {
  safeCases: 0,
  upstreamAssertCases: UPSTREAM_ASSERTS.length,
  upstreamAssertsSurvived: 0,
  issue18Cases: ISSUE_18.length,
  issue18Survived: 0,
  rpcSessions: 0,
};

async function engine(): Promise<EngineProcess> {
  model ??= await tinyModel();
  if (!shared || shared.exited())
    shared = await spawnEngine(['-m', model, '-np', '2', '-t', '1', '-c', '512'], { rpc: true });
  return shared;
}

async function open(eng: EngineProcess | number): Promise<Ctx> {
  const conn = await RpcConn.open(typeof eng === 'number' ? eng : eng.rpcPort!);
  await conn.hello();
  const { ptr, size } = await conn.alloc(4096n);
  expect(ptr).not.toBe(0n);
  return { conn, buf: ptr, base: await conn.base(ptr), size };
}

const floats = (f: (i: number) => number) => Buffer.from(new Float32Array(16).map((_, i) => f(i)).buffer);
const f32Values = (v: number[]) => Buffer.from(new Float32Array(v).buffer);

type Ne = [number, number, number, number];
/** A contiguous f32 tensor of shape `ne` at offset `at` of the session's buffer. */
const f32At = (ctx: Ctx, id: bigint, at: bigint, ne: Ne): RpcTensor => ({
  ...f32Tensor(id, ctx.buf, ctx.base + at, 1),
  ne,
  nb: [4, 4 * ne[0], 4 * ne[0] * ne[1], 4 * ne[0] * ne[1] * ne[2]],
});

/** A well-behaved session: set two tensors, compute their sum on the engine, read it back. */
async function normalSession(eng: EngineProcess | number): Promise<void> {
  const ctx = await open(eng);
  try {
    const g = addGraph(ctx);
    ctx.conn.write(
      setTensor(
        g.a,
        0n,
        floats((i) => i),
      ),
    );
    ctx.conn.write(
      setTensor(
        g.b,
        0n,
        floats((i) => 0.5 * i + 1),
      ),
    );
    ctx.conn.write(g.bytes);
    ctx.conn.write(getTensor(g.c, 0n, 64n));
    expect(await ctx.conn.reply()).toEqual(floats((i) => 1.5 * i + 1));
    // the stored graph runs again on new inputs
    ctx.conn.write(
      setTensor(
        g.a,
        0n,
        floats(() => 2),
      ),
    );
    ctx.conn.write(command(CMD.GRAPH_RECOMPUTE, u32(0)));
    ctx.conn.write(getTensor(g.c, 0n, 64n));
    expect(await ctx.conn.reply()).toEqual(floats((i) => 0.5 * i + 3));
  } finally {
    ctx.conn.destroy();
  }
}

async function runCase(eng: EngineProcess, c: Case): Promise<void> {
  const ctx = await open(eng);
  const outcome = c.send(ctx);
  if (outcome === 'close') {
    expect(await ctx.conn.waitClosed(5_000)).toBe(true);
  } else {
    expect((await ctx.conn.reply())?.byteLength).toBe(outcome.replyBytes);
    ctx.conn.destroy();
  }
  await sleep(50); // an abort in the worker lands within a few ms of the close
  expect(eng.exited()).toBeUndefined();
  await normalSession(eng);
  expect((await completion(eng.url)).status).toBe(200);
  figures.rpcSessions += 2;
}

afterAll(async () => {
  if (shared && !shared.exited()) {
    const m = await metrics(shared.url);
    Object.assign(figures, {
      rssAfterMiB: Math.round(rssBytes(shared.pid) / 2 ** 20),
      servedTotal: m.get('hydra_rpc_sessions_served_total'),
      failedTotal: m.get('hydra_rpc_sessions_failed_total'),
    });
  }
  await shared?.stop();
  recordFigures('ggml-rpc-hostile', figures);
});

const run = promisify(execFile);

/** The tiny model's logits after a prompt from a stock llama.cpp client: locally, or on a peer. */
async function stockClient(endpoint?: string): Promise<{ logits: number[]; generated: number[] }> {
  const fixture = join(REPO, 'packages/native-ggml/test-native/fixtures/rpc-client.mjs');
  const args = [fixture, model, 'Hello world, this is a test', ...(endpoint ? [endpoint, '99'] : [])];
  const { stdout } = await run(process.execPath, args, { timeout: 120_000 });
  return JSON.parse(stdout.trim().split('\n').at(-1)!) as { logits: number[]; generated: number[] };
}

/** How much `pid`'s RSS grows within `ms` after `send` (the connection closed after). */
async function rssGrowth(port: number, pid: number, send: (ctx: Ctx) => void, ms = 1500): Promise<number> {
  const ctx = await open(port);
  const before = rssBytes(pid);
  send(ctx);
  let peak = before;
  for (let waited = 0; waited < ms; waited += 100) {
    await sleep(100);
    peak = Math.max(peak, rssBytes(pid));
  }
  ctx.conn.destroy();
  return peak - before;
}

describe('ggml-RPC hostile input through the merged port', () => {
  for (const c of SAFE) {
    it(`survives: ${c.name}`, async () => {
      await runCase(await engine(), c);
      figures.safeCases += 1;
    });
  }

  for (const c of ISSUE_18) {
    it(`survives (issue 18): ${c.name}`, async () => {
      await runCase(await engine(), c);
      figures.issue18Survived += 1;
    });
  }

  for (const c of UPSTREAM_ASSERTS) {
    it(`survives an upstream assert: ${c.name}`, async () => {
      await runCase(await engine(), c);
      figures.upstreamAssertsSurvived += 1;
    });
  }

  it('after every attack, a stock llama.cpp client computes the local logits on the engine', async () => {
    const eng = await engine();
    const local = await stockClient();
    const remote = await stockClient(`127.0.0.1:${eng.rpcPort}`);
    const diff = Math.max(...remote.logits.map((v, i) => Math.abs(v - local.logits[i]!)));
    figures.stockClientMaxAbsDiff = diff;
    expect(diff).toBeLessThan(1e-4);
    expect(remote.generated).toEqual(local.generated);
    expect((await completion(eng.url)).status).toBe(200);
  });
});

/**
 * The guard alone: serveRpcFd in this very process (the merged port's path minus the port and the
 * host process the engine serves sessions in), so an input the guard let through would take the
 * test process down. Each case must be refused by the guard itself (`ended: 'refused'`).
 */
describe('the guard alone refuses each attack (serveRpcFd in the test process)', () => {
  let srv: Awaited<ReturnType<typeof startGuardedServer>>;
  beforeAll(async () => {
    srv = await startGuardedServer({});
  });
  afterAll(() => srv.close());

  for (const c of [...ISSUE_18, ...UPSTREAM_ASSERTS]) {
    it(`refuses: ${c.name}`, async () => {
      const ctx = await open(srv.port);
      expect(c.send(ctx)).toBe('close');
      expect(await ctx.conn.waitClosed(5_000)).toBe(true);
      const summary = await srv.summaries.at(-1)!;
      expect(summary.ended).toBe('refused');
      expect(summary.refusals).toBe(1);
      await normalSession(srv.port);
      figures.guardAloneRefused = ((figures.guardAloneRefused as number | undefined) ?? 0) + 1;
    });
  }

  it('a 9-byte SET_TENSOR header announcing 1 GiB allocates nothing (it must fit a live buffer first)', async () => {
    const grown = await rssGrowth(srv.port, process.pid, (ctx) =>
      ctx.conn.write(command(CMD.SET_TENSOR, Buffer.alloc(0), 1n << 30n)),
    );
    figures.setTensorClaimRssMiB = Math.round(grown / 2 ** 20);
    // at 47a84fe upstream zero-filled the claimed size before reading a byte
    expect(grown).toBeLessThan(32 * 2 ** 20);
    expect((await srv.summaries.at(-1)!).reason).toContain('larger than any live buffer');
  });

  it('an 8 MiB GRAPH_COMPUTE of a million nodes is refused on its counts (47a84fe: +408 MiB)', async () => {
    // built before the measurement (the 8 MiB message is this process's memory too); refused on
    // its node count before its tensor is read, so the tensor's buffer does not matter
    const bytes = graph(
      0,
      Array.from({ length: 1 << 20 }, () => 1n),
      [f32Tensor(1n, 0n, 0n, 16)],
    );
    expect(bytes.byteLength).toBeGreaterThan(8 << 20);
    const grown = await rssGrowth(srv.port, process.pid, (ctx) => ctx.conn.write(bytes));
    figures.graphClaimRssMiB = Math.round(grown / 2 ** 20);
    expect(grown).toBeLessThan(32 * 2 ** 20);
    expect((await srv.summaries.at(-1)!).reason).toContain('nodes (limit 32768)');
  });
});

describe('ggml-RPC session caps and timeouts (serveRpcFd limits)', () => {
  it('ALLOC_BUFFER past maxAllocBytes is answered as failed; the session and its buffers live on', async () => {
    const srv = await startGuardedServer({ maxAllocBytes: 64 << 20 });
    try {
      const ctx = await open(srv.port);
      const second = await ctx.conn.alloc(48n << 20n);
      expect(second.ptr).not.toBe(0n);
      const third = await ctx.conn.alloc(48n << 20n); // 4 KiB + 48 MiB held: refused
      expect(third).toEqual({ ptr: 0n, size: 0n });
      ctx.conn.write(command(CMD.BUFFER_CLEAR, Buffer.concat([u64(second.ptr), Buffer.from([1])])));
      expect(await ctx.conn.deviceCount()).toBe(1);
      ctx.conn.destroy();
      const summary = await srv.summaries[0]!;
      expect(summary).toMatchObject({ ended: 'client', allocDenied: 1, refusals: 1 });
      expect(summary.allocBytesPeak).toBeGreaterThanOrEqual(48 << 20);
      figures.allocCapDenied = summary.allocDenied;
    } finally {
      await srv.close();
    }
  });

  it('a valid ADD_ID graph (the gpt-oss expert bias) passes the guard and computes; a wrong-shaped one is refused', async () => {
    const srv = await startGuardedServer({});
    try {
      const ctx = await open(srv.port);
      const f32 = (id: bigint, at: bigint, ne: Ne) => f32At(ctx, id, at, ne);
      const a = f32(1n, 0n, [4, 2, 1, 1]); // 2 expert rows of 4
      const b = f32(2n, 64n, [4, 3, 1, 1]); // 3 experts' biases
      const ids: RpcTensor = { ...f32(3n, 128n, [2, 1, 1, 1]), type: GGML_TYPE_I32 };
      const out = (ne: Ne): RpcTensor => ({
        ...f32(4n, 256n, ne),
        op: GGML_OP_ADD_ID,
        src: [1n, 2n, 3n],
        flags: COMPUTE,
      });
      ctx.conn.write(setTensor(a, 0n, f32Values([1, 2, 3, 4, 5, 6, 7, 8])));
      ctx.conn.write(setTensor(b, 0n, f32Values([10, 10, 10, 10, 20, 20, 20, 20, 30, 30, 30, 30])));
      ctx.conn.write(setTensor(ids, 0n, Buffer.from(new Int32Array([2, 0]).buffer)));
      ctx.conn.write(graph(0, [4n], [a, b, ids, out([4, 2, 1, 1])]));
      ctx.conn.write(getTensor(out([4, 2, 1, 1]), 0n, 32n));
      expect(await ctx.conn.reply()).toEqual(f32Values([31, 32, 33, 34, 15, 16, 17, 18]));
      ctx.conn.write(graph(0, [4n], [a, b, ids, out([4, 1, 1, 1])]));
      expect(await ctx.conn.waitClosed(3000)).toBe(true);
      expect((await srv.summaries[0]!).reason).toContain('ADD_ID: shapes');
    } finally {
      await srv.close();
    }
  });

  it('an empty MUL_MAT (a micro-batch with no outputs: strides 2048, 0, 0) passes; a node that computes into or reads an unallocated tensor is refused', async () => {
    const srv = await startGuardedServer({});
    try {
      const ctx = await open(srv.port);
      const f32 = (id: bigint, at: bigint, ne: Ne) => f32At(ctx, id, at, ne);
      const w = f32(1n, 0n, [4, 2, 1, 1]);
      const x = f32(2n, 64n, [4, 0, 1, 1]);
      const mm = (id: bigint, src: bigint[], ne1: number): RpcTensor => ({
        ...f32(id, 128n, [2, ne1, 1, 1]),
        op: GGML_OP_MUL_MAT,
        src,
        flags: COMPUTE,
      });
      // an unused leaf the head never allocated: no buffer, no data (upstream accepts it)
      const unalloc: RpcTensor = { ...f32(3n, 0n, [4, 1, 1, 1]), buffer: 0n, data: 0n };
      ctx.conn.write(graph(0, [4n], [w, x, unalloc, mm(4n, [1n, 2n], 0)]));
      ctx.conn.write(command(CMD.GET_ALIGNMENT, u32(0)));
      expect((await ctx.conn.reply())?.byteLength).toBe(8);
      // the same rows with one output row compute
      const x1 = f32(2n, 64n, [4, 1, 1, 1]);
      ctx.conn.write(setTensor(w, 0n, f32Values([1, 0, 0, 0, 0, 1, 0, 0])));
      ctx.conn.write(setTensor(x1, 0n, f32Values([5, 6, 7, 8])));
      ctx.conn.write(graph(0, [4n], [w, x1, mm(4n, [1n, 2n], 1)]));
      ctx.conn.write(getTensor(mm(4n, [1n, 2n], 1), 0n, 8n));
      expect(await ctx.conn.reply()).toEqual(f32Values([5, 6]));
      ctx.conn.write(graph(0, [4n], [w, unalloc, { ...mm(4n, [1n, 3n], 1), ne: [2, 1, 1, 1] }]));
      expect(await ctx.conn.waitClosed(3000)).toBe(true);
      expect((await srv.summaries[0]!).reason).toContain('MUL_MAT) reads src[1]');
      const ctx2 = await open(srv.port);
      const into: RpcTensor = { ...mm(4n, [1n, 2n], 1), buffer: 0n, data: 0n };
      ctx2.conn.write(
        graph(
          0,
          [4n],
          [
            { ...w, buffer: ctx2.buf, data: ctx2.base },
            { ...x1, buffer: ctx2.buf, data: ctx2.base + 64n },
            into,
          ],
        ),
      );
      expect(await ctx2.conn.waitClosed(3000)).toBe(true);
      expect((await srv.summaries[1]!).reason).toContain('computes into a tensor with no buffer');
    } finally {
      await srv.close();
    }
  });

  it('a valid SSM_CONV graph (the short convolution of hybrid models) passes the guard and computes; a wrong-shaped one is refused', async () => {
    const srv = await startGuardedServer({});
    try {
      const ctx = await open(srv.port);
      const f32 = (id: bigint, at: bigint, ne: Ne) => f32At(ctx, id, at, ne);
      const sx = f32(1n, 0n, [3, 1, 1, 1]); // d_conv - 1 + n_t = 3 columns of d_inner 1
      const c = f32(2n, 64n, [2, 1, 1, 1]); // d_conv 2
      const out = (ne: Ne): RpcTensor => ({
        ...f32(3n, 128n, ne),
        op: GGML_OP_SSM_CONV,
        src: [1n, 2n],
        flags: COMPUTE,
      });
      ctx.conn.write(setTensor(sx, 0n, f32Values([1, 2, 3])));
      ctx.conn.write(setTensor(c, 0n, f32Values([10, 1])));
      ctx.conn.write(graph(0, [3n], [sx, c, out([1, 2, 1, 1])]));
      ctx.conn.write(getTensor(out([1, 2, 1, 1]), 0n, 8n));
      expect(await ctx.conn.reply()).toEqual(f32Values([12, 23]));
      ctx.conn.write(graph(0, [3n], [sx, c, out([1, 3, 1, 1])]));
      expect(await ctx.conn.waitClosed(3000)).toBe(true);
      expect((await srv.summaries[0]!).reason).toContain('SSM_CONV: result shape');
    } finally {
      await srv.close();
    }
  });

  it('what the CPU kernels assert on is refused: RMS_NORM with a negative or NaN eps, SCALE of a strided view', async () => {
    const srv = await startGuardedServer({});
    try {
      const refusal = async (nodes: RpcTensor[]): Promise<string | undefined> => {
        const ctx = await open(srv.port);
        // data fields are offsets into the session's buffer here
        const at = (t: RpcTensor): RpcTensor => ({ ...t, buffer: ctx.buf, data: ctx.base + t.data });
        ctx.conn.write(graph(0, [nodes.at(-1)!.id], nodes.map(at)));
        ctx.conn.write(command(CMD.GET_ALIGNMENT, u32(0)));
        const ok = await ctx.conn.reply();
        ctx.conn.destroy();
        if (ok !== undefined) return undefined;
        return (await srv.summaries.at(-1)!).reason;
      };
      const x: RpcTensor = { ...f32Tensor(1n, 0n, 0n, 1), ne: [8, 2, 1, 1], nb: [4, 32, 64, 64] };
      const f32Bits = (v: number) => Buffer.from(new Float32Array([v]).buffer).readInt32LE(0);
      const norm = (eps: number): RpcTensor => ({
        ...x,
        id: 2n,
        data: 256n,
        op: GGML_OP_RMS_NORM,
        opParams: [f32Bits(eps)],
        src: [1n],
        flags: COMPUTE,
      });
      expect(await refusal([x, norm(1e-5)])).toBeUndefined();
      expect(await refusal([x, norm(-1)])).toContain('norm: eps');
      expect(await refusal([x, norm(Number.NaN)])).toContain('norm: eps');
      // rows of 4 of the 8 floats: contiguous in its rows, not as a whole
      const view: RpcTensor = {
        ...x,
        id: 3n,
        ne: [4, 2, 1, 1],
        nb: [4, 32, 64, 64],
        op: 0,
        viewSrc: 1n,
        src: [1n],
      };
      const scale = (src: RpcTensor): RpcTensor => ({
        ...src,
        id: 4n,
        data: 512n,
        nb: [4, 4 * src.ne[0], 4 * src.ne[0] * src.ne[1], 4 * src.ne[0] * src.ne[1]],
        op: GGML_OP_SCALE,
        opParams: [f32Bits(2), 0],
        src: [src.id],
        viewSrc: 0n,
        flags: COMPUTE,
      });
      expect(await refusal([x, scale(x)])).toBeUndefined();
      expect(await refusal([x, view, scale(view)])).toContain('not contiguous');
    } finally {
      await srv.close();
    }
  });

  it('ALLOC_BUFFER past maxBuffers is answered as failed', async () => {
    const srv = await startGuardedServer({ maxBuffers: 2 });
    try {
      const ctx = await open(srv.port);
      expect((await ctx.conn.alloc(4096n)).ptr).not.toBe(0n);
      expect(await ctx.conn.alloc(4096n)).toEqual({ ptr: 0n, size: 0n });
      ctx.conn.destroy();
      expect(await srv.summaries[0]!).toMatchObject({ ended: 'client', allocDenied: 1 });
    } finally {
      await srv.close();
    }
  });

  it('a client that stops reading its replies is ended at stallTimeoutMs', async () => {
    const srv = await startGuardedServer({ stallTimeoutMs: 300 });
    try {
      const conn = await RpcConn.open(srv.port);
      await conn.hello();
      const { ptr } = await conn.alloc(8n << 20n);
      const base = await conn.base(ptr);
      conn.socket.pause(); // replies pile up in the kernel's buffers, then in the guard's send
      const whole = f32Tensor(1n, ptr, base, 2 << 20);
      for (let i = 0; i < 16; i++) conn.write(getTensor(whole, 0n, 8n << 20n));
      expect(await srv.summaries[0]!).toMatchObject({
        ended: 'timeout',
        reason: 'the client stopped reading',
      });
      conn.destroy();
    } finally {
      await srv.close();
    }
  });

  it('a connection that sends only 0x0E is ended at helloTimeoutMs', async () => {
    const srv = await startGuardedServer({ helloTimeoutMs: 300 });
    try {
      const conn = await RpcConn.open(srv.port);
      const t0 = Date.now();
      conn.write(Buffer.from([CMD.HELLO]));
      expect(await conn.waitClosed(3000)).toBe(true);
      figures.helloTimeoutClosedMs = Date.now() - t0;
      expect(await srv.summaries[0]!).toMatchObject({ ended: 'timeout', reason: 'no HELLO in time' });
    } finally {
      await srv.close();
    }
  });

  it('a message that stops arriving is ended at stallTimeoutMs, even while buffers are held', async () => {
    const srv = await startGuardedServer({ stallTimeoutMs: 300, idleTimeoutMs: 0 });
    try {
      const ctx = await open(srv.port);
      ctx.conn.write(command(CMD.ALLOC_BUFFER, Buffer.alloc(5), 12n));
      expect(await ctx.conn.waitClosed(3000)).toBe(true);
      expect(await srv.summaries[0]!).toMatchObject({
        ended: 'timeout',
        reason: 'a message stopped arriving',
      });
    } finally {
      await srv.close();
    }
  });

  it('idle sessions end at idleTimeoutMs only while they hold no buffer (a COMBINE head idles with buffers)', async () => {
    const srv = await startGuardedServer({ idleTimeoutMs: 300 });
    try {
      const bare = await RpcConn.open(srv.port);
      await bare.hello();
      const held = await open(srv.port);
      expect(await bare.waitClosed(3000)).toBe(true);
      await sleep(700);
      expect(held.conn.closed).toBe(false);
      expect(await held.conn.deviceCount()).toBe(1);
      // freeing its last buffer makes the held session idle-able too
      held.conn.write(command(CMD.FREE_BUFFER, u64(held.buf)));
      expect(await held.conn.waitClosed(3000)).toBe(true);
      const ended = await Promise.all(srv.summaries);
      expect(ended.map((e) => e.ended)).toEqual(['timeout', 'timeout']);
    } finally {
      await srv.close();
    }
  });

  it('an unknown or invalid limit is refused by name', async () => {
    for (const [limits, key] of [
      [{ maxAllocByte: 1 }, 'options.maxAllocByte'],
      [{ maxGraphNodes: -1 }, 'options.maxGraphNodes'],
      [{ stallTimeoutMs: 1.5 }, 'options.stallTimeoutMs'],
    ] as const) {
      const srv = await startGuardedServer(limits);
      try {
        const conn = await RpcConn.open(srv.port);
        conn.write(command(CMD.HELLO, Buffer.alloc(24)));
        expect(await conn.waitClosed(3000)).toBe(true);
        await expect(srv.summaries[0]!).rejects.toMatchObject({
          code: 'HYDRA_ERR_BAD_ARGUMENT',
          message: expect.stringContaining(key),
        });
      } finally {
        await srv.close();
      }
    }
  });

  it('a refused message ends the session with its reason and command in the summary', async () => {
    const srv = await startGuardedServer({});
    try {
      const ctx = await open(srv.port);
      ctx.conn.write(graph(0, [0n], [t({ id: 1n }, ctx)]));
      expect(await ctx.conn.waitClosed(3000)).toBe(true);
      expect(await srv.summaries[0]!).toMatchObject({
        ended: 'refused',
        refusedCommand: 'GRAPH_COMPUTE',
        reason: expect.stringContaining('node 0 id 0'),
        refusals: 1,
      });
      await normalSession(srv.port);
    } finally {
      await srv.close();
    }
  });
});
