import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { HydraError } from '@hydra-engine/errors';
import { repoRoot, resultsDir } from '../../results.js';
import type { Figure } from '../../schema.js';
import { Harness, locate, type Part, parseFlags, schemaSink } from '../harness/index.js';
import { concurrency } from './concurrency.js';
import {
  type ServingContext as Ctx,
  checkOptions,
  contextSizes,
  DEFAULTS,
  FLAGS,
  ServingContext,
  SWITCHES,
  USAGE,
} from './context.js';
import { stall } from './stall.js';

/** A figure's progress line, its anchor by name (several anchors per figure family here). */
function describeFigure(f: Figure): string {
  const a = f.anchor ? ` | ${f.anchor.name} ${f.anchor.median.toPrecision(4)} (x${f.ratio?.toFixed(3)})` : '';
  return `${f.name}: ${f.median.toPrecision(4)} ${f.unit}${a}`;
}

const PART_LIST: readonly Part<Ctx>[] = [stall, concurrency];

/** The serving benchmarks (benchmarks/README.md): stall and concurrency against llama-server. Resolves to the exit code. */
export async function main(argv: readonly string[], entryUrl: string): Promise<number> {
  let opts: ReturnType<typeof checkOptions>;
  try {
    const parsed = parseFlags(argv, DEFAULTS, FLAGS, SWITCHES);
    if (parsed === 'help') {
      console.log(USAGE);
      return 0;
    }
    opts = checkOptions(
      parsed,
      join(repoRoot(dirname(fileURLToPath(entryUrl))), 'models/bench/llama-8b-q4_0.gguf'),
    );
  } catch (err) {
    if (!(err instanceof HydraError)) throw err;
    console.error(`serving bench: ${err.message}\n${USAGE}`);
    return 2;
  }
  const loc = locate(entryUrl, opts.tools, 'llama-server');
  const { stallCtx, concCtx } = contextSizes(opts);
  const notes: Ctx['notes'] = {
    model: opts.model,
    engine: loc.engineCli,
    tools: loc.toolsDir,
    flags: {
      ngl: opts.ngl,
      fa: opts.fa,
      threads: opts.threads ?? 'default',
      np: opts.np,
      ...(opts.kvUnified ? { kv_unified: true } : {}),
    },
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
  const h = new Harness<Figure>(
    {
      budgetS: opts.budgetS,
      sink: schemaSink('serving', opts.out ?? resultsDir(loc.root), new Date()),
      describe: describeFigure,
    },
    notes,
  );
  const c = new ServingContext(h, opts, loc, notes);
  h.log(
    `serving bench: ${c.modelLabel}, parts ${opts.only.join(',')}, servers ${opts.servers.join(',')}, tools ${loc.toolsDir ?? 'none'}, engine ${loc.engineCli ?? 'none'}`,
  );
  h.processes.installExitHandlers();
  h.startWatchdog(0);
  h.save();
  try {
    for (const part of PART_LIST)
      if (opts.only.includes(part.name as (typeof opts.only)[number])) await h.runPart(part, c);
  } catch (err) {
    console.error(err);
    h.save();
    return 1;
  }
  console.log(
    JSON.stringify(
      { results: h.resultPath, figures: h.figures.length, skipped: h.skipped.map((s) => s.name) },
      null,
      2,
    ),
  );
  return 0;
}
