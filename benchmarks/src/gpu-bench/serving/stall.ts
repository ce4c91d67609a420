import { makeFigure } from '../../schema.js';
import type { Part } from '../harness/index.js';
import {
  pct,
  promptTokens,
  round,
  type ServerKind,
  type ServingContext,
  type ServingServer,
  streamCompletion,
  until,
} from './context.js';

interface StallRep {
  gaps: number[];
  ttftMs: number;
  before: number[];
}

/**
 * One repetition: S streams decode, the long prompt arrives once each has `arriveAfter` tokens.
 * Returns the gaps (ms) of the running streams that overlap the long prompt's prefill, the long
 * prompt's TTFT, and the running streams' gaps before it arrived (the plain step time).
 */
async function stallRep(c: ServingContext, server: ServingServer): Promise<StallRep> {
  const { opts } = c;
  const streams = Array.from({ length: opts.streams }, () =>
    streamCompletion(server, promptTokens(32, c.nextSalt()), opts.streamTokens),
  );
  const failed = () => streams.find((s) => s.error);
  await until(
    () => failed() || streams.every((s) => s.times.length >= opts.arriveAfter || s.done),
    120_000,
    `${opts.streams} streams to reach ${opts.arriveAfter} tokens`,
  );
  if (failed()) throw failed()?.error;
  if (streams.some((s) => s.done)) throw new Error('a stream ended before the long prompt arrived');
  const long = streamCompletion(server, promptTokens(opts.longTokens, c.nextSalt()), 4);
  const sent = long.sentAt;
  await until(() => long.times.length > 0 || long.done, 300_000, 'the long prompt to start generating');
  if (long.error) throw long.error;
  const first = long.times[0];
  if (first === undefined) throw new Error('the long prompt produced no token');
  // Every running stream must show a token after the prefill, so the gap spanning it is closed.
  await until(
    () => failed() || streams.every((s) => s.done || s.times.filter((t) => t > first).length >= 3),
    120_000,
    'the running streams to resume after the prefill',
  );
  for (const s of streams) s.abort();
  await Promise.all([...streams.map((s) => s.finished), long.finished]);
  if (failed()) throw failed()?.error;
  const gaps: number[] = [];
  const before: number[] = [];
  let endedEarly = 0;
  for (const s of streams) {
    if (!s.times.some((t) => t > first)) endedEarly++;
    for (let i = 1; i < s.times.length; i++) {
      const t1 = s.times[i] as number;
      const t0 = s.times[i - 1] as number;
      if (t1 > sent && t0 < first) gaps.push(t1 - t0);
      else if (t1 <= sent && i >= 2) before.push(t1 - t0);
    }
  }
  if (endedEarly > 0)
    throw new Error(`${endedEarly} stream(s) ended during the prefill: raise --stream-tokens`);
  await c.waitIdle(server);
  return { gaps, ttftMs: first - sent, before };
}

interface StallRun {
  budget: number;
  max_gap_ms: (number | null)[];
  gap_p50_ms: number | null;
  gap_p99_ms: number | null;
  gaps_in_window: number;
  ttft_ms: (number | null)[];
  ttft_alone_ms: (number | null)[];
  step_before_p50_ms: number | null;
}

async function stallRun(
  c: ServingContext,
  kind: ServerKind,
  budget: number,
): Promise<StallRun & { raw: StallRep[] }> {
  const { opts, h } = c;
  const server = await c.startServer(kind, c.stallCtx, budget);
  try {
    // Warm-up: the long prompt alone (also the TTFT without running streams), then one short stream.
    const alone: number[] = [];
    for (let i = 0; i < 2; i++) {
      const r = streamCompletion(server, promptTokens(opts.longTokens, c.nextSalt()), 1);
      await r.finished;
      if (r.error) throw r.error;
      alone.push((r.times[0] ?? Number.NaN) - r.sentAt);
    }
    const warm = streamCompletion(server, promptTokens(32, c.nextSalt()), 16);
    await warm.finished;
    if (warm.error) throw warm.error;
    await c.waitIdle(server);
    const reps: StallRep[] = [];
    for (let r = 0; r < opts.reps; r++) reps.push(await stallRep(c, server));
    const gaps = reps.flatMap((r) => r.gaps);
    const before = reps.flatMap((r) => r.before);
    const run: StallRun = {
      budget,
      max_gap_ms: reps.map((r) => round(Math.max(...r.gaps))),
      gap_p50_ms: round(pct(gaps, 0.5)),
      gap_p99_ms: round(pct(gaps, 0.99)),
      gaps_in_window: gaps.length,
      ttft_ms: reps.map((r) => round(r.ttftMs)),
      ttft_alone_ms: alone.map(round),
      step_before_p50_ms: round(pct(before, 0.5)),
    };
    h.log(
      `stall ${kind} budget ${budget}: max gap ${run.max_gap_ms.join('/')} ms, p50 ${run.gap_p50_ms} p99 ${run.gap_p99_ms} ms (${gaps.length} gaps), TTFT ${run.ttft_ms.join('/')} ms (alone ${run.ttft_alone_ms.join('/')}), step before ${run.step_before_p50_ms} ms`,
    );
    return { ...run, raw: reps };
  } finally {
    await h.processes.stop(server.child);
  }
}

