// Writes benchmarks/dist/gpu/ (git-ignored, outside biome's reach): the GPU benchmark and the engine as CommonJS bundles
// that need neither node_modules nor a build on the device machine, only a node binary.
//   run.cjs             benchmarks/gpu/run.mjs with hydra-rpc, native-ggml/synth and the schema
//   native-port.cjs     benchmarks/gpu/native-port.mjs: the native boundary and merged port vs upstream
//   second-context.cjs  benchmarks/gpu/second-context.mjs: the probe of the second-context drop
//   serving.cjs         benchmarks/gpu/serving.mjs: prefill stall and concurrency vs llama-server
//   rpc-breakdown.mjs   apps/engine/bench/rpc-breakdown-bench.mjs: the per-token ggml-RPC breakdown
//   combine-failover.mjs apps/engine/bench/combine-failover-bench.mjs: failover and rejoin times
//   spec-draft.mjs      apps/engine/bench/spec-draft-bench.mjs: speculative decoding vs llama-server -md
//   fit-check.mjs       apps/engine/bench/fit-check-bench.mjs: PLAN's fit against what a load allocated
//                       (ES modules: both await at top level, which CommonJS cannot)
//   cli.cjs             apps/engine/dist/cli.js (the hydra-engine CLI)
//   rpc-host.js         native-ggml's ggml-RPC host process (the merged port's pool), where the bundled wrapper looks for it
//   rpc-worker.js       its worker thread, where the bundled host looks for it
// Run after `pnpm build` (it bundles the tsc output).
import { mkdirSync, realpathSync, rmSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { build } from 'esbuild';
import { commonOptions } from '../../apps/engine/scripts/bundle-options.mjs';

const here = dirname(fileURLToPath(import.meta.url));
const root = join(here, '..', '..');
const out = join(here, '..', 'dist', 'gpu');
const pkgDir = (from, name) => realpathSync(join(from, 'node_modules', name));
const engineDir = join(root, 'apps/engine');
const nativeDir = pkgDir(engineDir, '@hydra-engine/native-ggml');

rmSync(out, { recursive: true, force: true });
mkdirSync(out, { recursive: true });
// .js files here are CommonJS whatever benchmarks/package.json says.
writeFileSync(join(out, 'package.json'), '{ "type": "commonjs" }\n');

const common = commonOptions;

await build({
  ...common,
  entryPoints: [join(here, 'run.mjs')],
  outfile: join(out, 'run.cjs'),
});
await build({
  ...common,
  entryPoints: [join(here, 'native-port.mjs')],
  outfile: join(out, 'native-port.cjs'),
});
await build({
  ...common,
  entryPoints: [join(here, 'second-context.mjs')],
  outfile: join(out, 'second-context.cjs'),
});
await build({
  ...common,
  entryPoints: [join(here, 'serving.mjs')],
  outfile: join(out, 'serving.cjs'),
});
for (const name of ['rpc-breakdown', 'combine-failover', 'spec-draft', 'fit-check']) {
  await build({
    ...common,
    format: 'esm',
    define: {},
    banner: {
      js: "import { createRequire as __hydra_cr } from 'node:module'; const require = __hydra_cr(import.meta.url);",
    },
    entryPoints: [join(engineDir, `bench/${name}-bench.mjs`)],
    outfile: join(out, `${name}.mjs`),
  });
}
await build({
  ...common,
  entryPoints: [join(engineDir, 'dist/cli.js')],
  outfile: join(out, 'cli.cjs'),
});
await build({
  ...common,
  entryPoints: [join(nativeDir, 'dist/rpc-host.js')],
  outfile: join(out, 'rpc-host.js'),
});
await build({
  ...common,
  entryPoints: [join(nativeDir, 'dist/rpc-worker.js')],
  outfile: join(out, 'rpc-worker.js'),
});
console.error(`bundle: wrote ${out}`);
