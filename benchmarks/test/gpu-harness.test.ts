import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import {
  Harness,
  llamaServerBusy,
  llamaServerListening,
  localDevice,
  metricValue,
  ProcessGroup,
  parseBatchedBenchJsonl,
  parseFlags,
  parseListDevices,
  parseLlamaBenchJson,
  read,
  runTool,
  waitHttp,
} from '../src/gpu-bench/harness/index.js';
import { DEFAULTS as SERVING_DEFAULTS, FLAGS as SERVING_FLAGS } from '../src/gpu-bench/serving/context.js';
import { DEFAULTS, FLAGS } from '../src/gpu-bench/system/context.js';

// Outputs captured from the CPU build of the pinned llama.cpp (tiny synthetic model).
const fixture = (name: string) =>
  readFileSync(new URL(`./fixtures/anchor-tools/${name}`, import.meta.url), 'utf8');

function codeOf(fn: () => unknown): { code?: string; keys?: string[] } {
  try {
    fn();
  } catch (err) {
    return err as { code?: string; keys?: string[] };
  }
  return {};
}

describe('anchor tool parsers', () => {
  it('reads llama-bench -o json: pp and tg per-repetition rates and avg_ts', () => {
    const r = parseLlamaBenchJson(fixture('llama-bench-cpu-tiny.json.txt'));
    expect(r.rows).toHaveLength(2);
    expect(r.pp).toHaveLength(2);
    expect(r.tg).toHaveLength(2);
    for (const v of [...r.pp, ...r.tg]) expect(v).toBeGreaterThan(0);
    expect(r.ppAvg).toBeCloseTo(r.pp.reduce((a, b) => a + b) / r.pp.length, 0);
    // sizes pick the test: -p 64 -n 16 ran, so pp512/tg128 are absent.
    const sized = parseLlamaBenchJson(fixture('llama-bench-cpu-tiny.json.txt'), { pp: 512, tg: 128 });
    expect(sized.pp).toEqual([]);
    expect(sized.ppAvg).toBeUndefined();
    expect(parseLlamaBenchJson(fixture('llama-bench-cpu-tiny.json.txt'), { pp: 64, tg: 16 }).tg).toEqual(
      r.tg,
    );
  });

  it('refuses llama-bench output that is not its JSON array', () => {
    expect(codeOf(() => parseLlamaBenchJson('main: error: failed to load model')).code).toBe(
      'HYDRA_ERR_BENCH_FAILED',
    );
    expect(codeOf(() => parseLlamaBenchJson('{"n_prompt": 1}')).code).toBe('HYDRA_ERR_BENCH_FAILED');
  });

  it('reads llama-bench --list-devices: none on a CPU build, RPC0 with --rpc', () => {
    expect(parseListDevices(fixture('llama-bench-list-devices-cpu.txt'))).toEqual([]);
    const rpc = parseListDevices(fixture('llama-bench-list-devices-rpc.txt'));
    expect(rpc).toHaveLength(1);
    expect(rpc[0]?.name).toBe('RPC0');
    expect(rpc[0]?.description).toMatch(/^127\.0\.0\.1:\d+$/);
    expect(rpc[0]?.totalMiB).toBeGreaterThan(0);
    // The local device is never an RPC one: a CPU build has none for the other half of a split.
    expect(localDevice(rpc)).toBeUndefined();
    expect(
      localDevice([...rpc, { name: 'CUDA0', description: 'NVIDIA H200', totalMiB: 1, freeMiB: 1 }]),
    ).toBe('CUDA0');
    expect(codeOf(() => parseListDevices('usage: llama-bench [options]')).code).toBe(
      'HYDRA_ERR_BENCH_FAILED',
    );
  });

  it('reads llama-batched-bench jsonl rows, and sees a level whose row the logger lost', () => {
    const two = parseBatchedBenchJsonl(fixture('llama-batched-bench-cpu-tiny-2rows.txt'));
    expect(two.map((r) => r.pl)).toEqual([1, 4]);
    for (const r of two) expect(r.speed_tg).toBeGreaterThan(0);
    // The same command (-npl 1,4) whose second row never reached the output.
    expect(
      parseBatchedBenchJsonl(fixture('llama-batched-bench-cpu-tiny-lost-row.txt')).map((r) => r.pl),
    ).toEqual([1]);
    const cut = fixture('llama-batched-bench-cpu-tiny-2rows.txt').split('\n')[0]?.slice(0, 60) ?? '';
    expect(parseBatchedBenchJsonl(`${cut}\n`)).toEqual([]);
  });

  it('reads llama-server /slots and its listening line', () => {
    expect(llamaServerBusy(JSON.parse(fixture('llama-server-slots-idle.json.txt')))).toBe(false);
    expect(llamaServerBusy(JSON.parse(fixture('llama-server-slots-busy.json.txt')))).toBe(true);
    // /health is no slot list: the caller falls back to waiting.
    expect(llamaServerBusy(JSON.parse(fixture('llama-server-health.json.txt')))).toBeUndefined();
    expect(llamaServerListening(fixture('llama-server-log-cpu.txt'))).toMatch(/^http:\/\/127\.0\.0\.1:\d+$/);
    expect(llamaServerListening('load_model: loading model')).toBeUndefined();
  });

  it('reads a gauge of /metrics text', () => {
    const text =
      '# HELP hydra_model_load_seconds x\nhydra_model_load_seconds 0.0446\nhydra_model_load_seconds_total 9\n';
    expect(metricValue(text, 'hydra_model_load_seconds')).toBeCloseTo(0.0446);
    expect(metricValue(text, 'hydra_missing')).toBeNaN();
  });
});

