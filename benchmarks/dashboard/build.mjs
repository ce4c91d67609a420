// `pnpm dashboard`: builds benchmarks/dist/dashboard/index.html, one self-contained page (uPlot, its
// CSS, the page script and every results file inlined) that opens from file:// with no server.
// Flags: --results DIR (default benchmarks/results), --out DIR (default benchmarks/dist/dashboard).
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { readResults } from '../dist/results.js';

const here = dirname(fileURLToPath(import.meta.url));
const args = process.argv.slice(2);
const flag = (name, fallback) => {
  const i = args.indexOf(name);
  return i >= 0 && args[i + 1] ? resolve(args[i + 1]) : fallback;
};
const resultsDir = flag('--results', join(here, '..', 'results'));
const outDir = flag('--out', join(here, '..', 'dist', 'dashboard'));

const require = createRequire(import.meta.url);
const uplotDir = dirname(require.resolve('uplot/package.json'));
const uplotJs = readFileSync(join(uplotDir, 'dist', 'uPlot.iife.min.js'), 'utf8');
const uplotCss = readFileSync(join(uplotDir, 'dist', 'uPlot.min.css'), 'utf8');
const app = readFileSync(join(here, 'app.js'), 'utf8');
const results = readResults(resultsDir);
// </script> inside inlined JSON would end the script element early.
const data = JSON.stringify(results).replace(/</g, '\\u003c');

const html = `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>Hydra engine benchmarks</title>
<style>${uplotCss}
body { font: 14px system-ui, sans-serif; margin: 24px; color: #222; background: #fff; }
h1 { font-size: 20px; margin: 0 0 4px; } h2 { font-size: 17px; margin: 28px 0 6px; }
.chart { display: inline-block; margin: 8px 16px 16px 0; vertical-align: top; width: 560px; }
.chart h3 { font-size: 13px; font-weight: 600; margin: 0 0 4px; }
.meta { color: #666; font-size: 12px; max-width: 900px; }
.chart .meta { max-width: 560px; }
.uplot .u-legend { font-size: 11px; text-align: left; }
table { border-collapse: collapse; font-size: 12px; } td, th { border: 1px solid #ddd; padding: 2px 6px; text-align: left; vertical-align: top; }
table.headline th { background: #f3f3f3; }
table.headline td.goalname { font-weight: 600; max-width: 230px; }
table.headline td.goalname .src { font-weight: 400; color: #666; font-size: 11px; }
table.headline td.num, table.headline td.goal, table.headline td.commit { white-space: nowrap; }
table.headline td.num { text-align: right; font-variant-numeric: tabular-nums; }
table.headline td.ok { color: #1e7b34; font-weight: 600; } table.headline td.bad { color: #b3261e; font-weight: 600; }
table.headline td.file { color: #555; font-size: 11px; }
details.suite > summary { font-size: 16px; font-weight: 600; margin: 20px 0 4px; cursor: pointer; }
</style>
</head>
<body>
<h1>Hydra engine benchmarks: how fast, against what</h1>
<p class="meta">Current figures (latest run of each, superseded experiment runs left out) against the anchor
measured in the same run and the goal they are held to. Ratio = our median / anchor median. Built
${new Date().toISOString()} from ${results.length} results file(s).</p>
<div id="headline"></div>
<h2>The charts that matter</h2>
<div id="key"></div>
<h2>Every figure, by suite</h2>
<p class="meta">One chart per figure over runs (x: run, labelled by commit), one line per model, its anchor
dashed, its limit where one applies. <label><input type="checkbox" id="show-variants"> show superseded
experiment runs</label></p>
<div id="charts"></div>
<h2>Runs</h2>
<div id="runs"></div>
<script>${uplotJs}</script>
<script>window.HYDRA_RESULTS = ${data};</script>
<script>${app}</script>
</body>
</html>
`;
mkdirSync(outDir, { recursive: true });
const out = join(outDir, 'index.html');
writeFileSync(out, html);
console.error(`dashboard: ${results.length} results file(s) -> ${out}`);
