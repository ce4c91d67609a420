// Micro benchmarks of the merged port, run by `pnpm run bench` (after `build`: this file imports the
// package's public entry). Results go to benchmarks/results/hydra-rpc-port.json; every figure carries
// an anchor measured in the same run on the same machine.
import { execFileSync, spawn } from 'node:child_process';
import { existsSync, mkdirSync, writeFileSync } from 'node:fs';
import { connect, createServer, type Server } from 'node:net';
import { cpus, totalmem } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { HydraClient, HydraPort, OPCODES } from '@hydra-engine/hydra-rpc';
import { Bench, type Task } from 'tinybench';

interface Stats {
  samples: number;
  median: number;
  p99: number;
  mean: number;
}
interface Figure extends Stats {
  name: string;
  unit: string;
  anchor: (Stats & { name: string; ratio_p99: number; ratio_median: number }) | null;
}

const STATUS_REPLY = {
  state: 'ready',
  model: { path: '/models/bench.gguf', arch: 'llama', n_layer: 32 },
  mode: 'solo',
  epoch: 3,
  applied: { n_ctx: 8192, 'sampling.temp': 0.7 },
  deferred_keys: [],
  slots: { total: 4, busy: 1 },
  devices: [{ name: 'CUDA0', description: 'bench', free: 1e10, total: 1.6e10 }],
};

function statusFrame(): Buffer {
  const body = Buffer.from('{}');
  const header = Buffer.alloc(9);
  header[0] = OPCODES.STATUS;
  header.writeBigUInt64LE(BigInt(body.byteLength), 1);
  return Buffer.concat([header, body]);
}