describe('flag parser', () => {
  it('reads run.mjs flags as before: lists, integers, --flag=value, --dry-run', () => {
    const o = parseFlags(
      ['--only', 'solo,rpc', '--reps=0', '--shapes', '8b, 27b', '--dry-run'],
      DEFAULTS,
      FLAGS,
      {
        '--dry-run': 'dryRun',
      },
    );
    expect(o).not.toBe('help');
    if (o === 'help') return;
    expect(o.only).toEqual(['solo', 'rpc']);
    expect(o.reps).toBe(1); // --reps is at least 1, as it always was
    expect(o.shapes).toEqual(['8b', '27b']);
    expect(o.dryRun).toBe(true);
    expect(DEFAULTS.only).toHaveLength(8);
    expect(parseFlags(['-h'], DEFAULTS, FLAGS)).toBe('help');
  });

  it('refuses unknown flags, unknown parts, missing values and bad numbers, naming the flag', () => {
    for (const [argv, key] of [
      [['--bogus', '1'], '--bogus'],
      [['--only', 'solo,warp'], '--only'],
      [['--reps'], '--reps'],
      [['--ngl', '-1'], '--ngl'],
      [['--bandwidth-gbs', 'fast'], '--bandwidth-gbs'],
      [['stray'], 'stray'],
      [['--dry-run=yes'], '--dry-run'],
    ] as const) {
      const err = codeOf(() => parseFlags(argv, DEFAULTS, FLAGS, { '--dry-run': 'dryRun' }));
      expect(err.code, argv.join(' ')).toBe('HYDRA_ERR_BAD_ARGUMENT');
      expect(err.keys).toEqual([key]);
    }
    expect(codeOf(() => parseFlags(['--fa', 'maybe'], SERVING_DEFAULTS, SERVING_FLAGS)).keys).toEqual([
      '--fa',
    ]);
    expect(codeOf(() => parseFlags(['--levels', '1,0'], SERVING_DEFAULTS, SERVING_FLAGS)).keys).toEqual([
      '--levels',
    ]);
  });

  it('reads comma lists of integers', () => {
    expect(read.ints(1)({ flag: '--budgets', value: () => '64, 256,1024' })).toEqual([64, 256, 1024]);
  });
});

