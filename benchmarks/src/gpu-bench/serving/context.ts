import { existsSync } from 'node:fs';
import { basename, join, resolve } from 'node:path';
import type { Figure } from '../../schema.js';
import {
  badFlag,
  type Child,
  choiceOf,
  type FlagTable,
  freeLoopbackPort,
  getJson,
  type Harness,
  type Locations,
  llamaServerBusy,
  llamaServerListening,
  postJson,
  read,
  sleep,
  sseEvents,
  usageOf,
  waitHttp,
} from '../harness/index.js';

export const PARTS = ['stall', 'concurrency'] as const;
export const SERVERS = ['engine', 'llama-server'] as const;
export type ServerKind = (typeof SERVERS)[number];

export const USAGE = `usage: node benchmarks/gpu/serving.mjs [--model models/bench/llama-8b-q4_0.gguf] [--only ${PARTS.join(',')}] [--servers ${SERVERS.join(',')}]
  [--ngl 99] [--fa on] [--threads N] [--np 32] [--kv-unified] [--reps 3] [--tools DIR] [--out DIR] [--budget-s 570]
  stall:       [--streams 8] [--stream-tokens 512] [--long-tokens 5000] [--arrive-after 32]
               [--budgets 64,128,256,512,1024,2048] [--ubatch N] [--stall-ctx N]
  concurrency: [--levels 1,4,16,32] [--conc-tokens 256] [--conc-prompt 32] [--conc-ctx N]`;

export interface ServingOptions {
  model: string | undefined;
  only: (typeof PARTS)[number][];
  servers: ServerKind[];
  ngl: number;
  fa: 'on' | 'off' | 'auto';
  threads: number | undefined;
  np: number;
  /** -kvu for llama-server, the engine and llama-batched-bench: one KV buffer shared by all slots. */
  kvUnified: boolean;
  reps: number;
  tools: string | undefined;
  out: string | undefined;
  budgetS: number;
  streams: number;
  streamTokens: number;
  longTokens: number;
  arriveAfter: number;
  budgets: number[];
  ubatch: number | undefined;
  stallCtx: number | undefined;
  levels: number[];
  concTokens: number;
  concPrompt: number;
  concCtx: number | undefined;
}

