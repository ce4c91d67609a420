// The GPU system benchmark (benchmarks/README.md, "GPU system benchmark"). Plain Node ESM: run it
// from the checkout (`node benchmarks/gpu/run.mjs`, needs node_modules and the built dist/ folders)
// or, on a machine without node_modules, as the bundle `node benchmarks/dist/gpu/run.cjs` that
// `node benchmarks/gpu/bundle.mjs` writes. Every figure is measured against an upstream anchor of
// the same pin in the same run. One call stays under --budget-s (default 570 s): parts that would
// not fit are recorded as skipped, and the results file is rewritten after each part.
import { execFileSync, spawn } from 'node:child_process';
import { closeSync, existsSync, openSync, readSync, statSync, writeFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { HydraClient } from '@hydra-engine/hydra-rpc';
import { freeLoopbackPort as freePort } from '@hydra-engine/native-ggml/ports';
import { planSyntheticModel, writeSyntheticModel } from '@hydra-engine/native-ggml/synth';
import { newResult, repoRoot, resultFileName, resultsDir, writeResult } from '../dist/results.js';
import { makeFigure } from '../dist/schema.js';

const PARTS = ['synth', 'solo', 'rpc', 'combine', 'boot', 'control', 'switch', 'load'];
const USAGE = `usage: node benchmarks/gpu/run.mjs [--only ${PARTS.join(',')}] [--shapes 8b,27b] [--moe-shape 8b]
  [--rpc-shape 8b] [--combine-shapes 8b] [--peer-gpu N] [--load-shape 27b] [--reps 3] [--ngl 99] [--models DIR] [--tools DIR] [--out DIR]
  [--bandwidth-gbs N] [--budget-s 570] [--cold-reps 1] [--dry-run]`;

function parseArgs(argv) {
  const o = {
    only: PARTS,
    shapes: ['8b', '27b'],
    moeShape: '8b',
    rpcShape: '8b',
    combineShapes: ['8b'],
    peerGpu: undefined,
    loadShape: '27b',
    reps: 3,
    coldReps: 1,
    ngl: 99,
    models: undefined,
    tools: undefined,
    out: undefined,
    bandwidthGbs: undefined,
    budgetS: 570,
    dryRun: false,
  };
  for (let i = 0; i < argv.length; i++) {
    const [flag, inline] = argv[i].split(/=(.*)/s, 2);
    const value = () => {
      const v = inline ?? argv[++i];
      if (v === undefined) fail(`${flag} needs a value`);
      return v;
    };
    const list = () =>
      value()
        .split(',')
        .map((s) => s.trim())
        .filter(Boolean);
    const int = () => {
      const n = Number(value());
      if (!Number.isInteger(n) || n < 0) fail(`${flag} must be a non-negative integer`);
      return n;
    };
    if (flag === '--help' || flag === '-h') {
      console.log(USAGE);
      process.exit(0);
    }
    if (flag === '--dry-run') {
      o.dryRun = true;
      continue;
    }
    // flag -> option key and how its value is read
    const readers = {
      '--only': ['only', list],
      '--shapes': ['shapes', list],
      '--moe-shape': ['moeShape', value],
      '--rpc-shape': ['rpcShape', value],
      '--peer-gpu': ['peerGpu', int],
      '--combine-shapes': ['combineShapes', list],
      '--load-shape': ['loadShape', value],
      '--reps': ['reps', () => Math.max(1, int())],
      '--cold-reps': ['coldReps', int],
      '--ngl': ['ngl', int],
      '--models': ['models', () => resolve(value())],
      '--tools': ['tools', () => resolve(value())],
      '--out': ['out', () => resolve(value())],
      '--bandwidth-gbs': ['bandwidthGbs', () => Number(value())],
      '--budget-s': ['budgetS', int],
    };
    const reader = Object.hasOwn(readers, flag) ? readers[flag] : undefined;
    if (!reader) fail(`unknown flag ${flag}`);
    o[reader[0]] = reader[1]();
    if (flag === '--only') for (const p of o.only) if (!PARTS.includes(p)) fail(`--only: unknown part ${p}`);
  }
  return o;
}

function fail(message) {
  console.error(`gpu bench: ${message}\n${USAGE}`);
  process.exit(2);
}

const here = dirname(fileURLToPath(import.meta.url));
const root = repoRoot(here);
const opts = parseArgs(process.argv.slice(2));
const t0 = Date.now();
const deadline = t0 + opts.budgetS * 1000;
const elapsed = () => `${((Date.now() - t0) / 1000).toFixed(0).padStart(4)}s`;
const log = (msg) => console.error(`[${elapsed()}] ${msg}`);
const remainingS = () => (deadline - Date.now()) / 1000;

const nativeDir = join(root, 'packages/native-ggml');
const toolsDir =
  opts.tools ??
  [join(nativeDir, 'build-cuda/bin'), join(nativeDir, 'build/bin')].find((d) =>
    existsSync(join(d, 'llama-bench')),
  );
const modelsDir = opts.models ?? join(root, 'models/bench');
const outDir = opts.out ?? resultsDir(root);
const tool = (name) => {
  const p = toolsDir && join(toolsDir, name);
  if (!p || !existsSync(p))
    throw new Error(
      `${name} not found (looked in ${toolsDir ?? 'packages/native-ggml/build{-cuda,}/bin'}); run benchmarks/gpu/build.sh`,
    );
  return p;
};
const addon = process.env.HYDRA_NATIVE_ADDON ?? (toolsDir ? join(toolsDir, 'hydra_ggml.node') : undefined);
// The engine: the bundle beside this file when it runs bundled, else the tsc output.
const engineCli = [
  join(here, 'cli.cjs'),
  join(root, 'benchmarks/dist/gpu/cli.cjs'),
  join(root, 'apps/engine/dist/cli.js'),
].find((p) => existsSync(p));

const figures = [];
const skipped = [];
const notes = {
  parts: opts.only,
  tools: toolsDir,
  engine: engineCli,
  reps: opts.reps,
  ngl: opts.ngl,
  models: {},
};
const started = new Date();
let resultPath;

function save() {
  const r = newResult('gpu', figures, skipped, notes, started);
  resultPath = join(outDir, resultFileName(r));
  writeResult(r, outDir);
}

function skip(name, reason) {
  log(`skip ${name}: ${reason}`);
  skipped.push({ name, reason });
}

function add(figure) {
  figures.push(figure);
  const a = figure.anchor
    ? ` | anchor ${figure.anchor.median.toPrecision(4)} ${figure.anchor.unit} (x${figure.ratio?.toFixed(3)})`
    : '';
  log(`${figure.name}: ${figure.median.toPrecision(4)} ${figure.unit}${a}`);
}

// ---------------------------------------------------------------- helpers

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

const children = new Set();
function startProcess(cmd, args, env = {}) {
  const child = spawn(cmd, args, { env: { ...process.env, ...env }, stdio: ['ignore', 'ignore', 'pipe'] });
  let tail = '';
  child.stderr.on('data', (d) => {
    tail = (tail + d.toString()).slice(-4000);
  });
  child.tail = () => tail;
  child.exited = new Promise((ok) => child.once('exit', (code, signal) => ok({ code, signal })));
  children.add(child);
  child.once('exit', () => children.delete(child));
  return child;
}

async function stopProcess(child) {
  if (!child || child.exitCode !== null || child.signalCode !== null) return;
  child.kill('SIGTERM');
  const done = await Promise.race([child.exited.then(() => true), sleep(15_000).then(() => false)]);
  if (!done) {
    child.kill('SIGKILL');
    await child.exited;
  }
}

function killAll() {
  for (const c of children) c.kill('SIGKILL');
}
process.on('exit', killAll);
for (const sig of ['SIGINT', 'SIGTERM'])
  process.on(sig, () => {
    killAll();
    process.exit(130);
  });

/** Polls `url` until `accept(status, json)` holds; returns ms since `since`. */
async function waitHttp(url, accept, since, child, timeoutMs) {
  const end = Date.now() + timeoutMs;
  for (;;) {
    if (child && (child.exitCode !== null || child.signalCode !== null))
      throw new Error(`process exited before ready:\n${child.tail()}`);
    try {
      const res = await fetch(url, { signal: AbortSignal.timeout(2000) });
      const body = await res.json().catch(() => ({}));
      if (accept(res.status, body)) return performance.now() - since;
      if (body.state === 'error') throw new Error(`engine reports state error:\n${child?.tail() ?? ''}`);
    } catch (err) {
      if (/state error|exited/.test(err.message)) throw err;
    }
    if (Date.now() > end) throw new Error(`not ready after ${timeoutMs} ms:\n${child?.tail() ?? ''}`);
    await sleep(5);
  }
}

async function waitTcp(port, child, timeoutMs) {
  const { connect } = await import('node:net');
  const end = Date.now() + timeoutMs;
  for (;;) {
    if (child && child.exitCode !== null)
      throw new Error(`process exited before listening:\n${child.tail()}`);
    const ok = await new Promise((r) => {
      const s = connect(port, '127.0.0.1');
      s.once('connect', () => {
        s.destroy();
        r(true);
      });
      s.once('error', () => r(false));
    });
    if (ok) return;
    if (Date.now() > end)
      throw new Error(`port ${port} not listening after ${timeoutMs} ms:\n${child?.tail() ?? ''}`);
    await sleep(20);
  }
}

function engineEnv() {
  return addon ? { HYDRA_NATIVE_ADDON: addon } : {};
}

/** Starts an engine; resolves once /health says `state` (or `empty` when no model). */
async function startEngine(args, { state = 'ready', timeoutMs = 300_000, env = {} } = {}) {
  if (!engineCli) throw new Error('no engine: build apps/engine or run benchmarks/gpu/bundle.mjs');
  const port = await freePort();
  const since = performance.now();
  const child = startProcess(
    process.execPath,
    [engineCli, '--port', String(port), '--progress', 'off', ...args],
    { ...engineEnv(), ...env },
  );
  const readyMs = await waitHttp(
    `http://127.0.0.1:${port}/health`,
    (s, b) => s === 200 && b.state === state,
    since,
    child,
    timeoutMs,
  );
  return { child, port, readyMs, url: `http://127.0.0.1:${port}` };
}

function runTool(name, args, timeoutMs, env = {}) {
  const started = performance.now();
  const out = execFileSync(tool(name), args, {
    env: { ...process.env, ...env },
    encoding: 'utf8',
    stdio: ['ignore', 'pipe', 'pipe'],
    timeout: timeoutMs,
    maxBuffer: 64 << 20,
  });
  return { out, ms: performance.now() - started };
}

/** llama-bench -o json; returns {pp, tg} arrays of per-repetition t/s. */
function llamaBench(args, timeoutMs, env = {}) {
  const { out } = runTool('llama-bench', [...args, '-o', 'json'], timeoutMs, env);
  const rows = JSON.parse(out);
  const pp = rows.find((r) => r.n_prompt > 0 && r.n_gen === 0);
  const tg = rows.find((r) => r.n_gen > 0 && r.n_prompt === 0);
  return { pp: pp?.samples_ts ?? [], tg: tg?.samples_ts ?? [], rows };
}

const WORDS =
  'the of and to in is that it was for on are with as his they be at one have this from or had by word but what some we can out other were all there when up use your how said an each she which do their time if will way about many then them would write like so these her long make thing see him two has look more day could go come did my sound no most number who over know water than call first people may down side been now find'.split(
    ' ',
  );

/** A prompt of about `n` tokens of the synthetic vocabulary (whole English words are one token each). */
function promptOf(n, salt) {
  const words = [`${WORDS[salt % WORDS.length]}${salt}`];
  for (let i = 0; words.length < n - 2; i++) words.push(WORDS[(i * 7 + salt) % WORDS.length]);
  return words.join(' ');
}

/** The flags every serving engine of these benchmarks gets: one slot, a 4K context, FA on. */
function servingArgs(model) {
  return ['-m', model, '-ngl', String(opts.ngl), '-fa', 'on', '-c', '4096', '-np', '1'];
}

/** One streamed completion; returns prompt/completion tokens, ttft and decode ms. */
async function complete(url, prompt, maxTokens) {
  const body = {
    prompt,
    max_tokens: maxTokens,
    temperature: 0,
    ignore_eos: true,
    stream: true,
    stream_options: { include_usage: true },
  };
  const t = performance.now();
  const res = await fetch(`${url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body),
  });
  if (!res.ok) throw new Error(`HTTP ${res.status}: ${await res.text()}`);
  const decoder = new TextDecoder();
  let buf = '';
  let first;
  let last;
  let usage;
  for await (const chunk of res.body) {
    const now = performance.now();
    buf += decoder.decode(chunk, { stream: true });
    for (let nl = buf.indexOf('\n'); nl >= 0; nl = buf.indexOf('\n')) {
      const line = buf.slice(0, nl).trim();
      buf = buf.slice(nl + 1);
      if (!line.startsWith('data:')) continue;
      const data = line.slice(5).trim();
      if (data === '[DONE]') continue;
      const msg = JSON.parse(data);
      if (msg.error) throw new Error(`stream error: ${JSON.stringify(msg.error)}`);
      if (msg.usage) usage = msg.usage;
      if (msg.choices?.length) {
        first ??= now;
        last = now;
      }
    }
  }
  if (!usage) throw new Error('no usage in the stream');
  return {
    prompt: usage.prompt_tokens,
    completion: usage.completion_tokens,
    ttftMs: (first ?? performance.now()) - t,
    decodeMs: (last ?? first) - (first ?? 0),
  };
}

function modelPath(arch, shape) {
  return join(modelsDir, `${arch}-${shape}-q4_0.gguf`);
}

/** Bytes read per decoded token: the whole file for dense models, the active experts' share for MoE. */
function bytesPerToken(arch, shape) {
  const plan = planSyntheticModel({ arch, shape, quant: 'q4_0' });
  if (arch !== 'moe') return plan.bytes;
  const h = plan.hparams;
  const expertBytes = (3 * h.nLayer * h.nEmbd * h.nFf * h.nExpert * 18) / 32;
  return plan.bytes - expertBytes * (1 - h.nExpertUsed / h.nExpert);
}

function bandwidthGbs(gpus) {
  if (opts.bandwidthGbs) return { value: opts.bandwidthGbs, source: '--bandwidth-gbs' };
  if (gpus?.some((g) => /H200/i.test(g)))
    return { value: 4800, source: 'NVIDIA H200 datasheet, 4.8 TB/s HBM3e' };
  if (gpus?.some((g) => /H100/i.test(g)))
    return { value: 3350, source: 'NVIDIA H100 SXM datasheet, 3.35 TB/s' };
  return undefined;
}

function gpuNames() {
  try {
    return execFileSync('nvidia-smi', ['--query-gpu=name', '--format=csv,noheader'], {
      encoding: 'utf8',
      stdio: ['ignore', 'pipe', 'ignore'],
    })
      .split('\n')
      .map((s) => s.trim())
      .filter(Boolean);
  } catch {
    return [];
  }
}

/** Drops `file` from the page cache: drop_caches when writable (root), else fadvise DONTNEED via dd. */
function dropCache(file) {
  try {
    execFileSync('sync');
    writeFileSync('/proc/sys/vm/drop_caches', '1');
    return 'drop_caches';
  } catch {
    execFileSync('dd', [`of=${file}`, 'oflag=nocache', 'conv=notrunc,fdatasync', 'count=0'], {
      stdio: 'ignore',
    });
    return 'dd oflag=nocache';
  }
}

async function part(name, estimateS, fn) {
  if (!opts.only.includes(name)) return;
  if (remainingS() < estimateS) {
    skip(
      name,
      `time budget: ${remainingS().toFixed(0)} s left of --budget-s ${opts.budgetS}, part needs about ${estimateS} s; run it in its own call (--only ${name})`,
    );
    save();
    return;
  }
  log(`== ${name}`);
  try {
    await fn();
  } catch (err) {
    skip(name, `failed: ${err.message.split('\n').slice(0, 6).join(' | ')}`);
  } finally {
    killAll();
    save();
  }
}

function within(estimateS, name) {
  if (remainingS() < estimateS) {
    skip(name, `time budget: ${remainingS().toFixed(0)} s left`);
    return false;
  }
  return true;
}

// ---------------------------------------------------------------- parts

async function synth() {
  const want = [...opts.shapes.map((s) => ['llama', s]), ['moe', opts.moeShape]];
  want.push(['llama', opts.rpcShape], ['llama', opts.loadShape]);
  if (opts.only.includes('combine')) for (const s of opts.combineShapes) want.push(['llama', s]);
  const seen = new Set();
  for (const [arch, shape] of want) {
    const path = modelPath(arch, shape);
    if (seen.has(path)) continue;
    seen.add(path);
    const plan = planSyntheticModel({ arch, shape, quant: 'q4_0' });
    if (existsSync(path) && statSync(path).size === plan.bytes) {
      log(`synth ${arch} ${shape}: present (${(plan.bytes / 1e9).toFixed(2)} GB)`);
      continue;
    }
    let lastLog = 0;
    const r = await writeSyntheticModel({
      arch,
      shape,
      quant: 'q4_0',
      seed: 1,
      out: path,
      onProgress: (p) => {
        if (Date.now() - lastLog > 5000) {
          lastLog = Date.now();
          log(
            `synth ${arch} ${shape}: ${((100 * p.bytesWritten) / p.totalBytes).toFixed(0)}% of ${(p.totalBytes / 1e9).toFixed(2)} GB`,
          );
        }
      },
    });
    log(`synth ${arch} ${shape}: wrote ${(r.bytes / 1e9).toFixed(2)} GB in ${r.seconds.toFixed(1)} s`);
    notes.models[`${arch}-${shape}`] = { bytes: r.bytes, params: r.nParams, synth_seconds: r.seconds };
  }
}

async function solo() {
  const bw = bandwidthGbs(gpuNames());
  notes.bandwidth = bw ?? 'unknown: pass --bandwidth-gbs for a limit line';
  const models = [...opts.shapes.map((s) => ['llama', s]), ['moe', opts.moeShape]];
  for (const [arch, shape] of models) {
    const path = modelPath(arch, shape);
    const label = `${arch === 'moe' ? 'MoE ' : ''}${shape} q4_0`;
    if (!existsSync(path)) {
      skip(`solo ${label}`, `${path} missing: run --only synth first`);
      continue;
    }
    if (!within(shape === '27b' ? 90 : 45, `solo ${label}`)) continue;
    log(`solo ${label}: llama-bench -p 512 -n 128 -ngl ${opts.ngl} -r ${opts.reps}`);
    const anchor = llamaBench(
      ['-m', path, '-p', '512', '-n', '128', '-ngl', String(opts.ngl), '-fa', '1', '-r', String(opts.reps)],
      300_000,
    );
    log(`solo ${label}: engine`);
    const eng = await startEngine(servingArgs(path));
    try {
      const { decode, prefill } = await httpRates(eng.url);
      const limit = bw && {
        name: `memory bandwidth bound: ${bw.value} GB/s / ${(bytesPerToken(arch, shape) / 1e9).toFixed(2)} GB per token`,
        unit: 'tok/s',
        value: (bw.value * 1e9) / bytesPerToken(arch, shape),
      };
      add(
        makeFigure({
          name: `SOLO decode ${label}, engine HTTP stream`,
          unit: 'tok/s',
          samples: decode,
          anchor: { name: 'llama-bench tg128 (local, same pin)', unit: 'tok/s', samples: anchor.tg },
          ...(limit ? { limit } : {}),
        }),
      );
      add(
        makeFigure({
          name: `SOLO prefill ${label}, engine HTTP (512-token prompt, time to first token)`,
          unit: 'tok/s',
          samples: prefill,
          anchor: { name: 'llama-bench pp512 (local, same pin)', unit: 'tok/s', samples: anchor.pp },
        }),
      );
    } finally {
      await stopProcess(eng.child);
    }
  }
}

function localGpu() {
  try {
    const { out } = runTool('llama-bench', ['--list-devices'], 60_000);
    return out
      .split('\n')
      .map((l) => /^\s*([A-Za-z]+\d+):/.exec(l)?.[1])
      .find((d) => d && !d.startsWith('RPC'));
  } catch {
    return undefined;
  }
}

async function rpc() {
  const path = modelPath('llama', opts.rpcShape);
  const label = `${opts.rpcShape} q4_0`;
  if (!existsSync(path)) throw new Error(`${path} missing: run --only synth first`);
  const gpu = localGpu();
  notes.rpc = { model: label, local_device: gpu ?? null, client: 'llama-bench --rpc (stock, same pin)' };
  const servers = {};
  // Ours: a model-less engine whose merged port serves its device over ggml-RPC.
  const rpcPort = await freePort();
  const ours = await startEngine(['--rpc-port', String(rpcPort)], { state: 'empty', timeoutMs: 60_000 });
  servers.ours = { child: ours.child, endpoint: `127.0.0.1:${rpcPort}` };
  const stockPort = await freePort();
  const stock = startProcess(tool('ggml-rpc-server'), ['-H', '127.0.0.1', '-p', String(stockPort)]);
  await waitTcp(stockPort, stock, 60_000);
  servers.stock = { child: stock, endpoint: `127.0.0.1:${stockPort}` };
  const configs = [['all layers remote', ['-dev', 'RPC0']]];
  if (gpu) configs.push([`1/1 split ${gpu} + RPC0`, ['-dev', `${gpu}/RPC0`, '-ts', '1/1']]);
  else skip('rpc 1/1 split', 'no local GPU device for the other half');
  const base = [
    '-m',
    path,
    '-p',
    '512',
    '-n',
    '128',
    '-ngl',
    String(opts.ngl),
    '-fa',
    '1',
    '-r',
    String(opts.reps),
  ];
  for (const [what, extra] of configs) {
    if (!within(120, `rpc ${what}`)) continue;
    const res = {};
    for (const side of ['ours', 'stock']) {
      log(`rpc ${what}: llama-bench --rpc ${servers[side].endpoint} (${side})`);
      res[side] = llamaBench([...base, '--rpc', servers[side].endpoint, ...extra], 300_000);
    }
    const anchorName = (k) => `llama-bench --rpc ${k}, stock ggml-rpc-server (same pin)`;
    add(
      makeFigure({
        name: `ggml-RPC ${what} decode ${label}, hydra merged port`,
        unit: 'tok/s',
        samples: res.ours.tg,
        anchor: { name: anchorName('tg128'), unit: 'tok/s', samples: res.stock.tg },
      }),
    );
    add(
      makeFigure({
        name: `ggml-RPC ${what} prefill ${label}, hydra merged port`,
        unit: 'tok/s',
        samples: res.ours.pp,
        anchor: { name: anchorName('pp512'), unit: 'tok/s', samples: res.stock.pp },
      }),
    );
  }
  await stopProcess(ours.child);
  await stopProcess(stock);
}

/** GET /health's placement rows (where each layer runs), for the notes. */
async function placementOf(url) {
  const h = await (await fetch(`${url}/health`)).json();
  return h.placement ?? null;
}

/** Decode tok/s and prefill tok/s of `reps` streams through an engine's HTTP API (after a warm-up). */
async function httpRates(url) {
  await complete(url, promptOf(32, 999), 8); // warm-up, as llama-bench warms up
  const decode = [];
  const prefill = [];
  for (let r = 0; r < opts.reps; r++) {
    const d = await complete(url, promptOf(16, r), 128);
    decode.push(((d.completion - 1) * 1000) / d.decodeMs);
    const p = await complete(url, promptOf(512, 100 + r), 1);
    prefill.push((p.prompt * 1000) / p.ttftMs);
  }
  return { decode, prefill };
}

/**
 * COMBINE as a user runs it: a head engine with `--rpc peer` splits the model with a peer engine's
 * GPU (here both on the one GPU). Anchors from the same run: upstream llama-bench with --rpc to stock
 * ggml-rpc-server and the same device order and split; for MoE, llama-bench local decode (the
 * issue's 0.85x goal) and llama-bench with the experts on stock ggml-rpc-server (upstream's 0.75x).
 */
async function combine() {
  // HYDRA_BENCH_CPU=1: a smoke run of this part on a machine without a GPU (figures meaningless).
  const gpu = localGpu() ?? (process.env.HYDRA_BENCH_CPU === '1' ? 'CPU' : undefined);
  if (!gpu) throw new Error('no local GPU device for the head');
  // --peer-gpu N: one engine per GPU, as users run COMBINE. The head side (head engine, llama-bench)
  // sees GPU 0 only, the peer side (peer engine, stock ggml-rpc-server) GPU N only; each calls its
  // one GPU CUDA0. Without it both sides share the one GPU.
  const two = opts.peerGpu !== undefined;
  const headEnv = two ? { CUDA_VISIBLE_DEVICES: '0' } : {};
  const peerEnv = two ? { CUDA_VISIBLE_DEVICES: String(opts.peerGpu) } : {};
  const stockPort = await freePort();
  const stock = startProcess(
    tool('ggml-rpc-server'),
    ['-H', '127.0.0.1', '-p', String(stockPort), '-d', gpu],
    peerEnv,
  );
  await waitTcp(stockPort, stock, 60_000);
  const stockEp = `127.0.0.1:${stockPort}`;
  notes.combine = { local_device: gpu, peer_gpu: two ? opts.peerGpu : 'shared', placements: {} };
  const common = ['-p', '512', '-n', '128', '-ngl', String(opts.ngl), '-fa', '1', '-r', String(opts.reps)];
  try {
    for (const shape of opts.combineShapes) {
      const path = modelPath('llama', shape);
      const label = `${shape} q4_0`;
      if (!existsSync(path)) {
        skip(`combine ${label}`, `${path} missing: run --only synth first`);
        continue;
      }
      if (!within(shape === '27b' ? 150 : 90, `combine ${label}`)) continue;
      // The engine puts RPC devices first (upstream's default order), so the anchor does too.
      log(`combine ${label}: llama-bench --rpc ${stockEp} -dev RPC0/${gpu} -ts 1/1`);
      const split = gpu === 'CPU' ? [] : ['-dev', `RPC0/${gpu}`, '-ts', '1/1'];
      const anchor = llamaBench(['-m', path, ...common, '--rpc', stockEp, ...split], 300_000, headEnv);
      const solo = two ? llamaBench(['-m', path, ...common], 300_000, headEnv) : undefined;
      const peerRpc = await freePort();
      // The peer has the GGUF too (--rpc-weights): the head's load sends hashes, not weights.
      const peer = await startEngine(['--rpc-port', String(peerRpc), '--rpc-weights', path], {
        state: 'empty',
        timeoutMs: 60_000,
        env: peerEnv,
      });
      const head = await startEngine(
        [...servingArgs(path), '--rpc', `127.0.0.1:${peerRpc}`, ...(gpu === 'CPU' ? [] : ['-ts', '1/1'])],
        { env: headEnv },
      );
      try {
        notes.combine.placements[label] = await placementOf(head.url);
        const r = await httpRates(head.url);
        add(
          makeFigure({
            name: `COMBINE decode ${label}, head engine HTTP stream, 1/1 split with a peer engine`,
            unit: 'tok/s',
            samples: r.decode,
            anchor: {
              name: 'llama-bench tg128 --rpc stock ggml-rpc-server, same devices and split',
              unit: 'tok/s',
              samples: anchor.tg,
            },
          }),
        );
        add(
          makeFigure({
            name: `COMBINE prefill ${label}, head engine HTTP (512-token prompt), 1/1 split with a peer engine`,
            unit: 'tok/s',
            samples: r.prefill,
            anchor: {
              name: 'llama-bench pp512 --rpc stock ggml-rpc-server, same devices and split',
              unit: 'tok/s',
              samples: anchor.pp,
            },
          }),
        );
        if (solo) {
          const soloAnchor = { name: 'llama-bench tg128 local, one GPU', unit: 'tok/s', samples: solo.tg };
          add(
            makeFigure({
              name: `COMBINE decode ${label}, head engine HTTP, two GPUs, against SOLO on one GPU`,
              unit: 'tok/s',
              samples: r.decode,
              anchor: soloAnchor,
            }),
          );
          add(
            makeFigure({
              name: `upstream COMBINE decode ${label}, llama-bench --rpc, two GPUs, against SOLO on one GPU`,
              unit: 'tok/s',
              samples: anchor.tg,
              anchor: soloAnchor,
            }),
          );
        }
      } finally {
        await stopProcess(head.child);
        await stopProcess(peer.child);
      }
      save();
    }
    // MoE: the experts on the peer.
    const moe = modelPath('moe', opts.moeShape);
    const label = `MoE ${opts.moeShape} q4_0`;
    if (!existsSync(moe)) {
      skip(`combine ${label}`, `${moe} missing`);
      return;
    }
    if (!within(90, `combine ${label}`)) return;
    log(`combine ${label}: llama-bench local, and with the experts on stock ggml-rpc-server`);
    const local = llamaBench(['-m', moe, ...common], 300_000);
    const upstream = llamaBench(
      ['-m', moe, ...common, '--rpc', stockEp, '-ot', `ffn_.*_exps=RPC0[${stockEp}]`],
      300_000,
    );
    add(
      makeFigure({
        name: `upstream MoE experts on stock ggml-rpc-server decode, ${label} (llama-bench -ot ffn_.*_exps=RPC0)`,
        unit: 'tok/s',
        samples: upstream.tg,
        anchor: { name: 'llama-bench tg128 local', unit: 'tok/s', samples: local.tg },
      }),
    );
    const peerRpc = await freePort();
    const peer = await startEngine(['--rpc-port', String(peerRpc)], { state: 'empty', timeoutMs: 60_000 });
    const headRpc = await freePort();
    const head = await startEngine([
      ...servingArgs(moe),
      '--rpc',
      `127.0.0.1:${peerRpc}`,
      '--rpc-port',
      String(headRpc),
    ]);
    const hc = await HydraClient.connect({ port: headRpc, timeoutMs: 60_000 });
    try {
      notes.combine.placements[label] = await placementOf(head.url);
      await hc.call('SET_EXPERT_MODE', { mode: 'combined' });
      const combined = await httpRates(head.url);
      add(
        makeFigure({
          name: `COMBINE MoE decode, experts on the peer engine, ${label}, head engine HTTP stream`,
          unit: 'tok/s',
          samples: combined.decode,
          anchor: { name: 'llama-bench tg128 local (all on one GPU)', unit: 'tok/s', samples: local.tg },
          limit: { name: 'goal: 0.85x of local decode', unit: 'tok/s', value: 0.85 * median(local.tg) },
        }),
      );
      await hc.call('SET_EXPERT_MODE', { mode: 'solo' });
      const solo = await httpRates(head.url);
      add(
        makeFigure({
          name: `MoE decode after SET_EXPERT_MODE solo, ${label}, head engine HTTP stream`,
          unit: 'tok/s',
          samples: solo.decode,
          anchor: { name: 'llama-bench tg128 local (all on one GPU)', unit: 'tok/s', samples: local.tg },
        }),
      );
      // Flips during a stream: the stream must finish with every token; each flip's switch_ms kept.
      const flips = [];
      const streams = [];
      for (let r = 0; r < opts.reps; r++) {
        const done = complete(head.url, promptOf(16, 50 + r), 256);
        for (let i = 0; i < 6; i++) {
          await sleep(60);
          const t = performance.now();
          const res = await hc.call('SET_EXPERT_MODE', { mode: i % 2 ? 'solo' : 'combined' });
          flips.push({ rt: performance.now() - t, switchMs: res.switch_ms });
        }
        const c = await done;
        if (c.completion !== 256)
          throw new Error(`a stream with flips ended after ${c.completion} of 256 tokens`);
        streams.push(((c.completion - 1) * 1000) / c.decodeMs);
      }
      add(
        makeFigure({
          name: `SET_EXPERT_MODE flip during a stream, ${label}: round trip`,
          unit: 'ms',
          samples: flips.map((f) => f.rt),
          limit: { name: 'goal: under 100 ms', unit: 'ms', value: 100 },
        }),
      );
      add(
        makeFigure({
          name: `MoE decode of a stream with 6 expert-placement flips, ${label}, head engine HTTP`,
          unit: 'tok/s',
          samples: streams,
          anchor: { name: 'llama-bench tg128 local (all on one GPU)', unit: 'tok/s', samples: local.tg },
        }),
      );
    } finally {
      hc.close?.();
      await stopProcess(head.child);
      await stopProcess(peer.child);
    }
  } finally {
    await stopProcess(stock);
  }
}

function median(xs) {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)];
}

async function boot() {
  const reps = Math.max(5, opts.reps);
  const ours = [];
  const anchor = [];
  const bare =
    'require("node:http").createServer((q,s)=>{s.setHeader("content-type","application/json");s.end(JSON.stringify({state:"empty"}))}).listen(Number(process.argv[1]),"127.0.0.1")';
  for (let r = 0; r < reps; r++) {
    const eng = await startEngine([], { state: 'empty', timeoutMs: 60_000 });
    ours.push(eng.readyMs);
    await stopProcess(eng.child);
    const port = await freePort();
    const since = performance.now();
    const child = startProcess(process.execPath, ['-e', bare, String(port)]);
    anchor.push(await waitHttp(`http://127.0.0.1:${port}/health`, (s) => s === 200, since, child, 30_000));
    await stopProcess(child);
  }
  add(
    makeFigure({
      name: 'boot to ready, model-less engine (spawn to /health 200)',
      unit: 'ms',
      samples: ours,
      anchor: { name: 'bare node:http server, spawn to first 200', unit: 'ms', samples: anchor },
    }),
  );
}

/** Times `n` alternating calls; returns ms samples, or throws the first error. */
async function timeCalls(n, call) {
  const ms = [];
  for (let i = 0; i < n; i++) {
    const t = performance.now();
    await call(i);
    ms.push(performance.now() - t);
  }
  return ms;
}

async function control() {
  const rpcPort = await freePort();
  const eng = await startEngine(['--rpc-port', String(rpcPort)], { state: 'empty', timeoutMs: 60_000 });
  const client = await HydraClient.connect({ port: rpcPort, timeoutMs: 30_000 });
  try {
    const status = await timeCalls(300, () => client.status());
    const statusAnchor = { name: 'STATUS round trip, same connection', unit: 'ms', samples: status };
    try {
      const t1 = await timeCalls(300, (i) => client.configure({ sampling: { temp: i % 2 ? 0.5 : 0.6 } }));
      add(
        makeFigure({
          name: 'T1 CONFIGURE latency (sampling.temp)',
          unit: 'ms',
          samples: t1,
          anchor: statusAnchor,
        }),
      );
    } catch (err) {
      skip('T1 CONFIGURE latency', `${err.code ?? 'error'}: ${err.message}`);
    }
  } finally {
    client.close?.();
    await stopProcess(eng.child);
  }
  // SET_EXPERT_MODE: an MoE head with a peer engine to put experts on.
  const moe = modelPath('moe', opts.moeShape);
  if (!existsSync(moe)) {
    skip('SET_EXPERT_MODE latency', `${moe} missing`);
    return;
  }
  const peerPort = await freePort();
  const peer = await startEngine(['--rpc-port', String(peerPort)], { state: 'empty', timeoutMs: 60_000 });
  const headPort = await freePort();
  const head = await startEngine([
    '-m',
    moe,
    '-ngl',
    String(opts.ngl),
    '--rpc-port',
    String(headPort),
    '--rpc',
    `127.0.0.1:${peerPort}`,
    '-c',
    '4096',
    '-np',
    '1',
  ]);
  const hc = await HydraClient.connect({ port: headPort, timeoutMs: 60_000 });
  try {
    const status = await timeCalls(100, () => hc.status());
    const switchMs = [];
    const rt = await timeCalls(20, async (i) => {
      const r = await hc.call('SET_EXPERT_MODE', { mode: i % 2 ? 'solo' : 'combined' });
      if (typeof r.switch_ms === 'number') switchMs.push(r.switch_ms);
    });
    add(
      makeFigure({
        name: `SET_EXPERT_MODE round trip, MoE ${opts.moeShape}`,
        unit: 'ms',
        samples: rt,
        anchor: { name: 'STATUS round trip, same connection', unit: 'ms', samples: status },
      }),
    );
    if (switchMs.length)
      add(
        makeFigure({
          name: `SET_EXPERT_MODE switch_ms (engine-reported), MoE ${opts.moeShape}`,
          unit: 'ms',
          samples: switchMs,
          limit: { name: 'design target: well under 100 ms', unit: 'ms', value: 100 },
        }),
      );
  } catch (err) {
    skip('SET_EXPERT_MODE latency', `${err.code ?? 'error'}: ${err.message}`);
  } finally {
    hc.close?.();
    await stopProcess(head.child);
    await stopProcess(peer.child);
  }
}

async function profileSwitch() {
  const dense = modelPath('llama', opts.shapes[0] ?? '8b');
  const moe = modelPath('moe', opts.moeShape);
  for (const p of [dense, moe]) if (!existsSync(p)) throw new Error(`${p} missing: run --only synth first`);
  const rpcPort = await freePort();
  const eng = await startEngine([
    '-m',
    dense,
    '-ngl',
    String(opts.ngl),
    '--rpc-port',
    String(rpcPort),
    '-c',
    '4096',
    '-np',
    '1',
  ]);
  const client = await HydraClient.connect({ port: rpcPort, timeoutMs: 300_000 });
  try {
    const ms = [];
    for (const target of [moe, dense, moe, dense]) {
      const t = performance.now();
      await client.configure({ model: target });
      await waitHttp(`${eng.url}/health`, (s, b) => s === 200 && b.state === 'ready', t, eng.child, 300_000);
      await complete(eng.url, 'hello', 1);
      ms.push(performance.now() - t);
    }
    // Anchor: the same switch done by restarting (stop, spawn with the other model, first token).
    const restart = [];
    for (const target of [moe, dense]) {
      const t = performance.now();
      const e = await startEngine(['-m', target, '-ngl', String(opts.ngl), '-c', '4096', '-np', '1']);
      await complete(e.url, 'hello', 1);
      restart.push(performance.now() - t);
      await stopProcess(e.child);
    }
    add(
      makeFigure({
        name: 'profile switch DENSE <-> MoE via CONFIGURE model (to first token)',
        unit: 'ms',
        samples: ms,
        anchor: {
          name: 'engine restart with the other model (spawn to first token)',
          unit: 'ms',
          samples: restart,
        },
      }),
    );
  } catch (err) {
    skip('profile switch DENSE -> MoE -> DENSE', `${err.code ?? 'error'}: ${err.message}`);
  } finally {
    client.close?.();
    await stopProcess(eng.child);
  }
}

async function load() {
  const path = modelPath('llama', opts.loadShape);
  const label = `${opts.loadShape} q4_0`;
  if (!existsSync(path)) throw new Error(`${path} missing: run --only synth first`);
  const metric = async (url) => {
    const text = await (await fetch(`${url}/metrics`)).text();
    return Number(/^hydra_model_load_seconds\s+([0-9.eE+-]+)/m.exec(text)?.[1] ?? Number.NaN) * 1000;
  };
  const simple = () =>
    runTool('llama-simple', ['-m', path, '-n', '1', '-ngl', String(opts.ngl), 'hello'], 600_000).ms;
  for (const kind of ['warm', 'cold']) {
    const reps = kind === 'warm' ? Math.max(2, opts.reps - 1) : opts.coldReps;
    if (reps === 0) {
      skip(`${kind} load ${label}`, '--cold-reps 0');
      continue;
    }
    const est = kind === 'warm' ? 30 * reps : 200 * reps;
    if (!within(est, `${kind} load ${label}`)) continue;
    if (kind === 'warm') readFileThrough(path); // page the file in once
    const ours = [];
    const engineLoad = [];
    const anchor = [];
    let method;
    for (let r = 0; r < reps; r++) {
      if (kind === 'cold') method = dropCache(path);
      log(`${kind} load ${label}: engine (${r + 1}/${reps})`);
      const eng = await startEngine(['-m', path, '-ngl', String(opts.ngl), '-c', '4096', '-np', '1'], {
        timeoutMs: 580_000,
      });
      ours.push(eng.readyMs);
      const m = await metric(eng.url);
      if (Number.isFinite(m)) engineLoad.push(m);
      await stopProcess(eng.child);
      if (kind === 'cold') dropCache(path);
      log(`${kind} load ${label}: llama-simple -n 1 (${r + 1}/${reps})`);
      anchor.push(simple());
    }
    if (method) notes.cold_method = method;
    const anchorDef = {
      name: 'llama-simple -n 1 wall time (load + 1 token + exit), same cache state',
      unit: 'ms',
      samples: anchor,
    };
    add(
      makeFigure({
        name: `${kind} model load ${label}: engine spawn to ready`,
        unit: 'ms',
        samples: ours,
        anchor: anchorDef,
      }),
    );
    if (engineLoad.length)
      add(
        makeFigure({
          name: `${kind} model load ${label}: hydra_model_load_seconds`,
          unit: 'ms',
          samples: engineLoad,
          anchor: anchorDef,
        }),
      );
  }
}

function readFileThrough(path) {
  const fd = openSync(path, 'r');
  try {
    const buf = Buffer.allocUnsafe(16 << 20);
    while (readSync(fd, buf, 0, buf.length, null) > 0);
  } finally {
    closeSync(fd);
  }
}

// ---------------------------------------------------------------- main

async function main() {
  log(
    `gpu bench: parts ${opts.only.join(',')}; tools ${toolsDir ?? 'none'}; engine ${engineCli ?? 'none'}; models ${modelsDir}; budget ${opts.budgetS} s`,
  );
  if (opts.dryRun) {
    console.log(JSON.stringify({ opts, toolsDir, engineCli, addon, modelsDir, outDir }, null, 2));
    return;
  }
  // A watchdog: whatever happens, stop by the budget and keep what was measured.
  const watchdog = setTimeout(
    () => {
      skip('run', `stopped by the watchdog at --budget-s ${opts.budgetS}`);
      killAll();
      save();
      summary();
      process.exit(3);
    },
    opts.budgetS * 1000 + 20_000,
  );
  watchdog.unref();
  save();
  await part('synth', 150, synth);
  await part('solo', 60, solo);
  await part('rpc', 90, rpc);
  await part('combine', 120, combine);
  await part('boot', 15, boot);
  await part('control', 60, control);
  await part('switch', 90, profileSwitch);
  await part('load', 60, load);
  summary();
}

function summary() {
  console.log('\n== summary');
  for (const f of figures) {
    const a = f.anchor
      ? `  anchor ${f.anchor.median.toPrecision(4)} (${f.anchor.name})  ratio ${f.ratio?.toFixed(3)}`
      : '';
    const l = f.limit ? `  limit ${f.limit.value.toPrecision(4)} ${f.limit.unit}` : '';
    console.log(
      `${f.name}: ${f.median.toPrecision(4)} ${f.unit} (p99 ${f.p99.toPrecision(4)}, n=${f.samples})${a}${l}`,
    );
  }
  for (const s of skipped) console.log(`skipped ${s.name}: ${s.reason}`);
  console.log(`results: ${resultPath}`);
}

main().then(
  () => process.exit(0),
  (err) => {
    console.error(err);
    save();
    process.exit(1);
  },
);
