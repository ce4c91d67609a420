import { makeFigure } from '../../schema.js';
import { type Part, parseBatchedBenchJsonl, runTool } from '../harness/index.js';
import { completion, promptTokens, round, type ServerKind, type ServingContext } from './context.js';

/**
 * llama-batched-bench's S_TG per parallel level, one array of samples per level. Its rows go through
 * llama.cpp's asynchronous logger, which the process may leave unflushed at exit (seen on the CPU in
 * about 2 runs of 5): levels whose row is missing are run again, at most 3 times per repetition.
 */
async function batchedBench(c: ServingContext): Promise<Map<number, number[]>> {
  const { opts } = c;
  const bin = c.toolPath('llama-batched-bench');
  if (!bin) throw new Error(`llama-batched-bench not found in ${c.loc.toolsDir}`);
  const base = [
    '-m',
    opts.model,
    '-ngl',
    String(opts.ngl),
    '-fa',
    opts.fa,
    '-c',
    String(c.concCtx),
    '-npp',
    String(opts.concPrompt),
    '-ntg',
    String(opts.concTokens),
    '--output-format',
    'jsonl',
  ];
  if (opts.threads) base.push('-t', String(opts.threads), '-tb', String(opts.threads));
  if (opts.kvUnified) base.push('-kvu');
  const byLevel = new Map<number, number[]>(opts.levels.map((l) => [l, []]));
  let runs = 0;
  for (let r = 0; r < opts.reps; r++) {
    let missing = [...opts.levels];
    for (let attempt = 0; attempt < 3 && missing.length > 0; attempt++) {
      runs++;
      const { stdout, stderr } = await runTool(bin, [...base, '-npl', missing.join(',')], 300_000);
      for (const row of parseBatchedBenchJsonl(`${stdout}\n${stderr}`)) {
        if (!missing.includes(row.pl)) continue;
        byLevel.get(row.pl)?.push(row.speed_tg);
        missing = missing.filter((l) => l !== row.pl);
      }
    }
    if (missing.length > 0)
      throw new Error(`llama-batched-bench printed no row for -npl ${missing.join(',')} in 3 runs`);
  }
  c.notes.concurrency.batched_bench = {
    args: `${base.join(' ')} -npl ${opts.levels.join(',')}`,
    runs,
    s_tg: Object.fromEntries(byLevel),
  };
  return byLevel;
}

type LevelRates = Map<number, { agg: number[]; decodeOnly: (number | null)[] }>;

async function concurrencyRun(c: ServingContext, kind: ServerKind): Promise<LevelRates> {
  const { opts, h } = c;
  const server = await c.startServer(kind, c.concCtx, undefined);
  try {
    const levels: LevelRates = new Map();
    const max = Math.max(...opts.levels);
    await Promise.all(
      Array.from({ length: max }, () => completion(server, promptTokens(opts.concPrompt, c.nextSalt()), 8)),
    );
    await c.waitIdle(server);
    for (const level of opts.levels) {
      const agg: number[] = [];
      const decodeOnly: (number | null)[] = [];
      for (let r = 0; r < opts.reps; r++) {
        const batch = (n: number) =>
          Array.from({ length: level }, () =>
            completion(server, promptTokens(opts.concPrompt, c.nextSalt()), n),
          );
        let t = performance.now();
        await Promise.all(batch(1));
        const wall1 = performance.now() - t;
        await c.waitIdle(server);
        t = performance.now();
        const counts = await Promise.all(batch(opts.concTokens));
        const wall = performance.now() - t;
        await c.waitIdle(server);
        const tokens = counts.reduce((a, b) => a + b, 0);
        agg.push(tokens / (wall / 1000));
        // Noise can make the short run the longer one at a few tokens on a loaded CPU: no figure then.
        decodeOnly.push(wall > wall1 ? (tokens - level) / ((wall - wall1) / 1000) : null);
      }
      levels.set(level, { agg, decodeOnly });
      h.log(
        `concurrency ${kind} x${level}: ${agg.map((v) => v.toFixed(0)).join('/')} tok/s (decode only ${decodeOnly.map((v) => v?.toFixed(0) ?? '-').join('/')})`,
      );
    }
    c.notes.concurrency.runs[kind] = Object.fromEntries(
      [...levels].map(([l, v]) => [l, { aggregate: v.agg.map(round), decode_only: v.decodeOnly.map(round) }]),
    );
    return levels;
  } finally {
    await h.processes.stop(server.child);
  }
}

/** Aggregate decode tok/s at 1..N concurrent completions against llama-batched-bench S_TG and llama-server. */
export const concurrency: Part<ServingContext> = {
  name: 'concurrency',
  estimateS: 30,
  async run(c) {
    const { opts, h } = c;
    let bb: Map<number, number[]> | undefined;
    try {
      bb = await batchedBench(c);
      h.log(
        `llama-batched-bench S_TG: ${[...bb].map(([l, v]) => `x${l} ${v.map((x) => x.toFixed(0)).join('/')}`).join(', ')}`,
      );
    } catch (err) {
      h.failed('concurrency: llama-batched-bench anchor', err);
    }
    const runs: Partial<Record<ServerKind, LevelRates>> = {};
    for (const kind of opts.servers) {
      if (h.remainingS() < 30) {
        h.skip(
          `concurrency ${kind}`,
          `time budget: ${h.remainingS().toFixed(0)} s left; run --only concurrency alone`,
        );
        continue;
      }
      try {
        runs[kind] = await concurrencyRun(c, kind);
      } catch (err) {
        h.failed(`concurrency ${kind}`, err);
      }
      h.save();
    }
    const bbAnchor = (l: number) =>
      bb
        ? {
            name: `llama-batched-bench S_TG (-npp ${opts.concPrompt} -ntg ${opts.concTokens} -npl ${l})`,
            unit: 'tok/s',
            samples: bb.get(l) ?? [],
          }
        : null;
    const what = (l: number) =>
      `${l} concurrent x ${opts.concTokens} tokens, ${c.modelLabel}, -np ${opts.np}${opts.kvUnified ? ' -kvu' : ''}`;
    for (const level of opts.levels) {
      const sweep = (family: string) => ({
        family: `${family}, ${c.modelLabel}`,
        key: 'concurrent streams',
        value: level,
      });
      const eng = runs.engine?.get(level);
      const srv = runs['llama-server']?.get(level);
      const srvAnchor = srv
        ? { name: `llama-server -np ${opts.np}, same requests`, unit: 'tok/s', samples: srv.agg }
        : null;
      // One figure per anchor present; a single unanchored one when neither ran (see skipped).
      const engineFigures = (
        [
          ['batched-bench', bbAnchor(level)],
          ['llama-server', srvAnchor],
        ] as const
      ).filter(([, anchor]) => anchor) as [string, ReturnType<typeof bbAnchor>][];
      if (eng && engineFigures.length === 0) engineFigures.push(['no anchor', null]);
      for (const [vs, anchor] of eng ? engineFigures : [])
        h.add(
          makeFigure({
            name: `concurrency: engine aggregate decode, ${what(level)} (vs ${vs})`,
            unit: 'tok/s',
            samples: eng?.agg ?? [],
            anchor,
            sweep: sweep(`concurrency: engine vs ${vs}`),
          }),
        );
      if (srv && bb)
        h.add(
          makeFigure({
            name: `concurrency: llama-server aggregate decode, ${what(level)} (vs batched-bench)`,
            unit: 'tok/s',
            samples: srv.agg,
            anchor: bbAnchor(level),
            sweep: sweep('concurrency: llama-server vs batched-bench'),
          }),
        );
    }
  },
};
