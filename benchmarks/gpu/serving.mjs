// The serving benchmarks of issue 19 (benchmarks/README.md, "Serving benchmark"): the engine driven
// over HTTP as a black box, against upstream llama-server and llama-batched-bench of the same pin in
// the same run. Plain Node ESM: `node benchmarks/gpu/serving.mjs` from a built checkout, or the bundle
// `benchmarks/dist/gpu/serving.cjs` that `node benchmarks/gpu/bundle.mjs` writes.
//   stall        S streams decoding, then a long prompt arrives: the running streams' inter-token
//                gaps while it is prefilled and its time to first token, per budget (n_batch)
//   concurrency  aggregate decode tok/s at 1..N concurrent non-streamed completions
// The results file (suite `serving`) is rewritten after every server run; a watchdog ends the run
// at --budget-s.
import { execFile, spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { basename, dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { freeLoopbackPort } from '../../apps/engine/dist/ports.js';
import { newResult, repoRoot, resultFileName, resultsDir, writeResult } from '../dist/results.js';
import { makeFigure } from '../dist/schema.js';

const PARTS = ['stall', 'concurrency'];
const SERVERS = ['engine', 'llama-server'];
const USAGE = `usage: node benchmarks/gpu/serving.mjs [--model models/bench/llama-8b-q4_0.gguf] [--only ${PARTS.join(',')}] [--servers ${SERVERS.join(',')}]
  [--ngl 99] [--fa on] [--threads N] [--np 32] [--reps 3] [--tools DIR] [--out DIR] [--budget-s 570]
  stall:       [--streams 8] [--stream-tokens 512] [--long-tokens 5000] [--arrive-after 32]
               [--budgets 64,128,256,512,1024,2048] [--ubatch N] [--stall-ctx N]
  concurrency: [--levels 1,4,16,32] [--conc-tokens 256] [--conc-prompt 32] [--conc-ctx N]`;

function fail(message) {
  console.error(`serving bench: ${message}\n${USAGE}`);
  process.exit(2);
}

function parseArgs(argv) {
  const o = {
    model: undefined,
    only: PARTS,
    servers: SERVERS,
    ngl: 99,
    fa: 'on',
    threads: undefined,
    np: 32,
    reps: 3,
    tools: undefined,
    out: undefined,
    budgetS: 570,
    streams: 8,
    streamTokens: 512,
    longTokens: 5000,
    arriveAfter: 32,
    budgets: [64, 128, 256, 512, 1024, 2048],
    ubatch: undefined,
    stallCtx: undefined,
    levels: [1, 4, 16, 32],
    concTokens: 256,
    concPrompt: 32,
    concCtx: undefined,
  };
  for (let i = 0; i < argv.length; i++) {
    const [flag, inline] = argv[i].split(/=(.*)/s, 2);
    if (flag === '--help' || flag === '-h') {
      console.log(USAGE);
      process.exit(0);
    }
    const value = () => {
      const v = inline ?? argv[++i];
      if (v === undefined) fail(`${flag} needs a value`);
      return v;
    };
    const int = () => {
      const n = Number(value());
      if (!Number.isInteger(n) || n < 1) fail(`${flag} must be a positive integer`);
      return n;
    };
    const ints = () =>
      value()
        .split(',')
        .map((s) => {
          const n = Number(s.trim());
          if (!Number.isInteger(n) || n < 1) fail(`${flag} must be a list of positive integers`);
          return n;
        });
    const names = (allowed) => () => {
      const list = value()
        .split(',')
        .map((s) => s.trim())
        .filter(Boolean);
      for (const n of list)
        if (!allowed.includes(n)) fail(`${flag}: unknown ${n} (one of ${allowed.join(',')})`);
      return list;
    };
    const readers = {
      '--model': ['model', () => resolve(value())],
      '--only': ['only', names(PARTS)],
      '--servers': ['servers', names(SERVERS)],
      '--ngl': ['ngl', () => Number(value())],
      '--fa': ['fa', names(['on', 'off', 'auto'])],
      '--threads': ['threads', int],
      '--np': ['np', int],
      '--reps': ['reps', int],
      '--tools': ['tools', () => resolve(value())],
      '--out': ['out', () => resolve(value())],
      '--budget-s': ['budgetS', int],
      '--streams': ['streams', int],
      '--stream-tokens': ['streamTokens', int],
      '--long-tokens': ['longTokens', int],
      '--arrive-after': ['arriveAfter', int],
      '--budgets': ['budgets', ints],
      '--ubatch': ['ubatch', int],
      '--stall-ctx': ['stallCtx', int],
      '--levels': ['levels', ints],
      '--conc-tokens': ['concTokens', int],
      '--conc-prompt': ['concPrompt', int],
      '--conc-ctx': ['concCtx', int],
    };
    const reader = Object.hasOwn(readers, flag) ? readers[flag] : undefined;
    if (!reader) fail(`unknown flag ${flag}`);
    o[reader[0]] = reader[1]();
  }
  if (Array.isArray(o.fa)) o.fa = o.fa[0];
  if (!Number.isInteger(o.ngl) || o.ngl < 0) fail('--ngl must be a non-negative integer');
  o.model ??= join(repoRoot(dirname(fileURLToPath(import.meta.url))), 'models/bench/llama-8b-q4_0.gguf');
  if (!existsSync(o.model)) fail(`--model ${o.model} does not exist`);
  if (o.only.includes('stall')) {
    if (o.streams + 1 > o.np)
      fail(`--np ${o.np} must exceed --streams ${o.streams} (the long prompt needs a slot)`);
    if (o.arriveAfter >= o.streamTokens) fail('--arrive-after must be below --stream-tokens');
  }
  if (o.only.includes('concurrency') && Math.max(...o.levels) > o.np)
    fail(`--levels must not exceed --np ${o.np}`);
  return o;
}

const here = dirname(fileURLToPath(import.meta.url));
const root = repoRoot(here);
const opts = parseArgs(process.argv.slice(2));
const t0 = Date.now();
const deadline = t0 + opts.budgetS * 1000;
const log = (msg) => console.error(`[${((Date.now() - t0) / 1000).toFixed(0).padStart(4)}s] ${msg}`);
const remainingS = () => (deadline - Date.now()) / 1000;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

const nativeDir = join(root, 'packages/native-ggml');
const toolsDir =
  opts.tools ??
  [join(nativeDir, 'build-cuda/bin'), join(nativeDir, 'build/bin')].find((d) =>
    existsSync(join(d, 'llama-server')),
  );
const toolPath = (name) => (toolsDir && existsSync(join(toolsDir, name)) ? join(toolsDir, name) : undefined);
// The bundled engine cannot find the addon from benchmarks/dist/gpu/ by itself.
const addon =
  process.env.HYDRA_NATIVE_ADDON ??
  toolPath('hydra_ggml.node') ??
  [join(nativeDir, 'build-cuda/bin/hydra_ggml.node'), join(nativeDir, 'build/bin/hydra_ggml.node')].find(
    (p) => existsSync(p),
  );
const engineCli = [
  join(here, 'cli.cjs'),
  join(root, 'benchmarks/dist/gpu/cli.cjs'),
  join(root, 'apps/engine/dist/cli.js'),
].find((p) => existsSync(p));
const modelLabel = basename(opts.model).replace(/\.gguf$/, '');
// Each slot must hold the long prompt and a few generated tokens (slots get n_ctx / n_parallel).
const stallCtx = opts.stallCtx ?? opts.np * (Math.ceil((opts.longTokens + 64) / 256) * 256);
const concCtx = opts.concCtx ?? opts.np * (Math.ceil((opts.concPrompt + opts.concTokens + 16) / 256) * 256);

const figures = [];
const skipped = [];
const notes = {
  model: opts.model,
  engine: engineCli,
  tools: toolsDir,
  flags: { ngl: opts.ngl, fa: opts.fa, threads: opts.threads ?? 'default', np: opts.np },
  llama_server_flags: '--no-webui --cache-ram 0 (no host-RAM prompt cache: the engine has none)',
  llama_server_requests:
    'logit_bias bans ids 131-258 (byte tokens 0x80-0xFF of the synthetic vocabularies): its output parser fails on invalid UTF-8',
  stall: {
    streams: opts.streams,
    stream_tokens: opts.streamTokens,
    long_tokens: opts.longTokens,
    arrive_after: opts.arriveAfter,
    ctx: stallCtx,
    ubatch: opts.ubatch ?? 'same as the budget',
    method:
      'a gap is the time between two streamed tokens of one running stream whose interval overlaps [long prompt sent, its first token]; the streams are cancelled once each has 3 tokens after that first token',
    runs: {},
  },
  concurrency: {
    levels: opts.levels,
    tokens: opts.concTokens,
    prompt: opts.concPrompt,
    ctx: concCtx,
    method:
      'aggregate = sum of usage.completion_tokens / wall time of the level, prefill included; decode_only = (tokens - one per request) / (wall - wall of the same requests with max_tokens 1), what batched-bench S_TG counts',
    runs: {},
  },
};
const started = new Date();
let resultPath;

function save() {
  const r = newResult('serving', figures, skipped, notes, started);
  resultPath = join(opts.out ?? resultsDir(root), resultFileName(r));
  writeResult(r, opts.out ?? resultsDir(root));
}

function add(figure) {
  figures.push(figure);
  const a = figure.anchor
    ? ` | ${figure.anchor.name} ${figure.anchor.median.toPrecision(4)} (x${figure.ratio?.toFixed(3)})`
    : '';
  log(`${figure.name}: ${figure.median.toPrecision(4)} ${figure.unit}${a}`);
}

function skip(name, reason) {
  log(`skip ${name}: ${reason}`);
  skipped.push({ name, reason });
}

// ---------------------------------------------------------------- processes

const children = new Set();
function killAll() {
  for (const c of children) c.kill('SIGKILL');
}
process.on('exit', killAll);
for (const sig of ['SIGINT', 'SIGTERM'])
  process.on(sig, () => {
    killAll();
    process.exit(130);
  });
const watchdog = setTimeout(() => {
  skip('run', `watchdog: --budget-s ${opts.budgetS} reached`);
  save();
  process.exit(3);
}, opts.budgetS * 1000);
watchdog.unref();

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
  if (child.exitCode !== null || child.signalCode !== null) return;
  child.kill('SIGTERM');
  const done = await Promise.race([child.exited.then(() => true), sleep(15_000).then(() => false)]);
  if (!done) {
    child.kill('SIGKILL');
    await child.exited;
  }
}

async function getJson(url, timeoutMs = 2000) {
  const res = await fetch(url, { signal: AbortSignal.timeout(timeoutMs) });
  return { status: res.status, body: await res.json().catch(() => ({})) };
}

/** The llama.cpp flags both servers get; -b/-ub only where a budget is set. */
function llamaFlags(ctx, budget) {
  const f = [
    '-m',
    opts.model,
    '-ngl',
    String(opts.ngl),
    '-fa',
    opts.fa,
    '-c',
    String(ctx),
    '-np',
    String(opts.np),
  ];
  if (budget !== undefined)
    f.push('-b', String(budget), '-ub', String(Math.min(opts.ubatch ?? budget, budget)));
  if (opts.threads) f.push('-t', String(opts.threads), '-tb', String(opts.threads));
  return f;
}

/** Starts the engine or llama-server with the same llama.cpp flags; resolves once it serves. */
async function startServer(kind, ctx, budget) {
  const port = await freeLoopbackPort();
  const flags = llamaFlags(ctx, budget);
  let child;
  if (kind === 'engine') {
    if (!engineCli) throw new Error('no engine: build apps/engine or run benchmarks/gpu/bundle.mjs');
    child = startProcess(
      process.execPath,
      [
        engineCli,
        '--host',
        '127.0.0.1',
        '--port',
        String(port),
        '--progress',
        'off',
        '--max-queue',
        '256',
        ...flags,
      ],
      addon ? { HYDRA_NATIVE_ADDON: addon } : {},
    );
  } else {
    const bin = toolPath('llama-server');
    if (!bin)
      throw new Error(`llama-server not found in ${toolsDir ?? 'packages/native-ggml/build{-cuda,}/bin'}`);
    // --cache-ram 0: the engine keeps no host-RAM prompt cache; llama-server's (8 GiB by default)
    // would copy a reused slot's KV to host memory inside the measured window.
    child = startProcess(bin, [
      '--host',
      '127.0.0.1',
      '--port',
      String(port),
      '--no-webui',
      '--cache-ram',
      '0',
      ...flags,
    ]);
  }
  const url = `http://127.0.0.1:${port}`;
  const end = Date.now() + 300_000;
  for (;;) {
    if (child.exitCode !== null || child.signalCode !== null)
      throw new Error(`${kind} exited before ready:\n${child.tail()}`);
    try {
      const { status, body } = await getJson(`${url}/health`);
      // llama-server: 200 once loaded; the engine: 200 with state ready.
      if (status === 200 && (kind !== 'engine' || body.state === 'ready')) break;
      if (body.state === 'error') throw new Error(`engine state error:\n${child.tail()}`);
    } catch (err) {
      if (/state error/.test(err.message)) throw err;
    }
    if (Date.now() > end) throw new Error(`${kind} not ready after 300 s:\n${child.tail()}`);
    await sleep(50);
  }
  // At this pin llama-server runs its chat output parser on /v1/completions too, and answers 500
  // ("does not match the expected Content-only format") once random output holds invalid UTF-8:
  // its requests ban the byte tokens 0x80-0xFF (ids 131-258 of the synthetic vocabularies).
  const extra = kind === 'engine' ? {} : { logit_bias: BYTE_BAN };
  return { kind, url, child, budget, extra };
}

const BYTE_BAN = Array.from({ length: 128 }, (_, i) => [131 + i, false]);

/** Waits until no slot is busy (engine: /health slots.busy; llama-server: /slots), at most 30 s. */
async function waitIdle(server) {
  const end = Date.now() + 30_000;
  while (Date.now() < end) {
    try {
      if (server.kind === 'engine') {
        const { body } = await getJson(`${server.url}/health`);
        if (!body.slots || body.slots.busy === 0) return;
      } else {
        const { status, body } = await getJson(`${server.url}/slots`);
        if (status !== 200 || !Array.isArray(body)) {
          await sleep(500);
          return;
        }
        if (!body.some((s) => s.is_processing)) return;
      }
    } catch {
      // a busy server may miss the 2 s poll timeout: poll again
    }
    await sleep(20);
  }
  throw new Error(`${server.kind}: slots still busy 30 s after the requests ended`);
}

// ---------------------------------------------------------------- requests

/** `n` token ids of a prompt, distinct per salt; ids 300..999 exist in every synthetic vocabulary. */
function promptTokens(n, salt) {
  let x = (salt * 2654435761 + 12345) >>> 0 || 1;
  const out = new Array(n);
  for (let i = 0; i < n; i++) {
    x ^= x << 13;
    x >>>= 0;
    x ^= x >>> 17;
    x ^= x << 5;
    x >>>= 0;
    out[i] = 300 + (x % 700);
  }
  return out;
}

let saltCounter = 1;
const nextSalt = () => saltCounter++ * 7919 + (Date.now() % 1000);

/**
 * One streamed /v1/completions request. `times` gets the arrival time (performance.now()) of every
 * chunk that carries a token; `abort()` ends it early (the server cancels the request).
 */
function streamCompletion(server, prompt, maxTokens) {
  const ctl = new AbortController();
  const rec = { times: [], usage: undefined, done: false, error: undefined, aborted: false };
  rec.abort = () => {
    rec.aborted = true;
    ctl.abort();
  };
  rec.sentAt = performance.now();
  rec.finished = (async () => {
    try {
      const res = await fetch(`${server.url}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({
          ...server.extra,
          prompt,
          max_tokens: maxTokens,
          temperature: 0,
          ignore_eos: true,
          stream: true,
          stream_options: { include_usage: true },
        }),
        signal: ctl.signal,
      });
      if (!res.ok) throw new Error(`HTTP ${res.status}: ${await res.text()}`);
      const decoder = new TextDecoder();
      let buf = '';
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
          if (msg.usage) rec.usage = msg.usage;
          const c = msg.choices?.[0];
          // A finish chunk with empty text carries no token.
          if (c && ((c.text ?? '') !== '' || c.finish_reason == null)) rec.times.push(now);
        }
      }
    } catch (err) {
      if (!rec.aborted) rec.error = err;
    } finally {
      rec.done = true;
    }
  })();
  return rec;
}

/** One non-streamed /v1/completions request; resolves to usage.completion_tokens. */
async function completion(server, prompt, maxTokens) {
  const res = await fetch(`${server.url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({
      ...server.extra,
      prompt,
      max_tokens: maxTokens,
      temperature: 0,
      ignore_eos: true,
    }),
    signal: AbortSignal.timeout(300_000),
  });
  const body = await res.json().catch(() => ({}));
  if (!res.ok) throw new Error(`HTTP ${res.status}: ${JSON.stringify(body).slice(0, 300)}`);
  const n = body.usage?.completion_tokens;
  if (!Number.isInteger(n))
    throw new Error(`no usage.completion_tokens in ${JSON.stringify(body).slice(0, 300)}`);
  return n;
}

async function until(cond, timeoutMs, what) {
  const end = Date.now() + timeoutMs;
  while (!cond()) {
    if (Date.now() > end) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await sleep(2);
  }
}

// ---------------------------------------------------------------- stall

/**
 * One repetition: S streams decode, the long prompt arrives once each has `arriveAfter` tokens.
 * Returns the gaps (ms) of the running streams that overlap the long prompt's prefill, the long
 * prompt's TTFT, and the running streams' gaps before it arrived (the plain step time).
 */
async function stallRep(server) {
  const streams = [];
  for (let i = 0; i < opts.streams; i++)
    streams.push(streamCompletion(server, promptTokens(32, nextSalt()), opts.streamTokens));
  const failed = () => streams.find((s) => s.error);
  await until(
    () => failed() || streams.every((s) => s.times.length >= opts.arriveAfter || s.done),
    120_000,
    `${opts.streams} streams to reach ${opts.arriveAfter} tokens`,
  );
  if (failed()) throw failed().error;
  if (streams.some((s) => s.done)) throw new Error('a stream ended before the long prompt arrived');
  const long = streamCompletion(server, promptTokens(opts.longTokens, nextSalt()), 4);
  const sent = long.sentAt;
  await until(() => long.times.length > 0 || long.done, 300_000, 'the long prompt to start generating');
  if (long.error) throw long.error;
  if (long.times.length === 0) throw new Error('the long prompt produced no token');
  const first = long.times[0];
  // Every running stream must show a token after the prefill, so the gap spanning it is closed.
  await until(
    () => failed() || streams.every((s) => s.done || s.times.filter((t) => t > first).length >= 3),
    120_000,
    'the running streams to resume after the prefill',
  );
  for (const s of streams) s.abort();
  await Promise.all([...streams.map((s) => s.finished), long.finished]);
  if (failed()) throw failed().error;
  const gaps = [];
  const before = [];
  let endedEarly = 0;
  for (const s of streams) {
    if (!s.times.some((t) => t > first)) endedEarly++;
    for (let i = 1; i < s.times.length; i++) {
      const g = s.times[i] - s.times[i - 1];
      if (s.times[i] > sent && s.times[i - 1] < first) gaps.push(g);
      else if (s.times[i] <= sent && i >= 2) before.push(g);
    }
  }
  if (endedEarly > 0)
    throw new Error(`${endedEarly} stream(s) ended during the prefill: raise --stream-tokens`);
  await waitIdle(server);
  return { gaps, ttftMs: first - sent, before };
}

const pct = (xs, q) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length ? s[Math.min(s.length - 1, Math.max(0, Math.ceil(q * s.length) - 1))] : null;
};
const round = (x) => (x == null ? null : Math.round(x * 100) / 100);

async function stallRun(kind, budget) {
  const server = await startServer(kind, stallCtx, budget);
  try {
    // Warm-up: the long prompt alone (also the TTFT without running streams), then one short stream.
    const alone = [];
    for (let i = 0; i < 2; i++) {
      const r = streamCompletion(server, promptTokens(opts.longTokens, nextSalt()), 1);
      await r.finished;
      if (r.error) throw r.error;
      alone.push(r.times[0] - r.sentAt);
    }
    const warm = streamCompletion(server, promptTokens(32, nextSalt()), 16);
    await warm.finished;
    if (warm.error) throw warm.error;
    await waitIdle(server);
    const reps = [];
    for (let r = 0; r < opts.reps; r++) reps.push(await stallRep(server));
    const gaps = reps.flatMap((r) => r.gaps);
    const before = reps.flatMap((r) => r.before);
    const run = {
      budget,
      max_gap_ms: reps.map((r) => round(Math.max(...r.gaps))),
      gap_p50_ms: round(pct(gaps, 0.5)),
      gap_p99_ms: round(pct(gaps, 0.99)),
      gaps_in_window: gaps.length,
      ttft_ms: reps.map((r) => round(r.ttftMs)),
      ttft_alone_ms: alone.map(round),
      step_before_p50_ms: round(pct(before, 0.5)),
    };
    log(
      `stall ${kind} budget ${budget}: max gap ${run.max_gap_ms.join('/')} ms, p50 ${run.gap_p50_ms} p99 ${run.gap_p99_ms} ms (${gaps.length} gaps), TTFT ${run.ttft_ms.join('/')} ms (alone ${run.ttft_alone_ms.join('/')}), step before ${run.step_before_p50_ms} ms`,
    );
    return { ...run, raw: reps };
  } finally {
    await stopProcess(server.child);
  }
}

async function stall() {
  const what = `${opts.streams} streams + ${opts.longTokens}-token prompt, ${modelLabel}, -np ${opts.np}`;
  for (const budget of opts.budgets) {
    const runs = {};
    for (const kind of opts.servers) {
      if (remainingS() < 30) {
        skip(
          `stall ${kind} budget ${budget}`,
          `time budget: ${remainingS().toFixed(0)} s left; run fewer --budgets per call`,
        );
        continue;
      }
      try {
        runs[kind] = await stallRun(kind, budget);
      } catch (err) {
        skip(`stall ${kind} budget ${budget}`, `failed: ${err.message.split('\n').slice(0, 6).join(' | ')}`);
      }
    }
    const { raw: engRaw, ...eng } = runs.engine ?? {};
    const { raw: srvRaw, ...srv } = runs['llama-server'] ?? {};
    notes.stall.runs[budget] = {
      engine: runs.engine ? eng : null,
      'llama-server': runs['llama-server'] ? srv : null,
    };
    // The engine's figure anchored on llama-server; llama-server alone when the engine did not run.
    const main = engRaw
      ? { who: 'engine', raw: engRaw }
      : srvRaw
        ? { who: 'llama-server', raw: srvRaw }
        : null;
    if (!main) continue;
    const anchorRaw = main.who === 'engine' ? srvRaw : undefined;
    const anchor = (name, samples) =>
      anchorRaw ? { name: `llama-server, same flags (${name})`, unit: 'ms', samples } : null;
    const sweep = (family) => ({ family: `${family}, ${what}`, key: 'budget (n_batch)', value: budget });
    const suffix = main.who === 'engine' ? '' : ' (llama-server)';
    add(
      makeFigure({
        name: `stall: max inter-token gap of running streams during the prefill, ${what}, budget ${budget}${suffix}`,
        unit: 'ms',
        samples: main.raw.map((r) => Math.max(...r.gaps)),
        anchor: anchor(
          'max gap',
          (anchorRaw ?? []).map((r) => Math.max(...r.gaps)),
        ),
        sweep: sweep('stall: max gap'),
      }),
    );
    add(
      makeFigure({
        name: `stall: inter-token gaps of running streams during the prefill (median, p99), ${what}, budget ${budget}${suffix}`,
        unit: 'ms',
        samples: main.raw.flatMap((r) => r.gaps),
        anchor: anchor(
          'gaps',
          (anchorRaw ?? []).flatMap((r) => r.gaps),
        ),
        sweep: sweep('stall: median gap'),
      }),
    );
    add(
      makeFigure({
        name: `stall: long prompt time to first token, ${what}, budget ${budget}${suffix}`,
        unit: 'ms',
        samples: main.raw.map((r) => r.ttftMs),
        anchor: anchor(
          'TTFT',
          (anchorRaw ?? []).map((r) => r.ttftMs),
        ),
        sweep: sweep('stall: long-prompt TTFT'),
      }),
    );
    save();
  }
  // The trade-off table the default is picked from: budget -> max gap, TTFT.
  notes.stall.tradeoff = Object.entries(notes.stall.runs).map(([b, r]) => ({
    budget: Number(b),
    engine_max_gap_ms: r.engine ? Math.max(...r.engine.max_gap_ms) : null,
    engine_ttft_ms: r.engine ? pct(r.engine.ttft_ms, 0.5) : null,
    server_max_gap_ms: r['llama-server'] ? Math.max(...r['llama-server'].max_gap_ms) : null,
    server_ttft_ms: r['llama-server'] ? pct(r['llama-server'].ttft_ms, 0.5) : null,
  }));
  console.error(`budget  engine max gap / TTFT   llama-server max gap / TTFT (ms)`);
  for (const t of notes.stall.tradeoff)
    console.error(
      `${String(t.budget).padStart(6)}  ${String(t.engine_max_gap_ms).padStart(8)} / ${String(t.engine_ttft_ms).padEnd(10)} ${String(t.server_max_gap_ms).padStart(8)} / ${t.server_ttft_ms}`,
    );
}

// ---------------------------------------------------------------- concurrency

/**
 * llama-batched-bench's S_TG per parallel level, one array of samples per level. Its rows go through
 * llama.cpp's asynchronous logger, which the process may leave unflushed at exit (seen on the CPU in
 * about 2 runs of 5): levels whose row is missing are run again, at most 3 times per repetition.
 */
async function batchedBench() {
  const bin = toolPath('llama-batched-bench');
  if (!bin) throw new Error(`llama-batched-bench not found in ${toolsDir}`);
  const base = [
    '-m',
    opts.model,
    '-ngl',
    String(opts.ngl),
    '-fa',
    opts.fa,
    '-c',
    String(concCtx),
    '-npp',
    String(opts.concPrompt),
    '-ntg',
    String(opts.concTokens),
    '--output-format',
    'jsonl',
  ];
  if (opts.threads) base.push('-t', String(opts.threads), '-tb', String(opts.threads));
  const byLevel = new Map(opts.levels.map((l) => [l, []]));
  let runs = 0;
  for (let r = 0; r < opts.reps; r++) {
    let missing = [...opts.levels];
    for (let attempt = 0; attempt < 3 && missing.length > 0; attempt++) {
      runs++;
      const { stdout, stderr } = await new Promise((ok, ko) =>
        execFile(
          bin,
          [...base, '-npl', missing.join(',')],
          { timeout: 300_000, maxBuffer: 64 << 20 },
          (err, stdout, stderr) =>
            err
              ? ko(new Error(`llama-batched-bench: ${err.message}\n${stderr.slice(-2000)}`))
              : ok({ stdout, stderr }),
        ),
      );
      for (const line of `${stdout}\n${stderr}`.split('\n')) {
        const m = line.indexOf('{"n_kv_max"');
        if (m < 0) continue;
        const row = JSON.parse(line.slice(m));
        if (!missing.includes(row.pl)) continue;
        byLevel.get(row.pl).push(row.speed_tg);
        missing = missing.filter((l) => l !== row.pl);
      }
    }
    if (missing.length > 0)
      throw new Error(`llama-batched-bench printed no row for -npl ${missing.join(',')} in 3 runs`);
  }
  notes.concurrency.batched_bench = {
    args: `${base.join(' ')} -npl ${opts.levels.join(',')}`,
    runs,
    s_tg: Object.fromEntries(byLevel),
  };
  return byLevel;
}

async function concurrencyRun(kind) {
  const server = await startServer(kind, concCtx, undefined);
  try {
    const levels = new Map();
    const max = Math.max(...opts.levels);
    await Promise.all(
      Array.from({ length: max }, () => completion(server, promptTokens(opts.concPrompt, nextSalt()), 8)),
    );
    await waitIdle(server);
    for (const level of opts.levels) {
      const agg = [];
      const decodeOnly = [];
      for (let r = 0; r < opts.reps; r++) {
        const batch = (n) =>
          Array.from({ length: level }, () =>
            completion(server, promptTokens(opts.concPrompt, nextSalt()), n),
          );
        let t = performance.now();
        await Promise.all(batch(1));
        const wall1 = performance.now() - t;
        await waitIdle(server);
        t = performance.now();
        const counts = await Promise.all(batch(opts.concTokens));
        const wall = performance.now() - t;
        await waitIdle(server);
        const tokens = counts.reduce((a, b) => a + b, 0);
        agg.push(tokens / (wall / 1000));
        // Noise can make the short run the longer one at a few tokens on a loaded CPU: no figure then.
        decodeOnly.push(wall > wall1 ? (tokens - level) / ((wall - wall1) / 1000) : null);
      }
      levels.set(level, { agg, decodeOnly });
      log(
        `concurrency ${kind} x${level}: ${agg.map((v) => v.toFixed(0)).join('/')} tok/s (decode only ${decodeOnly.map((v) => v?.toFixed(0) ?? '-').join('/')})`,
      );
    }
    notes.concurrency.runs[kind] = Object.fromEntries(
      [...levels].map(([l, v]) => [l, { aggregate: v.agg.map(round), decode_only: v.decodeOnly.map(round) }]),
    );
    return levels;
  } finally {
    await stopProcess(server.child);
  }
}

async function concurrency() {
  let bb;
  try {
    bb = await batchedBench();
    log(
      `llama-batched-bench S_TG: ${[...bb].map(([l, v]) => `x${l} ${v.map((x) => x.toFixed(0)).join('/')}`).join(', ')}`,
    );
  } catch (err) {
    skip(
      'concurrency: llama-batched-bench anchor',
      `failed: ${err.message.split('\n').slice(0, 6).join(' | ')}`,
    );
  }
  const runs = {};
  for (const kind of opts.servers) {
    if (remainingS() < 30) {
      skip(
        `concurrency ${kind}`,
        `time budget: ${remainingS().toFixed(0)} s left; run --only concurrency alone`,
      );
      continue;
    }
    try {
      runs[kind] = await concurrencyRun(kind);
    } catch (err) {
      skip(`concurrency ${kind}`, `failed: ${err.message.split('\n').slice(0, 6).join(' | ')}`);
    }
    save();
  }
  const bbAnchor = (l) =>
    bb
      ? {
          name: `llama-batched-bench S_TG (-npp ${opts.concPrompt} -ntg ${opts.concTokens} -npl ${l})`,
          unit: 'tok/s',
          samples: bb.get(l),
        }
      : null;
  const what = (l) => `${l} concurrent x ${opts.concTokens} tokens, ${modelLabel}, -np ${opts.np}`;
  for (const level of opts.levels) {
    const sweep = (family) => ({
      family: `${family}, ${modelLabel}`,
      key: 'concurrent streams',
      value: level,
    });
    const eng = runs.engine?.get(level);
    const srv = runs['llama-server']?.get(level);
    const srvAnchor = srv
      ? { name: `llama-server -np ${opts.np}, same requests`, unit: 'tok/s', samples: srv.agg }
      : null;
    // One figure per anchor present; a single unanchored one when neither ran (see skipped).
    const engineFigures = [
      ['batched-bench', bbAnchor(level)],
      ['llama-server', srvAnchor],
    ].filter(([, anchor]) => anchor);
    if (eng && engineFigures.length === 0) engineFigures.push(['no anchor', null]);
    for (const [vs, anchor] of eng ? engineFigures : [])
      add(
        makeFigure({
          name: `concurrency: engine aggregate decode, ${what(level)} (vs ${vs})`,
          unit: 'tok/s',
          samples: eng.agg,
          anchor,
          sweep: sweep(`concurrency: engine vs ${vs}`),
        }),
      );
    if (srv && bb)
      add(
        makeFigure({
          name: `concurrency: llama-server aggregate decode, ${what(level)} (vs batched-bench)`,
          unit: 'tok/s',
          samples: srv.agg,
          anchor: bbAnchor(level),
          sweep: sweep('concurrency: llama-server vs batched-bench'),
        }),
      );
  }
}

// ---------------------------------------------------------------- main

async function main() {
  log(
    `serving bench: ${modelLabel}, parts ${opts.only.join(',')}, servers ${opts.servers.join(',')}, tools ${toolsDir ?? 'none'}, engine ${engineCli ?? 'none'}`,
  );
  save();
  for (const [name, fn] of [
    ['stall', stall],
    ['concurrency', concurrency],
  ]) {
    if (!opts.only.includes(name)) continue;
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
  console.log(
    JSON.stringify(
      { results: resultPath, figures: figures.length, skipped: skipped.map((s) => s.name) },
      null,
      2,
    ),
  );
}

main().then(
  () => process.exit(0),
  (err) => {
    console.error(err);
    save();
    process.exit(1);
  },
);