/** S streams decoding, then a long prompt: the running streams' gaps and its TTFT, per budget. */
export const stall: Part<ServingContext> = {
  name: 'stall',
  estimateS: 30,
  async run(c) {
    const { opts, h, notes } = c;
    const what = `${opts.streams} streams + ${opts.longTokens}-token prompt, ${c.modelLabel}, -np ${opts.np}${opts.kvUnified ? ' -kvu' : ''}`;
    const stallRuns = notes.stall.runs as Record<
      string,
      { engine: StallRun | null; 'llama-server': StallRun | null }
    >;
    for (const budget of opts.budgets) {
      const runs: Partial<Record<ServerKind, StallRun & { raw: StallRep[] }>> = {};
      for (const kind of opts.servers) {
        if (h.remainingS() < 30) {
          h.skip(
            `stall ${kind} budget ${budget}`,
            `time budget: ${h.remainingS().toFixed(0)} s left; run fewer --budgets per call`,
          );
          continue;
        }
        try {
          runs[kind] = await stallRun(c, kind, budget);
        } catch (err) {
          h.failed(`stall ${kind} budget ${budget}`, err);
        }
      }
      const strip = (r: (StallRun & { raw: StallRep[] }) | undefined): StallRun | null => {
        if (!r) return null;
        const { raw: _raw, ...rest } = r;
        return rest;
      };
      stallRuns[budget] = { engine: strip(runs.engine), 'llama-server': strip(runs['llama-server']) };
      const engRaw = runs.engine?.raw;
      const srvRaw = runs['llama-server']?.raw;
      // The engine's figure anchored on llama-server; llama-server alone when the engine did not run.
      const main = engRaw
        ? { who: 'engine', raw: engRaw }
        : srvRaw
          ? { who: 'llama-server', raw: srvRaw }
          : null;
      if (!main) continue;
      const anchorRaw = main.who === 'engine' ? srvRaw : undefined;
      const anchor = (name: string, samples: number[]) =>
        anchorRaw ? { name: `llama-server, same flags (${name})`, unit: 'ms', samples } : null;
      const sweep = (family: string) => ({
        family: `${family}, ${what}`,
        key: 'budget (n_batch)',
        value: budget,
      });
      const suffix = main.who === 'engine' ? '' : ' (llama-server)';
      h.add(
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
      h.add(
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
      h.add(
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
      h.save();
    }
    // The trade-off table the default is picked from: budget -> max gap, TTFT.
    const maxOf = (xs: (number | null)[]) => Math.max(...(xs as number[]));
    const tradeoff = Object.entries(stallRuns).map(([b, r]) => ({
      budget: Number(b),
      engine_max_gap_ms: r.engine ? maxOf(r.engine.max_gap_ms) : null,
      engine_ttft_ms: r.engine ? pct(r.engine.ttft_ms as number[], 0.5) : null,
      server_max_gap_ms: r['llama-server'] ? maxOf(r['llama-server'].max_gap_ms) : null,
      server_ttft_ms: r['llama-server'] ? pct(r['llama-server'].ttft_ms as number[], 0.5) : null,
    }));
    notes.stall.tradeoff = tradeoff;
    console.error('budget  engine max gap / TTFT   llama-server max gap / TTFT (ms)');
    for (const t of tradeoff)
      console.error(
        `${String(t.budget).padStart(6)}  ${String(t.engine_max_gap_ms).padStart(8)} / ${String(t.engine_ttft_ms).padEnd(10)} ${String(t.server_max_gap_ms).padStart(8)} / ${t.server_ttft_ms}`,
      );
  },
};
