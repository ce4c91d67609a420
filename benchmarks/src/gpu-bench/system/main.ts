import { HydraError } from '@hydra-engine/errors';
import { resultsDir } from '../../results.js';
import type { Figure } from '../../schema.js';
import { describeFigure, Harness, locate, type Part, parseFlags, schemaSink } from '../harness/index.js';
import { boot } from './boot.js';
import { combine } from './combine.js';
import { DEFAULTS, FLAGS, SystemContext, type SystemNotes, USAGE } from './context.js';
import { control } from './control.js';
import { load } from './load.js';
import { rpc } from './rpc.js';
import { solo } from './solo.js';
import { profileSwitch } from './switch.js';
import { synth } from './synth.js';

/** In run order: each skips itself when --only leaves it out or the budget cannot hold it. */
const PART_LIST: readonly Part<SystemContext>[] = [
  synth,
  solo,
  rpc,
  combine,
  boot,
  control,
  profileSwitch,
  load,
];

function summary(h: Harness<Figure>): void {
  console.log('\n== summary');
  for (const f of h.figures) {
    const a = f.anchor
      ? `  anchor ${f.anchor.median.toPrecision(4)} (${f.anchor.name})  ratio ${f.ratio?.toFixed(3)}`
      : '';
    const l = f.limit ? `  limit ${f.limit.value.toPrecision(4)} ${f.limit.unit}` : '';
    console.log(
      `${f.name}: ${f.median.toPrecision(4)} ${f.unit} (p99 ${f.p99.toPrecision(4)}, n=${f.samples})${a}${l}`,
    );
  }
  for (const s of h.skipped) console.log(`skipped ${s.name}: ${s.reason}`);
  console.log(`results: ${h.resultPath}`);
}

/**
 * The GPU system benchmark (benchmarks/README.md, "GPU system benchmark"): `entryUrl` is the entry
 * script's URL (run.mjs, or the bundle run.cjs). Resolves to the exit code.
 */
export async function main(argv: readonly string[], entryUrl: string): Promise<number> {
  let opts: typeof DEFAULTS;
  try {
    const parsed = parseFlags(argv, DEFAULTS, FLAGS, { '--dry-run': 'dryRun' });
    if (parsed === 'help') {
      console.log(USAGE);
      return 0;
    }
    opts = parsed;
  } catch (err) {
    if (!(err instanceof HydraError)) throw err;
    console.error(`gpu bench: ${err.message}\n${USAGE}`);
    return 2;
  }
  const loc = locate(entryUrl, opts.tools, 'llama-bench');
  const notes: SystemNotes = {
    parts: opts.only,
    tools: loc.toolsDir,
    engine: loc.engineCli,
    reps: opts.reps,
    ngl: opts.ngl,
    models: {},
  };
  const outDir = opts.out ?? resultsDir(loc.root);
  const h = new Harness<Figure>(
    { budgetS: opts.budgetS, sink: schemaSink('gpu', outDir, new Date()), describe: describeFigure },
    notes,
  );
  const c = new SystemContext(h, opts, loc, notes);
  h.log(
    `gpu bench: parts ${opts.only.join(',')}; tools ${loc.toolsDir ?? 'none'}; engine ${loc.engineCli ?? 'none'}; models ${c.modelsDir}; budget ${opts.budgetS} s`,
  );
  if (opts.dryRun) {
    console.log(
      JSON.stringify(
        {
          opts,
          toolsDir: loc.toolsDir,
          engineCli: loc.engineCli,
          addon: c.addon,
          modelsDir: c.modelsDir,
          outDir,
        },
        null,
        2,
      ),
    );
    return 0;
  }
  h.processes.installExitHandlers();
  // Whatever happens, stop by the budget and keep what was measured.
  h.startWatchdog(20, () => summary(h));
  h.save();
  try {
    for (const part of PART_LIST)
      if (opts.only.includes(part.name as (typeof opts.only)[number])) await h.runPart(part, c);
  } catch (err) {
    console.error(err);
    h.save();
    return 1;
  }
  summary(h);
  return 0;
}
