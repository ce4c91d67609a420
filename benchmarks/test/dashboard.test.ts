import { execFileSync } from 'node:child_process';
import { copyFileSync, existsSync, mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { newResult, readResults, writeResult } from '../src/results.js';
import { makeFigure } from '../src/schema.js';

const here = new URL('.', import.meta.url).pathname;

/**
 * The page's DOM after headless Chromium ran its scripts. On a loaded 2-core machine Chromium now
 * and then exits before the page finished; retries tell that apart from a page that never draws.
 */
function dumpDom(chromium: string, url: string): string {
  let dom = '';
  for (let attempt = 0; attempt < 5 && !dom.includes('data-charts='); attempt++) {
    dom = execFileSync(
      chromium,
      [
        '--headless',
        '--no-sandbox',
        '--disable-gpu',
        '--disable-dev-shm-usage',
        '--virtual-time-budget=5000',
        '--dump-dom',
        url,
      ],
      { encoding: 'utf8', timeout: 60_000, stdio: ['ignore', 'pipe', 'ignore'] },
    );
  }
  return dom;
}
const pkg = join(here, '..');

// Debian's `chromium` package (apt-get install -y chromium). Its absence fails the test: CI must
// install it; HYDRA_CHROMIUM names another binary.
function findChromium(): string | undefined {
  if (process.env.HYDRA_CHROMIUM) return process.env.HYDRA_CHROMIUM;
  for (const name of ['chromium', 'chromium-browser', 'google-chrome']) {
    try {
      return execFileSync('which', [name], { encoding: 'utf8' }).trim();
    } catch {
      // try the next name
    }
  }
  return undefined;
}

describe('dashboard', () => {
  let dir: string;
  let results: string;
  let out: string;
  beforeAll(() => {
    dir = mkdtempSync(join(tmpdir(), 'hydra-dash-'));
    results = join(dir, 'results');
    out = join(dir, 'out');
    // The committed results (legacy shapes included) plus two runs of a GPU-like suite with a limit.
    writeResult(newResult('micro', []), results);
    for (const f of readdirSync(join(pkg, 'results')).filter((n) => n.endsWith('.json'))) {
      copyFileSync(join(pkg, 'results', f), join(results, f));
    }
    for (const [i, day] of ['2026-11-01T10:00:00Z', '2026-11-02T10:00:00Z'].entries()) {
      const fig = makeFigure({
        name: 'SOLO decode 8b q4_0, engine HTTP stream',
        unit: 'tok/s',
        samples: [150 + i, 152 + i, 149 + i],
        anchor: { name: 'llama-bench tg128', unit: 'tok/s', samples: [160, 161, 159] },
        limit: { name: 'bandwidth bound', unit: 'tok/s', value: 1062 },
      });
      writeResult(newResult('gpu', [fig], [], undefined, new Date(day)), results);
    }
    // Two runs of a budget sweep: the page must draw the later one's points (64, 256, 1024).
    for (const [day, budgets] of [
      ['2026-11-03T10:00:00Z', [64, 128]],
      ['2026-11-04T10:00:00Z', [64, 256, 1024]],
    ] as const) {
      const sweepFigs = budgets.flatMap((b) =>
        ['max gap', 'TTFT'].map((family) =>
          makeFigure({
            name: `stall ${family}, budget ${b}`,
            unit: 'ms',
            samples: [family === 'TTFT' ? 400 + 4000 / b : b / 4],
            anchor: { name: 'llama-server', unit: 'ms', samples: [family === 'TTFT' ? 1000 : 200] },
            sweep: { family: `stall ${family}`, key: 'budget (n_batch)', value: b },
          }),
        ),
      );
      writeResult(newResult('serving', sweepFigs, [], undefined, new Date(day)), results);
    }
    execFileSync(
      process.execPath,
      [join(pkg, 'dashboard', 'build.mjs'), '--results', results, '--out', out],
      {
        stdio: 'ignore',
      },
    );
  }, 60_000);
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  it('builds one self-contained page with uPlot and every results file inlined', async () => {
    const { readFileSync } = await import('node:fs');
    const html = readFileSync(join(out, 'index.html'), 'utf8');
    expect(html).toContain('uPlot');
    expect(html).toContain('hydra-status-round-trip-latency');
    expect(html).toContain('SOLO decode 8b q4_0');
    expect(html).not.toMatch(/<script src=/);
  });

  it('draws every chart in headless Chromium', () => {
    const chromium = findChromium();
    if (!chromium) {
      throw new Error(
        "chromium not found: install Debian's package with `apt-get install -y chromium` (or set HYDRA_CHROMIUM)",
      );
    }
    const dom = dumpDom(chromium, pathToFileURL(join(out, 'index.html')).href);
    const charts = Number(/data-charts="(\d+)"/.exec(dom)?.[1]);
    const drawn = JSON.parse(
      (/data-drawn="([^"]*)"/.exec(dom)?.[1] ?? '[]').replace(/&quot;/g, '"'),
    ) as number[];
    // One chart per suite and figure name over every results file the page was built from.
    const keys = new Set(
      readResults(results).flatMap((r) => r.figures.map((f) => `${r.suite} :: ${f.name}`)),
    );
    expect(keys.size).toBeGreaterThan(10);
    expect(charts).toBe(keys.size);
    expect(drawn.length).toBeGreaterThanOrEqual(charts);
    for (const n of drawn) expect(n).toBeGreaterThan(1000);
    // One sweep chart per family, from the latest run that has it (the two written above among them).
    const families = new Set(
      readResults(results).flatMap((r) =>
        r.figures.filter((f) => f.sweep).map((f) => `${r.suite} :: ${f.sweep!.family}`),
      ),
    );
    expect(families.has('serving :: stall max gap') && families.has('serving :: stall TTFT')).toBe(true);
    expect(Number(/data-sweeps="(\d+)"/.exec(dom)?.[1])).toBe(families.size);
    expect(drawn.length).toBe(charts + families.size);
    expect(dom).toContain('serving: stall max gap');
    expect(dom).toContain('1024: 256 / 200');
    expect(dom).not.toContain('128: 32');
  }, 90_000);

  it('is not fooled by an empty page: no results, no charts', () => {
    const chromium = findChromium();
    if (!chromium) throw new Error('chromium not found: apt-get install -y chromium');
    const empty = join(dir, 'empty');
    execFileSync(
      process.execPath,
      [join(pkg, 'dashboard', 'build.mjs'), '--results', join(dir, 'none'), '--out', empty],
      { stdio: 'ignore' },
    );
    expect(existsSync(join(empty, 'index.html'))).toBe(true);
    const dom = dumpDom(chromium, pathToFileURL(join(empty, 'index.html')).href);
    expect(/data-charts="(\d+)"/.exec(dom)?.[1]).toBe('0');
  }, 90_000);
});
