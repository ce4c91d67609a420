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
import { runWithProgress } from './progress.mjs';
import { prepareUpstream } from './upstream.mjs';

const pkgDir = join(dirname(fileURLToPath(import.meta.url)), '..');
const require = createRequire(import.meta.url);
const cuda = process.env.HYDRA_CUDA === '1';
const outDir = join(pkgDir, cuda ? 'build-cuda' : 'build');
const jobs = String(Number(process.env.HYDRA_BUILD_JOBS) || availableParallelism());

prepareUpstream();

const defines = [
  `--CDNODE_ADDON_API_DIR=${dirname(require.resolve('node-addon-api/package.json'))}`,
  // Explicit both ways: a build folder configured before the default changed has OFF in its cache.
  `--CDHYDRA_SERVER_TOOLS=${process.env.HYDRA_SERVER_TOOLS === '0' ? 'OFF' : 'ON'}`,
];
// -march=native is off by default: on this project's VMs the CPU advertises AMX, which the
// hypervisor does not enable, and q8_0 weights then die of SIGILL in ggml's AMX path. The portable
// x86-64-v3 set (AVX2, FMA, F16C, BMI2) runs everywhere CI and the device machine do.
if (process.env.HYDRA_NATIVE_CPU === '1') {
  defines.push(
    '--CDGGML_NATIVE=ON',
    '--CDGGML_AMX_TILE=OFF',
    '--CDGGML_AMX_INT8=OFF',
    '--CDGGML_AMX_BF16=OFF',
  );
} else {
  defines.push(
    '--CDGGML_NATIVE=OFF',
    '--CDGGML_AVX=ON',
    '--CDGGML_AVX2=ON',
    '--CDGGML_FMA=ON',
    '--CDGGML_F16C=ON',
    '--CDGGML_BMI2=ON',
  );
}
if (cuda) {
  defines.push('--CDGGML_CUDA=ON', `--CDCMAKE_CUDA_ARCHITECTURES=${process.env.HYDRA_CUDA_ARCHS ?? '90'}`);
}

const cmakeJs = join(dirname(require.resolve('cmake-js/package.json')), 'bin', 'cmake-js');
const started = Date.now();
console.error(`hydra native-ggml: building ${cuda ? 'CUDA' : 'CPU'} into ${outDir} with ${jobs} jobs`);
// configure every time (cheap) so that changed options reach the cache; then an incremental build.
execFileSync(process.execPath, [cmakeJs, 'configure', '--out', outDir, ...defines], {
  cwd: pkgDir,
  stdio: 'inherit',
});
// A progress line every HYDRA_BUILD_PROGRESS_S seconds (default 30): a cold CUDA build takes minutes.
await runWithProgress(process.execPath, [cmakeJs, 'build', '--out', outDir, '--parallel', jobs], {
  cwd: pkgDir,
  label: 'hydra native-ggml: building',
  intervalMs: 1000 * (Number(process.env.HYDRA_BUILD_PROGRESS_S) || 30),
}).catch((err) => {
  console.error(err.message);
  process.exit(1);
});
const addon = join(outDir, 'bin', 'hydra_ggml.node');
if (!existsSync(addon)) {
  console.error(`hydra native-ggml: the build finished but ${addon} is missing`);
  process.exit(1);
}
console.error(`hydra native-ggml: built ${addon} in ${((Date.now() - started) / 1000).toFixed(0)} s`);