/** The anchor: a bare Node TCP server that answers each complete frame with a frame of the same size as STATUS's reply. */
async function startEchoAnchor(replyBytes: number): Promise<{ server: Server; port: number }> {
  const reply = Buffer.alloc(9 + replyBytes, 0x20);
  reply[0] = OPCODES.STATUS;
  reply.writeBigUInt64LE(BigInt(replyBytes), 1);
  const server = createServer({ noDelay: true }, (socket) => {
    let pending = Buffer.alloc(0);
    socket.on('data', (chunk) => {
      pending = Buffer.concat([pending, chunk]);
      while (pending.byteLength >= 9) {
        const total = 9 + Number(pending.readBigUInt64LE(1));
        if (pending.byteLength < total) break;
        pending = pending.subarray(total);
        socket.write(reply);
      }
    });
    socket.on('error', () => {});
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return { server, port: (server.address() as { port: number }).port };
}

/** Connects, sends one STATUS frame, resolves when the first complete reply frame is in. */
function connectToFirstReply(port: number): Promise<void> {
  return new Promise((resolve, reject) => {
    const socket = connect({ port, host: '127.0.0.1', noDelay: true }, () => socket.write(statusFrame()));
    let got = Buffer.alloc(0);
    socket.on('data', (chunk) => {
      got = Buffer.concat([got, chunk]);
      if (got.byteLength >= 9 && got.byteLength >= 9 + Number(got.readBigUInt64LE(1))) {
        socket.destroy();
        resolve();
      }
    });
    socket.on('error', reject);
  });
}

/** Round trips on one connection with Hydra framing; replies are matched in order, so they may be pipelined. */
function oneConnection(port: number): Promise<{ roundTrip(): Promise<void>; close(): void }> {
  return new Promise((resolve, reject) => {
    const socket = connect({ port, host: '127.0.0.1', noDelay: true }, () => {
      const waiters: (() => void)[] = [];
      let got = Buffer.alloc(0);
      socket.on('data', (chunk) => {
        got = Buffer.concat([got, chunk]);
        while (got.byteLength >= 9) {
          const total = 9 + Number(got.readBigUInt64LE(1));
          if (got.byteLength < total) break;
          got = got.subarray(total);
          waiters.shift()?.();
        }
      });
      const frame = statusFrame();
      resolve({
        roundTrip: () =>
          new Promise<void>((done) => {
            waiters.push(done);
            socket.write(frame);
          }),
        close: () => socket.destroy(),
      });
    });
    socket.on('error', reject);
  });
}

function stats(task: Task, pick: 'latency' | 'throughput'): Stats {
  const result = task.result;
  if (result.state !== 'completed') throw new Error(`${task.name}: ${result.state}`);
  const s = result[pick];
  return { samples: s.samplesCount, median: s.p50, p99: s.p99, mean: s.mean };
}

function figure(name: string, unit: string, own: Stats, anchorName: string, anchor: Stats): Figure {
  return {
    name,
    unit,
    ...own,
    anchor: {
      name: anchorName,
      ...anchor,
      ratio_median: own.median / anchor.median,
      ratio_p99: own.p99 / anchor.p99,
    },
  };
}

function repoRoot(): string {
  let dir = dirname(fileURLToPath(import.meta.url));
  while (!existsSync(join(dir, 'pnpm-workspace.yaml'))) {
    const up = dirname(dir);
    if (up === dir) throw new Error('pnpm-workspace.yaml not found above the bench');
    dir = up;
  }
  return dir;
}

const HELLO_REQ_SIZE = 24;
const HELLO_RSP_SIZE = 28;

/** ggml-RPC protocol 6 HELLO: connect, send it, resolve when the whole reply is in. */
function helloFirstReply(port: number): Promise<void> {
  const hello = Buffer.alloc(1 + 8 + HELLO_REQ_SIZE);
  hello[0] = 0x0e;
  hello.writeBigUInt64LE(BigInt(HELLO_REQ_SIZE), 1);
  return new Promise((resolve, reject) => {
    const socket = connect({ port, host: '127.0.0.1', noDelay: true }, () => socket.write(hello));
    let got = 0;
    socket.on('data', (chunk) => {
      got += chunk.byteLength;
      if (got >= 8 + HELLO_RSP_SIZE) {
        socket.destroy();
        resolve();
      }
    });
    socket.on('error', reject);
    socket.on('close', () => {
      if (got < 8 + HELLO_RSP_SIZE) reject(new Error('closed before the HELLO reply'));
    });
  });
}

/**
 * ggml-RPC HELLO connect-to-first-reply through this port (native half from native-ggml) against the
 * stock upstream ggml-rpc-server of the same pin. Returns why it was skipped when either is missing.
 */
async function ggmlRpcHelloFigure(): Promise<Figure | string> {
  const nativeDir = join(repoRoot(), 'packages', 'native-ggml');
  const stockBin = join(nativeDir, 'build', 'bin', 'ggml-rpc-server');
  const entry = join(nativeDir, 'dist', 'index.js');
  if (!existsSync(stockBin) || !existsSync(entry)) {
    return 'ggml-rpc-hello-connect-to-first-reply: needs the native-ggml build (addon and stock ggml-rpc-server)';
  }
  // Loaded by path: hydra-rpc does not depend on native-ggml; the bench wires them as the engine would.
  const native = (await import(pathToFileURL(entry).href)) as {
    peekFirstByte(fd: number, timeoutMs: number): Promise<number>;
    freeLoopbackPort(): Promise<number>;
  };
  const host = join(nativeDir, 'dist', 'rpc-host.js');
  const port = new HydraPort({
    native: { peekFirstByte: native.peekFirstByte },
    rpcHost: { args: [host] },
    logger: console,
  });
  const { port: ourPort } = await port.listen();
  const stockPort = await native.freeLoopbackPort();
  const stock = spawn(stockBin, ['-H', '127.0.0.1', '-p', String(stockPort)], { stdio: 'ignore' });
  try {
    for (let i = 0; ; i++) {
      try {
        await helloFirstReply(stockPort);
        break;
      } catch (err) {
        if (i > 100) throw err;
        await new Promise((r) => setTimeout(r, 50));
      }
    }
    const bench = new Bench({ time: 2000, warmupTime: 300, iterations: 200 });
    bench
      .add('ggml-RPC HELLO connect-to-first-reply via hydra-rpc', () => helloFirstReply(ourPort))
      .add('anchor: stock ggml-rpc-server HELLO connect-to-first-reply', () => helloFirstReply(stockPort));
    await bench.run();
    console.table(bench.table());
    const [ours, theirs] = bench.tasks as [Task, Task];
    return figure(
      'ggml-rpc-hello-connect-to-first-reply',
      'ms',
      stats(ours, 'latency'),
      theirs.name,
      stats(theirs, 'latency'),
    );
  } finally {
    stock.kill();
    await port.close();
  }
}

async function main(): Promise<void> {
  const hydra = new HydraPort({ handlers: { STATUS: () => STATUS_REPLY }, logger: console });
  const { port: hydraPort } = await hydra.listen();
  const replyBytes = Buffer.byteLength(JSON.stringify({ ...STATUS_REPLY, success: true }));
  const anchor = await startEchoAnchor(replyBytes);

  const hydraConn = await oneConnection(hydraPort);
  const anchorConn = await oneConnection(anchor.port);
  const client = await HydraClient.connect({ port: hydraPort });
  const pipelineDepth = 32;

  const bench = new Bench({ time: 2000, warmupTime: 300, iterations: 200 });
  bench
    .add('hydra STATUS connect-to-first-reply', () => connectToFirstReply(hydraPort))
    .add('anchor: node TCP echo connect-to-first-reply', () => connectToFirstReply(anchor.port))
    .add('hydra STATUS round trip, one connection (raw frames)', () => hydraConn.roundTrip())
    .add('anchor: node TCP echo round trip, one connection', () => anchorConn.roundTrip())
    .add('hydra STATUS round trip, one connection (HydraClient)', async () => {
      await client.status();
    })
    .add(`hydra STATUS x${pipelineDepth} pipelined (HydraClient)`, async () => {
      await Promise.all(Array.from({ length: pipelineDepth }, () => client.status()));
    })
    .add(`anchor: node TCP echo x${pipelineDepth} pipelined`, async () => {
      await Promise.all(Array.from({ length: pipelineDepth }, () => anchorConn.roundTrip()));
    });
  await bench.run();
  console.table(bench.table());

  const [connect, connectAnchor, rtRaw, rtAnchor, rtClient, pipe, pipeAnchor] = bench.tasks as [
    Task,
    Task,
    Task,
    Task,
    Task,
    Task,
    Task,
  ];
  const perSecond = (s: Stats, n: number): Stats => ({
    ...s,
    median: s.median * n,
    p99: s.p99 * n,
    mean: s.mean * n,
  });
  const figures: Figure[] = [
    figure(
      'hydra-status-connect-to-first-reply',
      'ms',
      stats(connect, 'latency'),
      connectAnchor.name,
      stats(connectAnchor, 'latency'),
    ),
    figure(
      'hydra-status-round-trip-latency',
      'ms',
      stats(rtRaw, 'latency'),
      rtAnchor.name,
      stats(rtAnchor, 'latency'),
    ),
    figure(
      'hydra-status-round-trips-per-second',
      'ops/s',
      stats(rtRaw, 'throughput'),
      rtAnchor.name,
      stats(rtAnchor, 'throughput'),
    ),
    figure(
      'hydra-client-status-round-trips-per-second',
      'ops/s',
      stats(rtClient, 'throughput'),
      rtAnchor.name,
      stats(rtAnchor, 'throughput'),
    ),
    figure(
      `hydra-client-status-pipelined-${pipelineDepth}-requests-per-second`,
      'ops/s',
      perSecond(stats(pipe, 'throughput'), pipelineDepth),
      pipeAnchor.name,
      perSecond(stats(pipeAnchor, 'throughput'), pipelineDepth),
    ),
  ];
  const pending: string[] = [];
  const ggml = await ggmlRpcHelloFigure();
  if (typeof ggml === 'string') pending.push(ggml);
  else figures.push(ggml);

  let commit = 'unknown';
  try {
    commit = execFileSync('git', ['rev-parse', 'HEAD'], { encoding: 'utf8' }).trim();
  } catch {}
  const cpu = cpus();
  const out = {
    name: 'hydra-rpc-port',
    commit,
    machine: {
      cpu: cpu[0]?.model ?? 'unknown',
      cores: cpu.length,
      memory_gib: Math.round(totalmem() / 2 ** 30),
      platform: `${process.platform}-${process.arch}`,
      node: process.version,
    },
    date: new Date().toISOString(),
    figures,
    pending,
  };
  const dir = join(repoRoot(), 'benchmarks', 'results');
  mkdirSync(dir, { recursive: true });
  const file = join(dir, 'hydra-rpc-port.json');
  writeFileSync(file, `${JSON.stringify(out, null, 2)}\n`);
  console.log(`wrote ${file}`);

  hydraConn.close();
  anchorConn.close();
  await client.close();
  await hydra.close();
  await new Promise((resolve) => anchor.server.close(resolve));
}

await main();
