// Per-token breakdown of the ggml-RPC path (issue 28): a head and a peer engine on loopback, one
// case per placement; per case, greedy streams of N tokens, each scraped (/metrics) once its first
// token arrived (prefill done) and at its end, so every figure is per decode step of one sequence.
// The per-peer series are the head's hydra_peer_rpc_* (combine/accounting.ts and native-ggml's
// hydra_rpc_stats.cpp say what each measures), local compute hydra_local_compute_seconds_total.
// Run after `pnpm run build:ts`:
//   node bench/rpc-breakdown-bench.mjs [--model GGUF] [--moe-model GGUF] [--cases local,remote,split,moe]
//     [--local-device CPU|CUDA0] [--split-ngl 2] [--tokens 128] [--runs 1] [--streams 7] [--threads N]
//     [--head-env K=V ...] [--peer-env K=V ...] [--cli FILE] [--tools DIR] [--commit SHA] [--out FILE]
// With no --model (--moe-model) the tiny synthetic llama (moe) q8_0 model is written and used.
// Cases: local = the head alone, every layer on --local-device (the anchor); remote = every layer
// on the peer (RPC0); split = --tensor-split 1,1 over RPC0 and --local-device (a CPU head: the
// last --split-ngl layers on the peer); moe = the MoE model in COMBINED mode (experts on the peer,
// the rest local); moe-local = the MoE model alone on the head (the MoE anchor); moe-ot = the same
// engine given upstream's own `-ot ffn_.*_exps=RPC0[peer]`; moe-stock = COMBINED against a stock
// ggml-rpc-server instead of a peer engine (the peer's transport, same head); moe-upstream =
// upstream llama-bench -ot on a stock ggml-rpc-server (tok/s only: it has no accounting);
// moe-upstream-engine = the same llama-bench against a peer engine, whose hydra_rpc_* give its
// per-token bytes and commands. The tools (llama-bench, ggml-rpc-server) come from --tools, by
// default native-ggml's build/bin.
import { execFileSync, spawn } from 'node:child_process';
import { mkdirSync, mkdtempSync, writeFileSync } from 'node:fs';
import { connect } from 'node:net';
import { cpus, loadavg, tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
// figures.mjs holds only node: builtins and native-ggml's addon-free ports module, so one esbuild
// bundle of this file runs on a machine without node_modules (the GPU device: see --cli).
import { argv, engineCli, envOf, many, one, resultDoc, startEngine, summary, waitFor } from './figures.mjs';

const CLI = engineCli();

const writeSyntheticModel = async (o) =>
  (await import('@hydra-engine/native-ggml/synth')).writeSyntheticModel(o);

const cases = one('--cases', 'local,remote,split,moe').split(',');
const localDevice = one('--local-device', 'CPU');
const nTokens = Number(one('--tokens', '128'));
const runs = Number(one('--runs', '1'));
const streams = Number(one('--streams', '7'));
const threads = one('--threads', '1');
const splitNgl = one('--split-ngl', '2');
const tools = resolve(
  one('--tools', new URL('../../../packages/native-ggml/build/bin', import.meta.url).pathname),
);
// Upstream's spelling of the expert override, as the H200 combine anchor runs it.
const UPSTREAM_OT = 'ffn_.*_exps';
const out = resolve(
  one(
    '--out',
    new URL('../../../benchmarks/results/cpu-rpc-breakdown-20261201.json', import.meta.url).pathname,
  ),
);
const tmp = mkdtempSync(join(tmpdir(), 'hydra-rpc-breakdown-'));
let model = one('--model');
if (!model) {
  model = join(tmp, 'tiny.gguf');
  await writeSyntheticModel({ arch: 'llama', shape: 'tiny', quant: 'q8_0', seed: 3, out: model });
}
let moeModel = one('--moe-model');
if (!moeModel && cases.some((c) => c.startsWith('moe'))) {
  moeModel = join(tmp, 'tiny-moe.gguf');
  await writeSyntheticModel({ arch: 'moe', shape: 'tiny', quant: 'q8_0', seed: 3, out: moeModel });
}
const PROMPT = 'Hello world, this is a test of the remote path';

const engine = (flags, env) => startEngine(CLI, ['-t', threads, ...flags], env);

// A stock upstream ggml-rpc-server (the peer of moe-stock and moe-upstream), up once it accepts.
async function stockServer() {
  const port = await freePort();
  const dev = localDevice === 'CPU' ? [] : ['-d', localDevice];
  const child = spawn(
    join(tools, 'ggml-rpc-server'),
    ['-H', '127.0.0.1', '-p', String(port), '-t', threads, ...dev],
    {
      stdio: ['ignore', 'ignore', 'pipe'],
      env: { ...process.env, ...envOf(many('--peer-env')) },
    },
  );
  let log = '';
  child.stderr.on('data', (d) => {
    log += d;
  });
  const accepts = () =>
    new Promise((r) => {
      const s = connect(port, '127.0.0.1');
      s.once('connect', () => {
        s.destroy();
        r(true);
      });
      s.once('error', () => r(false));
    });
  await waitFor(
    async () => {
      if (child.exitCode !== null) throw new FatalError(`ggml-rpc-server exited: ${log.slice(-2000)}`);
      return accepts();
    },
    30_000,
    'ggml-rpc-server start',
  );
  return { rpc: `127.0.0.1:${port}`, child };
}

// The hydra_rpc_* totals a peer engine serves (bytes each way, commands): what a client without
// accounting of its own (llama-bench) sent. Read once no session is open and two reads 200 ms
// apart agree: a session's figures are added as its host process reports them.
async function servedTotals(url) {
  const read = async () => {
    // A fresh connection each read: llama-bench ran synchronously in between, long enough for the
    // server to close an idle keep-alive socket under a reused one.
    const text = await (await fetch(`${url}/metrics`, { headers: { connection: 'close' } })).text();
    const at = (k) => Number(new RegExp(`^${k} (\\S+)$`, 'm').exec(text)?.[1] ?? Number.NaN);
    return {
      active: at('hydra_rpc_sessions_active'),
      in: at('hydra_rpc_bytes_in_total'),
      out: at('hydra_rpc_bytes_out_total'),
      commands: at('hydra_rpc_commands_total'),
    };
  };
  let last = await read();
  for (let i = 0; i < 100; i++) {
    await new Promise((r) => setTimeout(r, 200));
    const now = await read();
    if (now.active === 0 && JSON.stringify(now) === JSON.stringify(last)) return now;
    last = now;
  }
  throw new Error(`the peer's served totals did not settle: ${JSON.stringify(last)}`);
}

// upstream llama-bench with the experts on `peer` through -ot: one decode rate per repetition.
// The placement is the moe case's: every layer on the head (a CPU head offloads none; a GPU head
// names the peer's device with no layers, as COMBINED does, since llama-bench's default would also
// split whole layers onto the peer by free memory).
function llamaBench(peer, n, reps) {
  const placement =
    localDevice === 'CPU' ? ['-ngl', '0'] : ['-ngl', '99', '-dev', `RPC0/${localDevice}`, '-ts', '0/1'];
  const args = ['-m', moeModel, '-p', '0', '-n', String(n), '-r', String(reps), '-t', threads, '-o', 'json'];
  args.push(...placement, '--rpc', peer, '-ot', `${UPSTREAM_OT}=RPC0[${peer}]`);
  const out = execFileSync(join(tools, 'llama-bench'), args, {
    encoding: 'utf8',
    stdio: ['ignore', 'pipe', 'ignore'],
    timeout: 600_000,
  });
  return JSON.parse(out)[0].samples_ts;
}

const stop = (child) =>
  new Promise((r) => {
    // A stock server can die of SIGPIPE when its client is killed mid-reply: gone by a signal,
    // its 'exit' has already fired.
    if (child.exitCode !== null || child.signalCode !== null) return r();
    child.once('exit', () => r());
    child.kill('SIGKILL');
  });

async function complete(url, n) {
  const t0 = performance.now();
  const r = await fetch(`${url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({
      prompt: PROMPT,
      max_tokens: n,
      temperature: 0,
      ignore_eos: true,
      cache_prompt: false,
    }),
  });
  const j = await r.json();
  if (r.status !== 200) throw new Error(`completion: ${r.status} ${JSON.stringify(j)}`);
  return { ms: performance.now() - t0, tokens: j.usage?.completion_tokens ?? n };
}

// One /metrics scrape: the per-peer series, the local compute and the engine's step counters all
// come from the same native read, so they are consistent with each other.
async function scrape(url) {
  const t0 = performance.now();
  const text = await (await fetch(`${url}/metrics`)).text();
  const at = (t0 + performance.now()) / 2;
  const v = new Map();
  for (const line of text.split('\n')) {
    const m = /^([a-z_]+)(\{[^}]*\})? (\S+)$/.exec(line);
    if (m) v.set(m[1] + (m[2] ?? ''), Number(m[3]));
  }
  const get = (k) => v.get(k) ?? 0;
  const peers = new Map();
  for (const [k, n] of v) {
    const m = /^hydra_peer_rpc_([a-z_]+)\{peer="([^"]+)"(?:,(command|on)="([^"]+)")?\}$/.exec(k);
    if (!m) continue;
    const p = peers.get(m[2]) ?? { commands: {} };
    if (m[3] === 'command') p.commands[m[4]] = n;
    else if (m[3] === 'on') p[`wait_${m[4]}_ms`] = n * 1000;
    else p[m[1]] = m[1].endsWith('seconds_total') ? n * 1000 : n;
    peers.set(m[2], p);
  }
  let local = 0;
  for (const [k, n] of v) if (k.startsWith('hydra_local_compute_seconds_total{')) local += n * 1000;
  return {
    at,
    steps: get('hydra_decode_steps_total'),
    tokens: get('hydra_generated_tokens_total'),
    local,
    peers,
  };
}

// Per decode step between two scrapes.
function perStep(s1, s2) {
  const steps = s2.steps - s1.steps;
  const per = (x) => Math.round((x / steps) * 1000) / 1000;
  const peers = [...s2.peers].map(([endpoint, b]) => {
    const a = s1.peers.get(endpoint) ?? { commands: {} };
    const d = (k) => (b[k] ?? 0) - (a[k] ?? 0);
    const commands = {};
    for (const c of Object.keys(b.commands)) {
      const n = b.commands[c] - (a.commands[c] ?? 0);
      if (n > 0) commands[c] = per(n);
    }
    return {
      endpoint,
      commands,
      round_trips: per(d('round_trips_total')),
      bytes_sent: per(d('sent_bytes_total')),
      bytes_received: per(d('received_bytes_total')),
      serialize_ms: per(d('serialize_seconds_total')),
      send_wait_ms: per(d('wait_send_ms')),
      reply_wait_ms: per(d('wait_reply_ms')),
      rtt_us: Math.round((b.rtt_seconds ?? 0) * 1e6),
    };
  });
  const wall = (s2.at - s1.at) / steps;
  const local = (s2.local - s1.local) / steps;
  const waits = peers.reduce((sum, p) => sum + p.serialize_ms + p.send_wait_ms + p.reply_wait_ms, 0);
  return {
    steps,
    wall_ms: per(wall * steps),
    tokens_per_second: Math.round((1000 / wall) * 10) / 10,
    local_compute_ms: per(local * steps),
    other_ms: per((wall - local) * steps - waits * steps),
    peers,
  };
}

// A greedy stream of n tokens: scraped once its first token arrived (prefill done) and at its end.
async function measured(url, n) {
  const r = await fetch(`${url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ prompt: PROMPT, max_tokens: n, temperature: 0, ignore_eos: true, stream: true }),
  });
  if (r.status !== 200) throw new Error(`completion: ${r.status} ${await r.text()}`);
  let first;
  let text = '';
  for await (const chunk of r.body) {
    text += Buffer.from(chunk).toString();
    if (first === undefined && text.includes('"text"')) first = await scrape(url);
  }
  const end = await scrape(url);
  // The per-peer figures are one native read shared by scrapes 50 ms apart: a stream shorter than
  // that reads the first scrape's again (0 commands). The engine is idle now, so a later read
  // gives them; the time stays the stream's end.
  await new Promise((r) => setTimeout(r, 60));
  const last = await scrape(url);
  return perStep(first, { ...last, at: end.at });
}

