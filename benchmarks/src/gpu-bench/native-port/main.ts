import { existsSync, mkdirSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { HydraError } from '@hydra-engine/errors';
import { exitNow, initBackend, listDevices } from '@hydra-engine/native-ggml';
import { type SynthShape, writeSyntheticModel } from '@hydra-engine/native-ggml/synth';
import { summarize } from '../../schema.js';
import {
  badFlag,
  Harness,
  localDevice,
  locate,
  type Part,
  parseFlags,
  parseListDevices,
  runTool,
} from '../harness/index.js';
import {
  DEFAULTS,
  describeNativeFigure,
  FLAGS,
  httpDecode,
  type LlamaBenchPair,
  type NativeFigure,
  NativePortContext,
  nativeFigure,
  nativePortHeader,
  nativePortSink,
  type Planner,
  type Step,
  USAGE,
} from './context.js';
import { checkModes, greedyCheck, MODE_LABELS, MODES, nativeDecode } from './decode.js';
import { helloLatency } from './hello.js';
import { memoryCheck } from './memory.js';

/** Which context of the process `mode` ran in (`reload` entries make none). */
function contextNumber(modes: readonly string[], mode: string): number {
  return modes.slice(0, modes.indexOf(mode) + 1).filter((m) => !m.startsWith('reload')).length;
}

interface Anchor2 extends LlamaBenchPair {
  before?: { pp: number; tg: number };
  after?: { pp: number; tg: number };
}

/** The median of both runs' repetitions, so drift over the minute the loops take counts against neither side. */
function mergeAnchors(a: LlamaBenchPair, b: LlamaBenchPair): Anchor2 {
  const avg = (r: LlamaBenchPair) => ({ pp: r.pp.median, tg: r.tg.median });
  return {
    pp: {
      median: summarize([...a.pp.samples, ...b.pp.samples]).median,
      samples: [...a.pp.samples, ...b.pp.samples],
    },
    tg: {
      median: summarize([...a.tg.samples, ...b.tg.samples]).median,
      samples: [...a.tg.samples, ...b.tg.samples],
    },
    before: avg(a),
    after: avg(b),
  };
}

async function ensureModel(c: NativePortContext, arch: 'llama', shape: string): Promise<string> {
  mkdirSync(c.opts.models, { recursive: true });
  const out = join(c.opts.models, `${arch}-${shape}-q4_0.gguf`);
  if (!existsSync(out)) {
    c.h.log(`writing synthetic ${arch} ${shape} q4_0`);
    const r = await writeSyntheticModel({ arch, shape: shape as SynthShape, quant: 'q4_0', seed: 1, out });
    c.h.log(`wrote ${out}: ${(r.bytes / 1e9).toFixed(2)} GB in ${r.seconds.toFixed(1)} s`);
  }
  return out;
}

/** What the steps of one model shape share. */
interface ShapeState {
  shape: string;
  model: string;
  /** llama-bench's local pp512/tg128, measured once for `native` and `http`. */
  anchor?: Anchor2;
  firstShape: boolean;
}

/** The steps of one shape, in order; each skips itself when the budget cannot hold it. */
function stepsOf(c: NativePortContext, s: ShapeState): { step: Step; part: Part<NativePortContext> }[] {
  const big = s.shape === '27b' ? 2 : 1;
  const { h, opts } = c;
  const notes = h.notes;
  const localAnchor = async () => {
    if (!s.anchor) {
      h.log(`llama-bench local ${s.shape}`);
      s.anchor = await c.llamaBench(s.model, ['-ngl', '99', '-r', String(opts.reps)]);
    }
    return s.anchor;
  };
  const steps: { step: Step; part: Part<NativePortContext> }[] = [];
  steps.push({
    step: 'memory',
    part: {
      name: `memory ${s.shape}`,
      estimateS: 15 * big,
      async run() {
        h.log(`memory: planner vs load, ${s.shape}`);
        await memoryCheck(c, s.model, s.shape, notes.memory as unknown[]);
      },
    },
  });
  steps.push({
    step: 'native',
    part: {
      name: `native ${s.shape}`,
      estimateS: 60 * big,
      async run() {
        const first = await localAnchor();
        h.log(`greedy generation ${s.shape}: binding vs llama-simple`);
        const greedy = await greedyCheck(c, s.model);
        notes[`greedy ${s.shape}`] = greedy;
        h.log(
          `greedy ${s.shape}: ${greedy.tokens} tokens, ${greedy.equal ? 'equal to' : 'DIFFERENT from'} llama-simple`,
        );
        h.log(`native decode loop ${s.shape}`);
        const modes = opts.modes ?? Object.keys(MODES);
        const n = await nativeDecode(c, s.model, modes);
        const again = await c.llamaBench(s.model, ['-ngl', '99', '-r', String(opts.reps)]);
        const anchor = mergeAnchors(first, again);
        s.anchor = anchor;
        notes[`llama-bench ${s.shape}`] = { before: anchor.before, after: anchor.after };
        const tg128 = {
          name: 'llama-bench tg128 (median of the repetitions of two runs)',
          unit: 'tokens/s',
          median: anchor.tg.median,
        };
        if (n.backend)
          h.add(
            nativeFigure(`${s.shape} q4_0 prefill 512, native decode call`, 'tokens/s', n.backend.pp, {
              name: 'llama-bench pp512 (median of the repetitions of two runs)',
              unit: 'tokens/s',
              median: anchor.pp.median,
            }),
          );
        for (const mode of modes.filter((m) => !m.startsWith('reload'))) {
          const [base, rerun] = mode.split('#') as [string, string | undefined];
          const reloaded = modes.slice(0, modes.indexOf(mode)).some((m) => m.startsWith('reload'));
          const label = rerun
            ? `${MODE_LABELS[base]} (again, context ${contextNumber(modes, mode)} of the process${reloaded ? ', model loaded anew' : ''})`
            : MODE_LABELS[base];
          const r = n[mode];
          if (!r) continue;
          h.add(nativeFigure(`${s.shape} q4_0 ${label}`, 'tokens/s', r.tg, tg128));
          notes[`buffers ${s.shape} ${mode}`] = r.buffers;
          notes[`steps ${s.shape} ${mode}`] = {
            ...r.steps,
            llama_bench_ms_per_token: 1000 / anchor.tg.median,
          };
        }
      },
    },
  });
  // http and hello share one engine with the model.
  const engineSteps = (['http', 'hello'] as const).filter(
    (st) => opts.only.includes(st) && (st === 'http' || s.firstShape),
  );
  if (engineSteps.length > 0)
    steps.push({
      step: engineSteps[0] as Step,
      part: {
        name: `${engineSteps.join('+')} ${s.shape}`,
        estimateS: (engineSteps.includes('http') ? 25 * big : 0) + (engineSteps.includes('hello') ? 10 : 0),
        async run() {
          const anchor = engineSteps.includes('http') ? await localAnchor() : undefined;
          const engine = await c.startEngine(s.model);
          try {
            if (anchor) {
              h.log(`HTTP decode ${s.shape}`);
              const tg = { name: 'llama-bench tg128', unit: 'tokens/s', median: anchor.tg.median };
              h.add(
                nativeFigure(
                  `${s.shape} q4_0 decode, one stream through the HTTP API`,
                  'tokens/s',
                  await httpDecode(engine.url, opts.reps),
                  tg,
                ),
              );
              h.save();
              // The same engine after it has served a long prompt: a serving engine's usual state, and
              // the one in which later native contexts decoded 3-4% slower (20261129g).
              const pre = await fetch(`${engine.url}/v1/completions`, {
                method: 'POST',
                headers: { 'content-type': 'application/json' },
                body: JSON.stringify({
                  prompt: 'The history of the world '.repeat(100),
                  max_tokens: 1,
                  temperature: 0,
                }),
              });
              const usage = ((await pre.json()) as { usage?: { prompt_tokens?: number } }).usage;
              h.log(`HTTP: served a ${usage?.prompt_tokens}-token prompt`);
              h.add(
                nativeFigure(
                  `${s.shape} q4_0 decode, one stream through the HTTP API, after serving a ${usage?.prompt_tokens}-token prompt`,
                  'tokens/s',
                  await httpDecode(engine.url, opts.reps),
                  tg,
                ),
              );
              h.save();
            }
            if (engineSteps.includes('hello')) {
              const stock = await c.startStock();
              try {
                const ours = await helloLatency(engine.rpcPort);
                const theirs = await helloLatency(stock.port);
                const sorted = [...theirs].sort((a, b) => a - b);
                h.add(
                  nativeFigure('ggml-RPC HELLO connect-to-reply through the merged port', 'ms', ours, {
                    name: 'stock ggml-rpc-server HELLO',
                    unit: 'ms',
                    median: sorted[Math.floor(sorted.length / 2)] as number,
                    p99: sorted[Math.floor(sorted.length * 0.99)] as number,
                  }),
                );
              } finally {
                await h.processes.stop(stock.child);
              }
            }
          } finally {
            await h.processes.stop(engine.child);
          }
        },
      },
    });
  steps.push({
    step: 'rpc',
    part: {
      name: `rpc ${s.shape}`,
      estimateS: 60 * big,
      async run() {
        // A model-less engine lends its device; llama-bench (upstream client) places layers on it.
        const peer = await c.startPeer();
        const stock = await c.startStock();
        const { stdout } = await runTool(c.tool('llama-bench'), ['--list-devices'], 60_000);
        const local = localDevice(parseListDevices(stdout));
        const layouts: [string, string[]][] = [['all layers remote', ['-dev', 'RPC0']]];
        if (local) layouts.push(['1/1 split', ['-dev', `${local}/RPC0`, '-ts', '1/1']]);
        else h.skip(`rpc ${s.shape} 1/1 split`, 'llama-bench lists no local device for the other half');
        try {
          for (const [label, extra] of layouts) {
            h.log(`llama-bench --rpc ${s.shape} ${label}`);
            const theirs = await c.llamaBench(s.model, ['-ngl', '99', '--rpc', stock.endpoint, ...extra]);
            const ours = await c.llamaBench(s.model, [
              '-ngl',
              '99',
              '--rpc',
              `127.0.0.1:${peer.rpcPort}`,
              ...extra,
            ]);
            h.add(
              nativeFigure(
                `${s.shape} q4_0 ${label}: llama-bench --rpc decode through our merged port`,
                'tokens/s',
                ours.tg.samples,
                {
                  name: 'via stock ggml-rpc-server',
                  unit: 'tokens/s',
                  median: theirs.tg.median,
                },
              ),
            );
            h.add(
              nativeFigure(
                `${s.shape} q4_0 ${label}: llama-bench --rpc prefill through our merged port`,
                'tokens/s',
                ours.pp.samples,
                {
                  name: 'via stock ggml-rpc-server',
                  unit: 'tokens/s',
                  median: theirs.pp.median,
                },
              ),
            );
            h.save();
          }
        } finally {
          await h.processes.stop(stock.child);
          await h.processes.stop(peer.child);
        }
      },
    },
  });
  return steps.filter(({ step }) => opts.only.includes(step));
}

/**
 * The native boundary and the merged port against their upstream anchors (benchmarks/README.md):
 * native decode loops vs llama-bench, HTTP decode vs llama-bench tg128, ggml-RPC HELLO and
 * llama-bench --rpc through our port vs stock ggml-rpc-server, the split planner vs a real load.
 * `planner` is the resolver's planner with the engine's GGUF reader, handed in by the entry script.
 * Resolves to the exit code: 1 when a step failed (its reason is under `skipped`).
 */
export async function main(argv: readonly string[], entryUrl: string, planner: Planner): Promise<number> {
  let opts: typeof DEFAULTS;
  try {
    const parsed = parseFlags(argv, DEFAULTS, FLAGS);
    if (parsed === 'help') {
      console.log(USAGE);
      return 0;
    }
    if (parsed.modes)
      try {
        checkModes(parsed.modes);
      } catch (err) {
        throw badFlag('--modes', (err as Error).message);
      }
    opts = parsed;
  } catch (err) {
    if (!(err instanceof HydraError)) throw err;
    console.error(`native-port bench: ${err.message}\n${USAGE}`);
    return 2;
  }
  process.env.HYDRA_NATIVE_ADDON ??= resolve(opts.bin, 'hydra_ggml.node');
  // --log-level debug shows llama.cpp's debug lines (e.g. a pinned-memory allocation that failed).
  const info = initBackend(opts.logLevel ? { logLevel: opts.logLevel } : {});
  const header = nativePortHeader(listDevices());
  const notes: Record<string, unknown> = {
    command: `node benchmarks/dist/gpu/native-port.cjs ${argv.join(' ')}`,
    // The knobs that change what is measured (OMP_WAIT_POLICY, GGML_CUDA_*).
    environment: Object.fromEntries(
      Object.entries(process.env).filter(([k]) => /^(HYDRA_|GGML_|LLAMA_|OMP_|CUDA_)/.test(k)),
    ),
    systemInfo: info.systemInfo,
    memory: [],
  };
  const h = new Harness<NativeFigure>(
    {
      budgetS: opts.budgetS,
      sink: nativePortSink(header, opts.out),
      prefix: (s) => `[bench ${s.toFixed(0)}s] `,
      describe: describeNativeFigure,
      rerunHint: (name) => {
        const [steps, shape] = name.split(' ');
        return `--only ${steps?.replace('+', ',')} --shapes ${shape}`;
      },
    },
    notes,
  );
  const engineCli = opts.js ? join(opts.js, 'cli.cjs') : locate(entryUrl, opts.bin, 'llama-bench').engineCli;
  const c = new NativePortContext(h, opts, planner, engineCli);
  h.processes.installExitHandlers();
  h.startWatchdog(20, () => {}, exitNow);
  for (const [i, shape] of opts.shapes.entries()) {
    const state: ShapeState = { shape, model: await ensureModel(c, 'llama', shape), firstShape: i === 0 };
    for (const { part } of stepsOf(c, state)) await h.runPart(part, c);
  }
  header.seconds = h.elapsedS();
  h.save();
  h.log('done');
  return h.skipped.some((s) => s.reason.startsWith('failed:')) ? 1 : 0;
}
