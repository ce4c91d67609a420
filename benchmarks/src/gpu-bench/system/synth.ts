import { existsSync, statSync } from 'node:fs';
import { planSyntheticModel, type SynthShape, writeSyntheticModel } from '@hydra-engine/native-ggml/synth';
import type { Part } from '../harness/index.js';
import type { BenchArch, SystemContext } from './context.js';

/** Writes the benchmark models (kept when present at their planned size). */
export const synth: Part<SystemContext> = {
  name: 'synth',
  estimateS: 150,
  async run(c) {
    const { opts, h } = c;
    const want: (readonly [BenchArch, string])[] = [
      ...opts.shapes.map((s) => ['llama', s] as const),
      ['moe', opts.moeShape],
      ...opts.hybridShapes,
    ];
    want.push(['llama', opts.rpcShape], ['llama', opts.loadShape]);
    if (opts.only.includes('combine')) for (const s of opts.combineShapes) want.push(['llama', s]);
    const seen = new Set<string>();
    for (const [arch, shape] of want) {
      const path = c.modelPath(arch, shape);
      if (seen.has(path)) continue;
      seen.add(path);
      const plan = planSyntheticModel({ arch, shape: shape as SynthShape, quant: 'q4_0' });
      if (existsSync(path) && statSync(path).size === plan.bytes) {
        h.log(`synth ${arch} ${shape}: present (${(plan.bytes / 1e9).toFixed(2)} GB)`);
        continue;
      }
      let lastLog = 0;
      const r = await writeSyntheticModel({
        arch,
        shape: shape as SynthShape,
        quant: 'q4_0',
        seed: 1,
        out: path,
        onProgress: (p) => {
          if (Date.now() - lastLog > 5000) {
            lastLog = Date.now();
            h.log(
              `synth ${arch} ${shape}: ${((100 * p.bytesWritten) / p.totalBytes).toFixed(0)}% of ${(p.totalBytes / 1e9).toFixed(2)} GB`,
            );
          }
        },
      });
      h.log(`synth ${arch} ${shape}: wrote ${(r.bytes / 1e9).toFixed(2)} GB in ${r.seconds.toFixed(1)} s`);
      c.notes.models[`${arch}-${shape}`] = { bytes: r.bytes, params: r.nParams, synth_seconds: r.seconds };
    }
  },
};