// On a CPU head the layers not offloaded stay on the CPU (llama.cpp takes no CPU entry in its
// device list): the split offloads the last --split-ngl layers (and the output) to the peer.
function caseFlags(name, peer) {
  const cpu = localDevice === 'CPU';
  switch (name) {
    case 'local':
      return cpu ? ['-m', model, '-ngl', '0'] : ['-m', model, '--device', localDevice, '-ngl', '99'];
    case 'remote':
      return ['-m', model, '--rpc', peer, '--device', 'RPC0', '-ngl', '99'];
    case 'split':
      return cpu
        ? ['-m', model, '--rpc', peer, '--device', 'RPC0', '-ngl', splitNgl]
        : [
            '-m',
            model,
            '--rpc',
            peer,
            '--device',
            `RPC0,${localDevice}`,
            '--tensor-split',
            '1,1',
            '-ngl',
            '99',
          ];
    case 'moe':
    case 'moe-stock':
      // COMBINED: the engine puts every expert tensor on the peer, the rest where the flags say.
      return cpu
        ? ['-m', moeModel, '--rpc', peer, '-ngl', '0']
        : ['-m', moeModel, '--rpc', peer, '--device', localDevice, '-ngl', '99'];
    case 'moe-ot':
      // The same engine with upstream's override instead of the COMBINED placement.
      return [...caseFlags('moe', peer), '-ot', `${UPSTREAM_OT}=RPC0[${peer}]`];
    case 'moe-local':
      return cpu ? ['-m', moeModel, '-ngl', '0'] : ['-m', moeModel, '--device', localDevice, '-ngl', '99'];
    default:
      throw new Error(`unknown case ${name} (${CASES.join(', ')})`);
  }
}