describe('harness', () => {
  function harness(budgetS: number) {
    const writes: number[] = [];
    const h = new Harness<{ name: string }>(
      {
        budgetS,
        sink: {
          write: ({ figures }) => {
            writes.push(figures.length);
            return '/dev/null';
          },
        },
        describe: (f) => f.name,
      },
      {},
    );
    return { h, writes };
  }

  it('skips a part whose estimate exceeds what is left of the budget, without running it', async () => {
    const { h, writes } = harness(5);
    let ran = 0;
    await h.runPart({ name: 'load', estimateS: 60, run: async () => void ran++ }, undefined);
    await h.runPart(
      {
        name: 'boot',
        estimateS: 1,
        run: async () => {
          ran++;
          h.add({ name: 'boot figure' });
        },
      },
      undefined,
    );
    expect(ran).toBe(1);
    expect(h.skipped.map((s) => s.name)).toEqual(['load']);
    expect(h.skipped[0]?.reason).toMatch(
      /--budget-s 5, part needs about 60 s; run it in its own call \(--only load\)/,
    );
    expect(h.figures).toEqual([{ name: 'boot figure' }]);
    // Saved after the skip and after the part.
    expect(writes).toEqual([0, 1]);
    expect(h.resultPath).toBe('/dev/null');
  });

  it('records a failed part as skipped with its first lines and kills what the part started', async () => {
    const { h } = harness(60);
    let child: ReturnType<ProcessGroup['start']> | undefined;
    await h.runPart(
      {
        name: 'rpc',
        estimateS: 0,
        run: async () => {
          child = h.processes.start(process.execPath, ['-e', 'setInterval(() => {}, 1000)']);
          throw new Error('llama-bench: exit 1\nline 2');
        },
      },
      undefined,
    );
    expect(h.skipped).toEqual([{ name: 'rpc', reason: 'failed: llama-bench: exit 1 | line 2' }]);
    const exit = await child?.exited;
    expect(exit?.signal).toBe('SIGKILL');
  });

  it('the watchdog saves, records the stop and exits 3 at the budget plus its grace', async () => {
    const { h, writes } = harness(0);
    const codes: number[] = [];
    let fired = 0;
    h.startWatchdog(
      0.05,
      () => void fired++,
      (code) => void codes.push(code),
    );
    for (let i = 0; i < 400 && codes.length === 0; i++) await new Promise((r) => setTimeout(r, 25));
    expect(codes).toEqual([3]);
    expect(fired).toBe(1);
    expect(h.skipped).toEqual([{ name: 'run', reason: 'stopped by the watchdog at --budget-s 0' }]);
    expect(writes).toEqual([0]);
  });

  it('refuses a negative budget', () => {
    expect(() => harness(-1)).toThrow(/options\.budgetS/);
  });

  it('stops a process that ignores SIGTERM with SIGKILL after the grace time', async () => {
    const group = new ProcessGroup();
    const child = group.start(process.execPath, [
      '-e',
      'process.on("SIGTERM", () => {}); console.error("up"); setInterval(() => {}, 1000)',
    ]);
    // Wait until its handler is installed (it prints once it is).
    for (let i = 0; i < 200 && !child.tail().includes('up'); i++) await new Promise((r) => setTimeout(r, 25));
    await group.stop(child, 300);
    expect((await child.exited).signal).toBe('SIGKILL');
  });

  it('runTool rejects on a non-zero exit with the stderr tail, and at its timeout', async () => {
    await expect(
      runTool(process.execPath, ['-e', 'console.error("boom"); process.exit(3)'], 10_000),
    ).rejects.toThrow(/boom/);
    const t = performance.now();
    await expect(runTool(process.execPath, ['-e', 'setTimeout(() => {}, 60000)'], 300)).rejects.toThrow();
    expect(performance.now() - t).toBeLessThan(30_000);
    const ok = await runTool(process.execPath, ['-e', 'console.log("hi")'], 10_000);
    expect(ok.stdout.trim()).toBe('hi');
  });

  it('waitHttp fails at once when the process exits before it serves', async () => {
    const group = new ProcessGroup();
    const child = group.start(process.execPath, ['-e', 'console.error("bad model"); process.exit(1)']);
    await expect(
      waitHttp('http://127.0.0.1:9/health', () => true, performance.now(), child, 60_000),
    ).rejects.toThrow(/exited before ready:\nbad model/);
  });
});
