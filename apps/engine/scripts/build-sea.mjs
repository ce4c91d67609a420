// Builds dist/hydra-engine, a Node single executable application, from the tsc output in dist/:
// one CommonJS bundle injected into a copy of this node binary, with the native addon, its shared
// libraries and the ggml-RPC worker thread bundle beside it (ggml-RPC sessions are served by copies
// of the executable run as `hydra-engine rpc-host`, whose worker thread loads rpc-worker.cjs).
import { execFileSync } from 'node:child_process';
import {
  chmodSync,
  copyFileSync,
  existsSync,
  mkdirSync,
  readdirSync,
  realpathSync,
  rmSync,
  statSync,
  writeFileSync,
} from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { build } from 'esbuild';
import { commonOptions } from './bundle-options.mjs';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const dist = join(root, 'dist');
const work = join(dist, 'sea');
const pkgDir = (from, name) => realpathSync(join(from, 'node_modules', name));
const nativeDir = pkgDir(root, '@hydra-engine/native-ggml');
const addonDir = [join(nativeDir, 'build-cuda', 'bin'), join(nativeDir, 'build', 'bin')].find((d) =>
  existsSync(join(d, 'hydra_ggml.node')),
);
if (!addonDir) {
  console.error('build-sea: the native addon is not built; skipping the single executable');
  process.exit(0);
}
rmSync(work, { recursive: true, force: true });
mkdirSync(work, { recursive: true });

const common = commonOptions;
const banner = commonOptions.banner;
await build({
  ...common,
  entryPoints: [join(dist, 'cli.js')],
  outfile: join(work, 'main.cjs'),
  // msgpackr tries require('msgpackr-extract') (an optional native speed-up) when it loads: the
  // SEA main's require loads built-in modules only and prints Node's warning on every start.
  define: { ...common.define, 'process.env.MSGPACKR_NATIVE_ACCELERATION_DISABLED': '"true"' },
  banner: {
    js: `${banner.js}\nglobalThis.__HYDRA_SEA__ = true;\nif (!process.env.HYDRA_NATIVE_ADDON) process.env.HYDRA_NATIVE_ADDON = require("node:path").join(require("node:path").dirname(process.execPath), "hydra_ggml.node");`,
  },
});
await build({
  ...common,
  entryPoints: [join(nativeDir, 'dist', 'rpc-worker.js')],
  outfile: join(dist, 'rpc-worker.cjs'),
});

writeFileSync(
  join(work, 'sea-config.json'),
  JSON.stringify({
    main: join(work, 'main.cjs'),
    output: join(work, 'prep.blob'),
    disableExperimentalSEAWarning: true,
  }),
);
execFileSync(process.execPath, ['--experimental-sea-config', join(work, 'sea-config.json')], {
  stdio: 'inherit',
});
const exe = join(dist, 'hydra-engine');
rmSync(exe, { force: true });
copyFileSync(process.execPath, exe);
chmodSync(exe, 0o755);
const postject = join(pkgDir(root, 'postject'), 'dist', 'cli.js');
execFileSync(
  process.execPath,
  [
    postject,
    exe,
    'NODE_SEA_BLOB',
    join(work, 'prep.blob'),
    '--sentinel-fuse',
    'NODE_SEA_FUSE_fce680ab2cc467b6e072b8b5df1996b2',
  ],
  { stdio: 'inherit' },
);
// The addon and every shared library it loads (by soname, plus the dlopen'ed CPU backends).
for (const name of readdirSync(addonDir)) {
  if (name === 'hydra_ggml.node' || /^lib(ggml|llama)[^/]*\.so(\.\d+)?$/.test(name)) {
    if (name.startsWith('libllama-bench') || name.startsWith('libllama-common')) continue;
    const src = join(addonDir, name);
    if (statSync(src).isFile()) copyFileSync(src, join(dist, name));
  }
}
rmSync(work, { recursive: true, force: true });
console.error(`build-sea: wrote ${exe}`);
