// The GPU system benchmark (benchmarks/README.md, "GPU system benchmark"): run it from a built
// checkout (`node benchmarks/gpu/run.mjs`) or as the bundle `node benchmarks/dist/gpu/run.cjs`
// that `node benchmarks/gpu/bundle.mjs` writes. The parts and the harness they share are
// TypeScript in benchmarks/src/gpu-bench/ (system/ and harness/), built by the package's build.
import { main } from '../dist/gpu-bench/system/main.js';

main(process.argv.slice(2), import.meta.url).then(
  (code) => process.exit(code),
  (err) => {
    console.error(err);
    process.exit(1);
  },
);
