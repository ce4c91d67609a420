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
h1 { font-size: 20px; } h2 { font-size: 16px; margin: 28px 0 4px; }
.chart { display: inline-block; margin: 8px 16px 16px 0; vertical-align: top; }
.chart h3 { font-size: 13px; font-weight: 600; margin: 0 0 4px; max-width: 560px; }
.meta { color: #666; font-size: 12px; max-width: 560px; }
table { border-collapse: collapse; font-size: 12px; } td, th { border: 1px solid #ddd; padding: 2px 6px; text-align: left; }
</style>
</head>
<body>
<h1>Hydra engine benchmarks</h1>
<p class="meta">Each chart: one figure over runs (x: run, labelled by commit), its anchor measured in the same run,
and the physical limit where one applies. Ratio = figure median / anchor median. Built ${new Date().toISOString()} from
${results.length} results file(s).</p>
<div id="runs"></div>
<div id="charts"></div>
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
