// One context's decode rate as other contexts of the same process come and go, against the same
// context alone (benchmarks/README.md; what the runs found is in docs/decisions.md, 2026-11-29).
// The code is TypeScript in benchmarks/src/gpu-bench/second-context/. Usage (bundle.mjs makes
// dist/gpu/second-context.cjs; on the GPU machine after build.sh, with the unpacked test carry):
//   node benchmarks/dist/gpu/second-context.cjs --model FILE [--threads 16] [--tokens 128] [--out FILE]
//        [--bin packages/native-ggml/build-cuda/bin]
import { main } from '../dist/gpu-bench/second-context/main.js';

main(process.argv.slice(2)).then(
  (code) => process.exit(code),
  (err) => {
    console.error(err);
    process.exit(1);
  },
);