const CASES = [
  'local',
  'remote',
  'split',
  'moe',
  'moe-local',
  'moe-ot',
  'moe-stock',
  'moe-upstream',
  'moe-upstream-engine',
];
for (const c of cases) if (!CASES.includes(c)) throw new Error(`unknown case ${c} (${CASES.join(', ')})`);

const round3 = (x) => (typeof x === 'number' ? Math.round(x * 1000) / 1000 : x);

// The median of each figure over every stream of every run: on a loaded machine a stream can catch
// a stall (the components are medians each, so they need not add up exactly).
const median = (xs) => {
  const v = xs.filter((x) => typeof x === 'number').sort((a, b) => a - b);
  if (v.length === 0) return null;
  return round3(v.length % 2 ? v[(v.length - 1) / 2] : (v[v.length / 2 - 1] + v[v.length / 2]) / 2);
};
function medianOf(objs) {
  if (objs[0] === null || typeof objs[0] !== 'object') return median(objs);
  if (Array.isArray(objs[0])) return objs[0].map((_, i) => medianOf(objs.map((x) => x[i])));
  const o = {};
  for (const k of Object.keys(objs[0])) o[k] = medianOf(objs.map((x) => x[k]));
  return o;
}

const loadBefore = loadavg()[0];
const results = [];
const sampleSets = new Map();
// llama-bench has no accounting: its rate per repetition, and against a peer engine the bytes and
// commands that engine served, per token from two runs of N and 2N tokens (the load, the context's
// reservation and the warm-up are the same in both, so they cancel).
async function upstreamRow(name) {
  const rates = [];
  const perToken = [];
  for (let run = 0; run < runs; run++) {
    const peer = name === 'moe-upstream' ? await stockServer() : await engine([], envOf(many('--peer-env')));
    try {
      const t0 = peer.url ? await servedTotals(peer.url) : undefined;
      rates.push(...llamaBench(peer.rpc, nTokens, streams));
      if (!peer.url) continue;
      const t1 = await servedTotals(peer.url);
      llamaBench(peer.rpc, 2 * nTokens, streams);
      const t2 = await servedTotals(peer.url);
      const per = (k) => round3((t2[k] - t1[k] - (t1[k] - t0[k])) / (nTokens * streams));
      perToken.push({ commands: per('commands'), bytes_sent: per('in'), bytes_received: per('out') });
    } finally {
      await stop(peer.child);
    }
  }
  const tps = median(rates);
  return {
    row: {
      case: name,
      runs,
      streams_per_run: streams,
      tokens_per_second: tps,
      per_token: {
        wall_ms: round3(1000 / tps),
        peers: perToken.length > 0 ? [medianOf(perToken)] : [],
        measured_by: perToken.length > 0 ? "the peer engine's hydra_rpc_* totals" : 'llama-bench (rate only)',
      },
    },
    samples: rates.map((r) => ({ tokens_per_second: r, peers: [] })),
  };
}

