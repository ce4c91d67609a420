import { existsSync } from 'node:fs';
import { makeFigure } from '../../schema.js';
import type { Part } from '../harness/index.js';
import { type BenchArch, bytesPerToken, gpuNames, type SystemContext } from './context.js';

function bandwidthGbs(
  c: SystemContext,
  gpus: readonly string[],
): { value: number; source: string } | undefined {
  if (c.opts.bandwidthGbs) return { value: c.opts.bandwidthGbs, source: '--bandwidth-gbs' };
  if (gpus.some((g) => /H200/i.test(g)))
    return { value: 4800, source: 'NVIDIA H200 datasheet, 4.8 TB/s HBM3e' };
  if (gpus.some((g) => /H100/i.test(g)))
    return { value: 3350, source: 'NVIDIA H100 SXM datasheet, 3.35 TB/s' };
  return undefined;
}

/** Per model: decode and prefill through the engine's HTTP API against llama-bench pp512/tg128. */
export const solo: Part<SystemContext> = {
  name: 'solo',
  estimateS: 60,
  async run(c) {
    const { opts, h } = c;
    const bw = bandwidthGbs(c, gpuNames());
    c.notes.bandwidth = bw ?? 'unknown: pass --bandwidth-gbs for a limit line';
    const models: (readonly [BenchArch, string])[] = [
      ...opts.shapes.map((s) => ['llama', s] as const),
      ['moe', opts.moeShape],
      ...opts.hybridShapes,
    ];
    for (const [arch, shape] of models) {
      const path = c.modelPath(arch, shape);
      const label = `${arch === 'llama' ? '' : arch === 'moe' ? 'MoE ' : `${arch} `}${shape} q4_0`;
      if (!existsSync(path)) {
        h.skip(`solo ${label}`, `${path} missing: run --only synth first`);
        continue;
      }
      if (!h.within(shape === '27b' || shape === '35b-a3b' ? 90 : 45, `solo ${label}`)) continue;
      h.log(`solo ${label}: llama-bench -p 512 -n 128 -ngl ${opts.ngl} -r ${opts.reps}`);
      const anchor = await c.llamaBench(
        ['-m', path, '-p', '512', '-n', '128', '-ngl', String(opts.ngl), '-fa', '1', '-r', String(opts.reps)],
        300_000,
      );
      h.log(`solo ${label}: engine`);
      const eng = await c.startEngine(c.servingArgs(path));
      try {
        const { decode, prefill } = await c.httpRates(eng.url);
        const limit = bw && {
          name: `memory bandwidth bound: ${bw.value} GB/s / ${(bytesPerToken(arch, shape) / 1e9).toFixed(2)} GB per token`,
          unit: 'tok/s',
          value: (bw.value * 1e9) / bytesPerToken(arch, shape),
        };
        h.add(
          makeFigure({
            name: `SOLO decode ${label}, engine HTTP stream`,
            unit: 'tok/s',
            samples: decode,
            anchor: { name: 'llama-bench tg128 (local, same pin)', unit: 'tok/s', samples: anchor.tg },
            ...(limit ? { limit } : {}),
          }),
        );
        h.add(
          makeFigure({
            name: `SOLO prefill ${label}, engine HTTP (512-token prompt, time to first token)`,
            unit: 'tok/s',
            samples: prefill,
            anchor: { name: 'llama-bench pp512 (local, same pin)', unit: 'tok/s', samples: anchor.pp },
          }),
        );
      } finally {
        await h.processes.stop(eng.child);
      }
    }
  },
};
