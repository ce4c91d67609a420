// GPU figures of the native boundary and the merged port, each against its upstream anchor measured
// in the same run on the same machine (benchmarks/README.md; `node benchmarks/gpu/bundle.mjs` makes
// dist/gpu/native-port.cjs, run on the device machine after build.sh; --help lists the flags). The
// code is TypeScript in benchmarks/src/gpu-bench/native-port/ over the shared harness; this entry
// hands it the resolver's split planner and the engine's GGUF reader, which the benchmarks package
// does not depend on.
import { readGgufFile } from '../../apps/engine/dist/placement.js';
import { modelFactsFromGguf, planSplit } from '../../packages/resolver/dist/index.js';
import { main } from '../dist/gpu-bench/native-port/main.js';

const planner = {
  factsOf: async (path) => modelFactsFromGguf(await readGgufFile(path)),
  planSplit,
};

main(process.argv.slice(2), import.meta.url, planner).then(
  (code) => process.exit(code),
  (err) => {
    console.error(err);
    process.exit(1);
  },
);