for (const name of cases) {
  if (name.startsWith('moe-upstream')) {
    const { row, samples } = await upstreamRow(name);
    sampleSets.set(name, samples);
    results.push(row);
    const p = row.per_token.peers[0];
    console.log(
      `${name}: ${row.tokens_per_second} tok/s` +
        (p ? ` (${p.commands} commands, ${p.bytes_sent} B out, ${p.bytes_received} B in per token)` : ''),
    );
    writeResults();
    continue;
  }
  const samples = [];
  for (let run = 0; run < runs; run++) {
    const peer =
      name === 'local' || name === 'moe-local'
        ? undefined
        : name === 'moe-stock'
          ? await stockServer()
          : await engine([], envOf(many('--peer-env')));
    const head = await engine(caseFlags(name, peer?.rpc), envOf(many('--head-env')));
    try {
      // Warm-up: graphs reserved, first buffers touched, caches filled.
      await complete(head.url, 16);
      for (let k = 0; k < streams; k++) samples.push(await measured(head.url, nTokens));
    } finally {
      await stop(head.child);
      if (peer) await stop(peer.child);
    }
  }
  const m = medianOf(
    samples.map(({ peers, ...rest }) => ({ ...rest, peers: peers.map(({ endpoint, ...p }) => p) })),
  );
  const row = {
    case: name,
    runs,
    streams_per_run: streams,
    steps_per_stream: median(samples.map((x) => x.steps)),
    tokens_per_second: m.tokens_per_second,
    per_token: {
      wall_ms: m.wall_ms,
      local_compute_ms: m.local_compute_ms,
      other_ms: m.other_ms,
      peers: m.peers,
    },
    wall_ms_samples: samples.map((x) => round3(x.wall_ms)),
  };
  sampleSets.set(name, samples);
  results.push(row);
  const p = row.per_token.peers?.[0];
  console.log(
    `${name}: ${row.tokens_per_second} tok/s, per token ${row.per_token.wall_ms} ms = local compute ${row.per_token.local_compute_ms}` +
      (p
        ? ` + serialize ${p.serialize_ms} + send wait ${p.send_wait_ms} + peer wait ${p.reply_wait_ms}` +
          ` (${p.round_trips} round trips, ${p.bytes_sent} B out, ${p.bytes_received} B in, rtt ${p.rtt_us} us)`
        : '') +
      ` + other ${row.per_token.other_ms}`,
  );
  writeResults();
}
console.log(`wrote ${out}`);

