// The serving benchmarks (benchmarks/README.md, "Serving benchmark"): the engine driven over HTTP as
// a black box, against upstream llama-server and llama-batched-bench of the same pin in the same
// run. `node benchmarks/gpu/serving.mjs` from a built checkout, or the bundle
// `benchmarks/dist/gpu/serving.cjs`. The code is TypeScript in benchmarks/src/gpu-bench/serving/.
import { main } from '../dist/gpu-bench/serving/main.js';

main(process.argv.slice(2), import.meta.url).then(
  (code) => process.exit(code),
  (err) => {
    console.error(err);
    process.exit(1);
  },
);
