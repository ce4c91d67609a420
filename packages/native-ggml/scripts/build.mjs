// Builds the addon and the stock upstream tools. CPU by default; CUDA only when asked with
// HYDRA_CUDA=1 (an installed nvcc is no reason: CI has nvcc and no GPU). HYDRA_CUDA_ARCHS picks the
// CUDA architectures (default 90, the H200). The CUDA build goes to build-cuda/, the CPU build to
// build/, so the loader can prefer one and fall back to the other.
import { execFileSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { createRequire } from 'node:module';
import { availableParallelism } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { prepareUpstream } from './upstream.mjs';

const pkgDir = join(dirname(fileURLToPath(import.meta.url)), '..');
const require = createRequire(import.meta.url);
const cuda = process.env.HYDRA_CUDA === '1';
const outDir = join(pkgDir, cuda ? 'build-cuda' : 'build');
const jobs = String(Number(process.env.HYDRA_BUILD_JOBS) || availableParallelism());

prepareUpstream();

const defines = [
  `--CDNODE_ADDON_API_DIR=${dirname(require.resolve('node-addon-api/package.json'))}`,
  `--CDGGML_NATIVE=${process.env.HYDRA_NATIVE_CPU === '0' ? 'OFF' : 'ON'}`,
];
if (cuda) {
  defines.push('--CDGGML_CUDA=ON', `--CDCMAKE_CUDA_ARCHITECTURES=${process.env.HYDRA_CUDA_ARCHS ?? '90'}`);
}

const cmakeJs = join(dirname(require.resolve('cmake-js/package.json')), 'bin', 'cmake-js');
const started = Date.now();
console.error(`hydra native-ggml: building ${cuda ? 'CUDA' : 'CPU'} into ${outDir} with ${jobs} jobs`);
execFileSync(process.execPath, [cmakeJs, 'compile', '--out', outDir, '--parallel', jobs, ...defines], {
  cwd: pkgDir,
  stdio: 'inherit',
});
const addon = join(outDir, 'bin', 'hydra_ggml.node');
if (!existsSync(addon)) {
  console.error(`hydra native-ggml: the build finished but ${addon} is missing`);
  process.exit(1);
}
console.error(`hydra native-ggml: built ${addon} in ${((Date.now() - started) / 1000).toFixed(0)} s`);