// Written after every case, so a run cut short by its caller's timeout keeps the cases it finished.
function writeResults() {
  const notes = {
    command: `node apps/engine/bench/rpc-breakdown-bench.mjs ${argv.join(' ')}`.trim(),
    model: one('--model') ?? 'synthetic llama tiny q8_0 (seed 3)',
    moe_model: cases.some((c) => c.startsWith('moe'))
      ? (one('--moe-model') ?? 'synthetic moe tiny q8_0 (seed 3)')
      : undefined,
    local_device: localDevice,
    host: { cpus: cpus().length, load_average_1m: { before: loadBefore, after: loadavg()[0] } },
    ...(Math.max(loadBefore, loadavg()[0]) > cpus().length
      ? {
          caveat:
            'load average above the core count: the times include waiting for a core (compare counts and bytes, not ms)',
        }
      : {}),
    tokens: nTokens,
    runs,
    streams: streams,
    aggregate: 'median over every stream of every run, per figure (so the parts need not add up exactly)',
    threads: Number(threads),
    measures: {
      wall_ms:
        '(duration of the N2 request - the N1 request) / (N2 - N1): one decode step, HTTP and prefill cancelled',
      local_compute_ms:
        "time in the head's local backends' graph_compute and synchronize (a GPU's compute is async: launch + synchronize waits)",
      serialize_ms:
        'time in the RPC backend graph_compute (graph serialization) and queueing async sets/gets (payload copy)',
      send_wait_ms:
        'time blocked until a command without a reply was written (sync set_tensor of step inputs, memset, clear)',
      reply_wait_ms:
        "time blocked on the peer's replies (get_tensor, synchronize, event waits): peer compute + network + receiving the reply",
      round_trips: 'commands the peer answered, per token',
      'bytes_sent/bytes_received': "kernel TCP_INFO of upstream's connection to the peer, per token",
      other_ms:
        'wall - local compute - serialize - waits: ggml scheduling, host sampling when not on the device, the engine loop',
      sampling:
        'with backend sampling (default) the sampler runs inside the graph of the device that holds the output layer, so it is part of local compute or peer wait',
    },
    results,
  };

  // Figures in the benchmarks' results schema (the dashboard reads every results file): per case the
  // decode rate against the local anchor, and the per-token wait, round trips and bytes of peer 0.
  const figures = [];
  // The MoE cases' anchor is the MoE model alone on the head (moe-local), the others' local.
  const anchorOf = (name) =>
    sampleSets.has(name)
      ? summary(
          `${name} decode`,
          'tok/s',
          sampleSets.get(name).map((x) => x.tokens_per_second),
        )
      : undefined;
  for (const [name, samples] of sampleSets) {
    const label = `rpc-breakdown ${name}`;
    figures.push(
      summary(
        `${label} decode`,
        'tok/s',
        samples.map((x) => x.tokens_per_second),
        name === 'local' || name === 'moe-local'
          ? undefined
          : anchorOf(name.startsWith('moe') ? 'moe-local' : 'local'),
      ),
    );
    if (name === 'local' || name === 'moe-local' || samples[0]?.peers.length === 0) continue;
    const p0 = (pick) => samples.map((x) => pick(x.peers[0]));
    const lower = (fig) => ({ ...fig, better: 'lower' });
    for (const [what, unit, pick] of [
      ['peer wait per token', 'ms', (p) => p.reply_wait_ms + p.send_wait_ms],
      ['round trips per token', 'count', (p) => p.round_trips],
      ['bytes out per token', 'bytes', (p) => p.bytes_sent],
      ['bytes in per token', 'bytes', (p) => p.bytes_received],
    ])
      figures.push(lower(summary(`${label} ${what}`, unit, p0(pick))));
  }
  const doc = resultDoc('rpc-breakdown', figures, notes);
  mkdirSync(dirname(out), { recursive: true });
  writeFileSync(out, `${JSON.stringify(doc, null, 2)}\n`);
}
