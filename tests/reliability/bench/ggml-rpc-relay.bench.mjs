// The relay cost of the merged port's ggml-RPC path against stock ggml-rpc-server of the same pin,
// on the round trip a decoding head makes per token: SET_TENSOR of the inputs, GRAPH_RECOMPUTE,
// GET_TENSOR of the logits (512 KiB: a 128k vocabulary). A/B/A rounds in one run, so machine load
// drifts show up as the two A rounds disagreeing.
//   node tests/reliability/bench/ggml-rpc-relay.bench.mjs [iterations per round] [rounds] [logits floats]
// Needs the built engine (apps/engine/dist) and native-ggml (build/bin/ggml-rpc-server). With
// BASE_ADDON=path/to/another/hydra_ggml.node a second engine runs on that addon (a before/after
// comparison in the same run: stock, base, port, stock, ...).
import { spawn } from 'node:child_process';
import { connect, createServer } from 'node:net';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..', '..');
const ITER = Number(process.argv[2] ?? 400);
const ROUNDS = Number(process.argv[3] ?? 3);
const LOGITS = Number(process.argv[4] ?? 131072);

const freePort = () =>
  new Promise((resolve) => {
    const s = createServer().listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });

function start(cmd, args, ready, env = {}) {
  const child = spawn(cmd, args, { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, ...env } });
  let out = '';
  return new Promise((resolve, reject) => {
    const on = (d) => {
      out += d;
      if (ready.test(out)) resolve(child);
    };
    child.stdout.on('data', on);
    child.stderr.on('data', on);
    child.once('exit', (c) => reject(new Error(`${cmd} exited ${c}: ${out}`)));
  });
}

