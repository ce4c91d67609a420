// Here (not on the device): bundles what the device machine runs into .carry/js/ (git-ignored),
// since node_modules does not travel: the engine CLI, its two worker modules, and bench.mjs.
import { mkdirSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { build } from '../../apps/engine/node_modules/esbuild/lib/main.js';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const out = join(root, '.carry', 'js');
mkdirSync(out, { recursive: true });
const common = {
  bundle: true,
  platform: 'node',
  target: 'node20',
  format: 'cjs',
  define: { 'import.meta.url': '__hydra_meta_url' },
  banner: { js: 'var __hydra_meta_url = require("node:url").pathToFileURL(__filename).href;' },
  external: ['msgpackr-extract', '@napi-rs/nice'],
  logLevel: 'warning',
};
const { readFileSync, realpathSync } = await import('node:fs');
const renamePiscinaWorker = {
  name: 'piscina-worker-name',
  setup(b) {
    b.onLoad({ filter: /piscina[\\/]dist[\\/]index\.js$/ }, (args) => ({
      contents: readFileSync(args.path, 'utf8').replace("'worker.js'", "'piscina-worker.cjs'"),
      loader: 'js',
    }));
  },
};
await build({
  ...common,
  entryPoints: [join(root, 'apps/engine/dist/cli.js')],
  outfile: join(out, 'cli.cjs'),
  plugins: [renamePiscinaWorker],
});
const piscina = realpathSync(join(root, 'packages/hydra-rpc/node_modules/piscina'));
await build({
  ...common,
  entryPoints: [join(piscina, 'dist/worker.js')],
  outfile: join(out, 'piscina-worker.cjs'),
});
// native-ggml's rpcWorkerPath is ./rpc-worker.js beside the bundle that imports it.
await build({
  ...common,
  entryPoints: [join(root, 'packages/native-ggml/dist/rpc-worker.js')],
  outfile: join(out, 'rpc-worker.js'),
});
await build({
  ...common,
  entryPoints: [join(root, 'scripts/device/bench.mjs')],
  outfile: join(out, 'bench.cjs'),
});
console.error(`pack: bundles in ${out}`);
