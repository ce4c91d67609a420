import { execFileSync } from 'node:child_process';
import {
  copyFileSync,
  existsSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  renameSync,
  rmSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { basename, join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { inflateSync } from 'node:zlib';
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

/** Chromium's --screenshot of `url` (the top `height` px of the page at 1400 px wide) into `png`. */
function screenshot(chromium: string, url: string, png: string, height = 2000): void {
  for (let attempt = 0; attempt < 5 && !existsSync(png); attempt++) {
    execFileSync(
      chromium,
      [
        '--headless',
        '--no-sandbox',
        '--disable-gpu',
        '--disable-dev-shm-usage',
        '--hide-scrollbars',
        '--virtual-time-budget=5000',
        `--window-size=1400,${height}`,
        `--screenshot=${png}`,
        url,
      ],
      { timeout: 60_000, stdio: 'ignore' },
    );
  }
}

/** Decodes an 8-bit RGB or RGBA, non-interlaced PNG (what Chromium writes) into RGBA rows. */
function decodePng(buf: Buffer): { width: number; height: number; rgba: Uint8Array } {
  let pos = 8;
  let width = 0;
  let height = 0;
  let channels = 0;
  const idat: Buffer[] = [];
  while (pos < buf.length) {
    const len = buf.readUInt32BE(pos);
    const type = buf.toString('ascii', pos + 4, pos + 8);
    const body = buf.subarray(pos + 8, pos + 8 + len);
    if (type === 'IHDR') {
      width = body.readUInt32BE(0);
      height = body.readUInt32BE(4);
      if (body[8] !== 8 || body[12] !== 0) throw new Error('only 8-bit non-interlaced PNGs');
      channels = body[9] === 6 ? 4 : body[9] === 2 ? 3 : 0;
      if (!channels) throw new Error(`PNG colour type ${body[9]} not handled`);
    } else if (type === 'IDAT') idat.push(body);
    pos += 12 + len;
  }
  const raw = inflateSync(Buffer.concat(idat));
  const stride = width * channels;
  const rows = new Uint8Array(height * stride);
  for (let y = 0; y < height; y++) {
    const filter = raw[y * (stride + 1)]!;
    const src = y * (stride + 1) + 1;
    for (let x = 0; x < stride; x++) {
      const a = x >= channels ? rows[y * stride + x - channels]! : 0;
      const b = y > 0 ? rows[(y - 1) * stride + x]! : 0;
      const c = x >= channels && y > 0 ? rows[(y - 1) * stride + x - channels]! : 0;
      const p = a + b - c;
      const pred =
        filter === 1
          ? a
          : filter === 2
            ? b
            : filter === 3
              ? (a + b) >> 1
              : filter === 4
                ? Math.abs(p - a) <= Math.abs(p - b) && Math.abs(p - a) <= Math.abs(p - c)
                  ? a
                  : Math.abs(p - b) <= Math.abs(p - c)
                    ? b
                    : c
                : 0;
      rows[y * stride + x] = (raw[src + x]! + pred) & 0xff;
    }
  }
  const rgba = new Uint8Array(width * height * 4);
  for (let i = 0; i < width * height; i++) {
    for (let k = 0; k < 3; k++) rgba[i * 4 + k] = rows[i * channels + k]!;
    rgba[i * 4 + 3] = channels === 4 ? rows[i * channels + 3]! : 255;
  }
  return { width, height, rgba };
}

/** Pixels of a screenshot region that are strongly coloured (chart lines and points, not text or grid). */
function colouredPixels(png: { width: number; rgba: Uint8Array }, y0: number, y1: number): number {
  let n = 0;
  for (let y = y0; y < y1; y++) {
    for (let x = 0; x < png.width; x++) {
      const i = (y * png.width + x) * 4;
      const r = png.rgba[i]!;
      const g = png.rgba[i + 1]!;
      const b = png.rgba[i + 2]!;
      if (Math.max(r, g, b) - Math.min(r, g, b) > 90) n++;
    }
  }
  return n;
}

/** The page as drawn: without its scripts, which inline every results file. */
const rendered = (dom: string) => dom.replace(/<script>[\s\S]*?<\/script>/g, '');

const attr = (dom: string, name: string) =>
  (new RegExp(`<body[^>]*\\s${name}="([^"]*)"`).exec(dom)?.[1] ?? '').replace(/&quot;/g, '"');

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
  let variantFile: string;
  let dom: string;
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
    // Headline fixtures: a GPU decode figure of a model no committed file has, two GPU runs (the
    // later one must be the row), a later CPU run (not judged against a GPU goal: not the row) and a
    // later superseded variant (file name -threads8: left out everywhere by default).
    const gpuRun = (
      day: string,
      samples: number[],
      gpus?: string[],
      extra: ReturnType<typeof makeFigure>[] = [],
    ) => {
      const r = newResult(
        'gpu',
        [
          makeFigure({
            name: 'SOLO decode 70b q4_0, engine HTTP stream',
            unit: 'tok/s',
            samples,
            anchor: { name: 'llama-bench tg128', unit: 'tok/s', samples: [160, 160, 160] },
          }),
          ...extra,
        ],
        [],
        undefined,
        new Date(day),
      );
      r.machine = { ...r.machine, gpus };
      return writeResult(r, results);
    };
    gpuRun('2027-01-01T10:00:00Z', [150, 150, 150], ['NVIDIA H200']);
    gpuRun('2027-01-02T10:00:00Z', [158, 158, 158], ['NVIDIA H200']);
    gpuRun('2027-01-03T10:00:00Z', [100, 100, 100]);
    const variant = gpuRun(
      '2027-01-04T10:00:00Z',
      [80, 80, 80],
      ['NVIDIA H200'],
      [makeFigure({ name: 'VARIANT-ONLY figure', unit: 'ms', samples: [1, 2, 3] })],
    );
    variantFile = basename(variant).replace(/\.json$/, '-threads8.json');
    renameSync(variant, join(results, variantFile));
    // One suite, one figure name, two models: two lines, not one.
    for (const [day, model, v] of [
      ['2026-11-05T10:00:00Z', '/m/model-a.gguf', 10],
      ['2026-11-06T10:00:00Z', '/m/model-b.gguf', 1000],
    ] as const) {
      writeResult(
        newResult(
          'two-models',
          [makeFigure({ name: 'A alone', unit: 'tok/s', samples: [v] })],
          [],
          { model },
          new Date(day),
        ),
        results,
      );
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

  it('draws every chart in headless Chromium, superseded variants left out', () => {
    const chromium = findChromium();
    if (!chromium) {
      throw new Error(
        "chromium not found: install Debian's package with `apt-get install -y chromium` (or set HYDRA_CHROMIUM)",
      );
    }
    dom = dumpDom(chromium, pathToFileURL(join(out, 'index.html')).href);
    const charts = Number(attr(dom, 'data-charts'));
    const keyCharts = Number(attr(dom, 'data-keycharts'));
    const drawn = JSON.parse(attr(dom, 'data-drawn') || '[]') as number[];
    const hidden = JSON.parse(attr(dom, 'data-hidden-files') || '[]') as string[];
    expect(attr(dom, 'data-variants')).toBe('hidden');
    // The variant suffixes of the brief, and none of the current runs.
    expect(hidden).toContain(variantFile);
    for (const f of [
      'device-h200-native-port-20261129g-threads8.json',
      'device-h200-native-port-20261129h-http-split-1.json',
      'device-h200-native-port-20261129i-http-argmax-2.json',
      'device-h200-native-port-20261129i-http-upstream.json',
      'device-h200-native-port-20261129i-no-cuda-graphs.json',
      'device-h200-native-port-20261129g-omp-passive.json',
      'device-h200-native-port-20261129j-8b.json',
      'second-context-20261129-191916-cpu2-one-runner-tiny.json',
      'device-h200-serving-20261201-hE-smoke.json',
    ])
      expect(hidden).toContain(f);
    for (const f of [
      'device-h200-serving-20261201a.json',
      'device-h200-native-port-20261129i.json',
      'hydra-rpc-port.json',
    ])
      expect(hidden).not.toContain(f);
    // One chart per suite and figure name over every current results file the page was built from.
    const all = readResults(results);
    const shown = all.filter((r) => !hidden.includes(r.file));
    const keys = new Set(shown.flatMap((r) => r.figures.map((f) => `${r.suite} :: ${f.name}`)));
    expect(keys.size).toBeGreaterThan(10);
    expect(charts).toBe(keys.size);
    expect(rendered(dom)).not.toContain('VARIANT-ONLY figure');
    // One sweep chart per family, from the latest run that has it (the two written above among them).
    const families = new Set(
      shown.flatMap((r) => r.figures.filter((f) => f.sweep).map((f) => `${r.suite} :: ${f.sweep!.family}`)),
    );
    expect(families.has('serving :: stall max gap') && families.has('serving :: stall TTFT')).toBe(true);
    expect(Number(attr(dom, 'data-sweeps'))).toBe(families.size);
    expect(drawn.length).toBe(keyCharts + charts + families.size);
    for (const n of drawn) expect(n).toBeGreaterThan(1000);
    expect(dom).toContain('serving: stall max gap');
    expect(dom).toContain('1024: 256 / 200');
    expect(rendered(dom)).not.toContain('128: 32');
    // The charts that matter, for the figures the committed results carry.
    for (const title of [
      'Decode, one stream through the HTTP API / llama-bench tg128',
      'Prefill 512 / llama-bench pp512',
      'Serving concurrency, 8b q4_0: aggregate decode vs streams',
      'Prefill stall, 8b q4_0: budget -&gt; max gap of running streams',
      'ggml-RPC decode: merged port / stock ggml-rpc-server',
      'COMBINE: head engine + peer engine',
    ])
      expect(dom).toContain(title);
    expect(keyCharts).toBeGreaterThanOrEqual(6);
    // A suite that ran two models draws a line per model.
    expect(dom).toContain('model-a: tok/s (median)');
    expect(dom).toContain('model-b: tok/s (median)');
  }, 90_000);

  it('heads the page with a table of the current figures against anchor and goal', () => {
    expect(dom).toBeTruthy();
    const rows = [
      ...dom.matchAll(/<tr class="hrow" data-goal="([^"]+)" data-key="([^"]+)">(.*?)<\/tr>/g),
    ].map((m) => ({
      goal: m[1],
      key: m[2],
      cells: [...m[3]!.matchAll(/<td[^>]*>(.*?)<\/td>/g)].map((c) => c[1]),
    }));
    expect(Number(attr(dom, 'data-headline'))).toBe(rows.length);
    // Every goal has rows for the figures present in the committed results.
    const goals = new Set(rows.map((r) => r.goal));
    for (const g of ['decode', 'prefill', 'rpc', 'concurrency', 'stall', 'combine'])
      expect(goals).toContain(g);
    for (const k of ['8b q4_0', '27b q4_0'])
      expect(rows.some((r) => r.goal === 'decode' && r.key === k)).toBe(true);
    expect(rows.some((r) => r.goal === 'concurrency' && r.key === '8b q4_0, 32 streams')).toBe(true);
    expect(rows.some((r) => r.goal === 'stall' && r.key === '8b q4_0, budget 256')).toBe(true);
    // The fixture: the later GPU run is the row; the CPU run and the variant are not.
    const row = rows.find((r) => r.goal === 'decode' && r.key === '70b q4_0');
    expect(row).toBeDefined();
    const text = row!.cells.join(' | ');
    expect(text).toContain('158 tok/s');
    expect(text).toContain('0.988x');
    expect(text).toContain('&gt;= 0.98x');
    expect(text).toContain('meets');
    expect(text).toContain('2027-01-02');
    expect(text).not.toContain(variantFile);
    // CPU rows are not judged against goals set for the H200.
    expect(dom).not.toMatch(/data-key="tiny q4_0, \d+ streams"/);
  });

  it('draws the headline and the first charts in a screenshot of the top of the page', () => {
    const chromium = findChromium();
    if (!chromium) throw new Error('chromium not found: apt-get install -y chromium');
    const png = join(dir, 'top.png');
    screenshot(chromium, pathToFileURL(join(out, 'index.html')).href, png);
    const img = decodePng(readFileSync(png));
    expect(img.width).toBe(1400);
    // Below the headline table (about 1000 px here), the first charts' coloured lines and points (the
    // table alone, with its coloured statuses, has about 2,400 such pixels; with the charts about 12,000).
    expect(colouredPixels(img, 0, img.height)).toBeGreaterThan(5000);
    // The goal statuses of the headline table are coloured text too: the top third is not blank.
    expect(colouredPixels(img, 0, Math.floor(img.height / 3))).toBeGreaterThan(200);
  }, 90_000);

  it('shows the superseded variants when asked (#variants)', () => {
    const chromium = findChromium();
    if (!chromium) throw new Error('chromium not found: apt-get install -y chromium');
    const all = dumpDom(chromium, `${pathToFileURL(join(out, 'index.html')).href}#variants`);
    expect(attr(all, 'data-variants')).toBe('shown');
    const keys = new Set(
      readResults(results).flatMap((r) => r.figures.map((f) => `${r.suite} :: ${f.name}`)),
    );
    expect(Number(attr(all, 'data-charts'))).toBe(keys.size);
    expect(rendered(all)).toContain('VARIANT-ONLY figure');
    // The headline stays on current runs.
    const row = /data-key="70b q4_0">(.*?)<\/tr>/.exec(all)?.[1] ?? '';
    expect(row).toContain('158 tok/s');
    expect(row).not.toContain('80.0 tok/s');
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
    expect(attr(dom, 'data-headline')).toBe('0');
    const png = join(dir, 'empty.png');
    screenshot(chromium, pathToFileURL(join(empty, 'index.html')).href, png);
    expect(colouredPixels(decodePng(readFileSync(png)), 0, 2000)).toBeLessThan(200);
  }, 90_000);
});