export const DEFAULTS: ServingOptions = {
  model: undefined,
  only: [...PARTS],
  servers: [...SERVERS],
  ngl: 99,
  fa: 'on',
  threads: undefined,
  np: 32,
  kvUnified: false,
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

const pos = read.int(1);
const path = (v: Parameters<typeof read.string>[0]) => resolve(v.value());

export const FLAGS: FlagTable<ServingOptions> = {
  '--model': ['model', path],
  '--only': ['only', read.oneOf(PARTS)],
  '--servers': ['servers', read.oneOf(SERVERS)],
  '--ngl': ['ngl', read.int(0)],
  '--fa': ['fa', (v) => read.oneOf(['on', 'off', 'auto'] as const)(v)[0] ?? 'on'],
  '--threads': ['threads', pos],
  '--np': ['np', pos],
  '--reps': ['reps', pos],
  '--tools': ['tools', path],
  '--out': ['out', path],
  '--budget-s': ['budgetS', pos],
  '--streams': ['streams', pos],
  '--stream-tokens': ['streamTokens', pos],
  '--long-tokens': ['longTokens', pos],
  '--arrive-after': ['arriveAfter', pos],
  '--budgets': ['budgets', read.ints(1)],
  '--ubatch': ['ubatch', pos],
  '--stall-ctx': ['stallCtx', pos],
  '--levels': ['levels', read.ints(1)],
  '--conc-tokens': ['concTokens', pos],
  '--conc-prompt': ['concPrompt', pos],
  '--conc-ctx': ['concCtx', pos],
};

/** Flags without a value. */
export const SWITCHES = { '--kv-unified': 'kvUnified' } as const;

/** Checks the flags against each other; `defaultModel` when --model is absent. */
export function checkOptions(o: ServingOptions, defaultModel: string): ServingOptions & { model: string } {
  const model = o.model ?? defaultModel;
  if (!existsSync(model)) throw badFlag('--model', `${model} does not exist`);
  if (o.only.includes('stall')) {
    if (o.streams + 1 > o.np)
      throw badFlag('--np', `--np ${o.np} must exceed --streams ${o.streams} (the long prompt needs a slot)`);
    if (o.arriveAfter >= o.streamTokens) throw badFlag('--arrive-after', 'must be below --stream-tokens');
  }
  if (o.only.includes('concurrency') && Math.max(...o.levels) > o.np)
    throw badFlag('--levels', `must not exceed --np ${o.np}`);
  return { ...o, model };
}

// At this pin llama-server runs its chat output parser on /v1/completions too, and answers 500
// ("does not match the expected Content-only format") once random output holds invalid UTF-8:
// its requests ban the byte tokens 0x80-0xFF (ids 131-258 of the synthetic vocabularies).
const BYTE_BAN = Array.from({ length: 128 }, (_, i) => [131 + i, false]);

/** A serving process under test. */
export interface ServingServer {
  kind: ServerKind;
  url: string;
  child: Child;
  budget: number | undefined;
  /** Request fields this server needs (llama-server: the byte-token ban). */
  extra: Record<string, unknown>;
}

/** One serving benchmark run: what the stall and concurrency parts share. */
export class ServingContext {
  readonly h: Harness<Figure>;
  readonly opts: ServingOptions & { model: string };
  readonly loc: Locations;
  readonly notes: Record<string, unknown> & {
    stall: Record<string, unknown> & { runs: Record<string, unknown> };
    concurrency: Record<string, unknown> & { runs: Record<string, unknown> };
  };
  readonly addon: string | undefined;
  readonly modelLabel: string;
  readonly stallCtx: number;
  readonly concCtx: number;
  #salt = 1;

  constructor(
    h: Harness<Figure>,
    opts: ServingOptions & { model: string },
    loc: Locations,
    notes: ServingContext['notes'],
  ) {
    this.h = h;
    this.opts = opts;
    this.loc = loc;
    this.notes = notes;
    const nativeDir = join(loc.root, 'packages/native-ggml');
    // The bundled engine cannot find the addon from benchmarks/dist/gpu/ by itself.
    this.addon =
      process.env.HYDRA_NATIVE_ADDON ??
      this.toolPath('hydra_ggml.node') ??
      [join(nativeDir, 'build-cuda/bin/hydra_ggml.node'), join(nativeDir, 'build/bin/hydra_ggml.node')].find(
        (p) => existsSync(p),
      );
    this.modelLabel = basename(opts.model).replace(/\.gguf$/, '');
    ({ stallCtx: this.stallCtx, concCtx: this.concCtx } = contextSizes(opts));
  }

  toolPath(name: string): string | undefined {
    const d = this.loc.toolsDir;
    return d && existsSync(join(d, name)) ? join(d, name) : undefined;
  }

  /** A salt no earlier request of this run used, so neither server reuses a cached prefix. */
  nextSalt(): number {
    return this.#salt++ * 7919 + (Date.now() % 1000);
  }

  /** The llama.cpp flags both servers get; -b/-ub only where a budget is set. */
  llamaFlags(ctx: number, budget: number | undefined): string[] {
    const o = this.opts;
    const f = ['-m', o.model, '-ngl', String(o.ngl), '-fa', o.fa, '-c', String(ctx), '-np', String(o.np)];
    if (budget !== undefined)
      f.push('-b', String(budget), '-ub', String(Math.min(o.ubatch ?? budget, budget)));
    if (o.threads) f.push('-t', String(o.threads), '-tb', String(o.threads));
    if (o.kvUnified) f.push('-kvu');
    return f;
  }

  /** Starts the engine or llama-server with the same llama.cpp flags; resolves once it serves. */
  async startServer(kind: ServerKind, ctx: number, budget: number | undefined): Promise<ServingServer> {
    const port = await freeLoopbackPort();
    const flags = this.llamaFlags(ctx, budget);
    const url = `http://127.0.0.1:${port}`;
    let child: Child;
    if (kind === 'engine') {
      const cli = this.loc.engineCli;
      if (!cli) throw new Error('no engine: build apps/engine or run benchmarks/gpu/bundle.mjs');
      child = this.h.processes.start(
        process.execPath,
        [
          cli,
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
        { env: this.addon ? { HYDRA_NATIVE_ADDON: this.addon } : {} },
      );
    } else {
      const bin = this.toolPath('llama-server');
      if (!bin)
        throw new Error(
          `llama-server not found in ${this.loc.toolsDir ?? 'packages/native-ggml/build{-cuda,}/bin'}`,
        );
      // --cache-ram 0: the engine keeps no host-RAM prompt cache; llama-server's (8 GiB by default)
      // would copy a reused slot's KV to host memory inside the measured window.
      child = this.h.processes.start(bin, [
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
    // llama-server: 200 once loaded, and its log names this port (not another server's answer);
    // the engine: 200 with state ready.
    await waitHttp(
      `${url}/health`,
      (status, body) =>
        status === 200 &&
        (kind === 'engine'
          ? body.state === 'ready'
          : llamaServerListening(child.head() + child.tail()) === url),
      performance.now(),
      child,
      300_000,
      50,
    );
    return { kind, url, child, budget, extra: kind === 'engine' ? {} : { logit_bias: BYTE_BAN } };
  }

  /** Waits until no slot is busy (engine: /health slots.busy; llama-server: /slots), at most 30 s. */
  async waitIdle(server: ServingServer): Promise<void> {
    const end = Date.now() + 30_000;
    while (Date.now() < end) {
      try {
        if (server.kind === 'engine') {
          const { body } = await getJson(`${server.url}/health`);
          const slots = body.slots as { busy?: number } | undefined;
          if (!slots || slots.busy === 0) return;
        } else {
          const { status, body } = await getJson(`${server.url}/slots`);
          const busy = status === 200 ? llamaServerBusy(body) : undefined;
          if (busy === undefined) {
            await sleep(500);
            return;
          }
          if (!busy) return;
        }
      } catch {
        // a busy server may miss the 2 s poll timeout: poll again
      }
      await sleep(20);
    }
    throw new Error(`${server.kind}: slots still busy 30 s after the requests ended`);
  }
}

/** Each slot must hold its longest request and a few generated tokens (slots get n_ctx / n_parallel). */
export function contextSizes(o: ServingOptions): { stallCtx: number; concCtx: number } {
  return {
    stallCtx: o.stallCtx ?? o.np * (Math.ceil((o.longTokens + 64) / 256) * 256),
    concCtx: o.concCtx ?? o.np * (Math.ceil((o.concPrompt + o.concTokens + 16) / 256) * 256),
  };
}

/** `n` token ids of a prompt, distinct per salt; ids 300..999 exist in every synthetic vocabulary. */
export function promptTokens(n: number, salt: number): number[] {
  let x = (salt * 2654435761 + 12345) >>> 0 || 1;
  const out = new Array<number>(n);
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

/** A streamed request in flight: token arrival times, and `abort()` to cancel it. */
export interface StreamRecord {
  times: number[];
  usage: { prompt_tokens: number; completion_tokens: number } | undefined;
  done: boolean;
  error: unknown;
  aborted: boolean;
  sentAt: number;
  abort(): void;
  finished: Promise<void>;
}

/** One streamed /v1/completions request; `times` gets the arrival of every chunk that carries a token. */
export function streamCompletion(server: ServingServer, prompt: number[], maxTokens: number): StreamRecord {
  const ctl = new AbortController();
  const rec: StreamRecord = {
    times: [],
    usage: undefined,
    done: false,
    error: undefined,
    aborted: false,
    sentAt: performance.now(),
    abort: () => {
      rec.aborted = true;
      ctl.abort();
    },
    finished: Promise.resolve(),
  };
  rec.finished = (async () => {
    try {
      const res = await postJson(
        `${server.url}/v1/completions`,
        {
          ...server.extra,
          prompt,
          max_tokens: maxTokens,
          temperature: 0,
          ignore_eos: true,
          stream: true,
          stream_options: { include_usage: true },
        },
        ctl.signal,
      );
      for await (const ev of sseEvents(res.body as AsyncIterable<Uint8Array>)) {
        rec.usage = usageOf(ev.data) ?? rec.usage;
        const c = choiceOf(ev.data);
        // A finish chunk with empty text carries no token.
        if (c && ((c.text ?? '') !== '' || c.finish_reason == null)) rec.times.push(ev.at);
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
export async function completion(
  server: ServingServer,
  prompt: number[],
  maxTokens: number,
): Promise<number> {
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
  const body = (await res.json().catch(() => ({}))) as { usage?: { completion_tokens?: unknown } };
  if (!res.ok) throw new Error(`HTTP ${res.status}: ${JSON.stringify(body).slice(0, 300)}`);
  const n = body.usage?.completion_tokens;
  if (typeof n !== 'number' || !Number.isInteger(n))
    throw new Error(`no usage.completion_tokens in ${JSON.stringify(body).slice(0, 300)}`);
  return n;
}

export async function until(cond: () => unknown, timeoutMs: number, what: string): Promise<void> {
  const end = Date.now() + timeoutMs;
  while (!cond()) {
    if (Date.now() > end) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await sleep(2);
  }
}

export const pct = (xs: readonly number[], q: number): number | null => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length ? (s[Math.min(s.length - 1, Math.max(0, Math.ceil(q * s.length) - 1))] as number) : null;
};
export const round = (x: number | null | undefined): number | null =>
  x == null ? null : Math.round(x * 100) / 100;