class Conn {
  #chunks = [];
  #have = 0;
  #wait = null;
  constructor(sock) {
    this.sock = sock;
    sock.on('data', (d) => {
      this.#chunks.push(d);
      this.#have += d.byteLength;
      if (this.#wait && this.#have >= this.#wait.n) this.#wait.resolve();
    });
  }
  static open(port) {
    return new Promise((resolve, reject) => {
      const s = connect({ port, host: '127.0.0.1', noDelay: true }, () => resolve(new Conn(s)));
      s.once('error', reject);
    });
  }
  async read(n) {
    if (this.#have < n)
      await new Promise((resolve) => {
        this.#wait = { n, resolve };
      });
    this.#wait = null;
    const all = this.#chunks.length === 1 ? this.#chunks[0] : Buffer.concat(this.#chunks);
    this.#chunks = all.byteLength > n ? [all.subarray(n)] : [];
    this.#have -= n;
    return all.subarray(0, n);
  }
  async reply() {
    const h = await this.read(8);
    return this.read(Number(h.readBigUInt64LE(0)));
  }
  cmd(c, payload) {
    const b = Buffer.alloc(9 + payload.byteLength);
    b[0] = c;
    b.writeBigUInt64LE(BigInt(payload.byteLength), 1);
    b.set(payload, 9);
    this.sock.write(b);
  }
}

const u32 = (v) => {
  const b = Buffer.alloc(4);
  b.writeUInt32LE(v);
  return b;
};
const u64 = (v) => {
  const b = Buffer.alloc(8);
  b.writeBigUInt64LE(v);
  return b;
};
function tensor(id, buf, data, n, op = 0, src = []) {
  const b = Buffer.alloc(296);
  b.writeBigUInt64LE(id, 0);
  b.writeBigUInt64LE(buf, 12);
  b.writeUInt32LE(n, 20);
  for (let i = 1; i < 4; i++) b.writeUInt32LE(1, 20 + 4 * i);
  b.writeUInt32LE(4, 36);
  for (let i = 1; i < 4; i++) b.writeUInt32LE(4 * n, 36 + 4 * i);
  b.writeUInt32LE(op, 52);
  b.writeInt32LE(16, 120); // GGML_TENSOR_FLAG_COMPUTE
  for (const [i, s] of src.entries()) b.writeBigUInt64LE(s, 124 + 8 * i);
  b.writeBigUInt64LE(data, 220);
  return b;
}

/** The median microseconds of ITER decode-like round trips on a fresh session. */
async function round(port) {
  const c = await Conn.open(port);
  c.cmd(14, Buffer.alloc(24)); // HELLO
  await c.reply();
  c.cmd(0, Buffer.concat([u32(0), u64(BigInt(4 * LOGITS + 4096))])); // ALLOC_BUFFER
  const alloc = await c.reply();
  const buf = alloc.readBigUInt64LE(0);
  c.cmd(3, u64(buf)); // BUFFER_GET_BASE
  const base = (await c.reply()).readBigUInt64LE(0);
  const a = tensor(1n, buf, base, 16);
  const b = tensor(2n, buf, base + 64n, 16);
  const sum = tensor(3n, buf, base + 128n, 16, 2, [1n, 2n]); // ADD
  const logits = tensor(4n, buf, base + 4096n, LOGITS);
  c.cmd(10, Buffer.concat([u32(0), u32(1), u64(3n), u32(3), a, b, sum])); // GRAPH_COMPUTE
  const input = Buffer.alloc(64, 1);
  const get = Buffer.concat([logits, u64(0n), u64(BigInt(4 * LOGITS))]);
  // the median round trip of the round: on a loaded machine the mean is the scheduler's stalls
  const times = [];
  for (let i = 0; i < ITER; i++) {
    const t0 = process.hrtime.bigint();
    c.cmd(6, Buffer.concat([a, u64(0n), input])); // SET_TENSOR
    c.cmd(16, u32(0)); // GRAPH_RECOMPUTE
    c.cmd(8, get); // GET_TENSOR
    const r = await c.reply();
    if (r.byteLength !== 4 * LOGITS) throw new Error('short reply');
    times.push(Number(process.hrtime.bigint() - t0) / 1000);
  }
  c.sock.destroy();
  return med(times);
}

const med = (v) => [...v].sort((x, y) => x - y)[Math.floor(v.length / 2)];
const stockPort = await freePort();
// stock's stdout is block-buffered into a pipe: wait for its port instead of its banner
const stock = spawn(
  join(root, 'packages/native-ggml/build/bin/ggml-rpc-server'),
  ['-H', '127.0.0.1', '-p', String(stockPort), '-t', '1'],
  {
    stdio: 'ignore',
  },
);
for (let i = 0; ; i++) {
  const up = await new Promise((resolve) => {
    const s = connect({ port: stockPort, host: '127.0.0.1' }, () => {
      s.destroy();
      resolve(true);
    });
    s.once('error', () => resolve(false));
  });
  if (up) break;
  if (i > 100) throw new Error('stock ggml-rpc-server did not start');
  await new Promise((r) => setTimeout(r, 100));
}
// The engine CLI with no model, serving its merged port on `port` (env: e.g. another addon build).
const startEngine = (port, env = {}) =>
  start(
    process.execPath,
    [
      join(root, 'apps/engine/dist/cli.js'),
      '--port',
      '0',
      '--progress',
      'off',
      '-t',
      '1',
      '--rpc-port',
      String(port),
    ],
    /merged ggml-RPC\/Hydra port/,
    env,
  );
const enginePort = await freePort();
const engine = await startEngine(enginePort);
const basePort = process.env.BASE_ADDON ? await freePort() : 0;
const base = process.env.BASE_ADDON
  ? await startEngine(basePort, { HYDRA_NATIVE_ADDON: process.env.BASE_ADDON })
  : undefined;
const res = { stock: [], port: [], base: [] };
try {
  await round(stockPort); // warm every server
  await round(enginePort);
  if (base) await round(basePort);
  for (let r = 0; r < ROUNDS; r++) {
    res.stock.push(await round(stockPort));
    if (base) res.base.push(await round(basePort));
    res.port.push(await round(enginePort));
    res.stock.push(await round(stockPort));
  }
} finally {
  stock.kill('SIGTERM');
  engine.kill('SIGTERM');
  base?.kill('SIGTERM');
}
console.log(
  JSON.stringify({
    iterations: ITER,
    rounds: ROUNDS,
    logitsBytes: 4 * LOGITS,
    usPerRoundTrip: Object.fromEntries(Object.entries(res).map(([k, v]) => [k, v.map((x) => +x.toFixed(1))])),
    median: Object.fromEntries(
      Object.entries(res)
        .filter(([, v]) => v.length)
        .map(([k, v]) => [k, +med(v).toFixed(1)]),
    ),
    portOverStock: +(med(res.port) / med(res.stock)).toFixed(3),
    ...(base ? { baseOverStock: +(med(res.base) / med(res.stock)).toFixed(3) } : {}),
  }),
);
