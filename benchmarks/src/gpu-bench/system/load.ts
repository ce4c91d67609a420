import { execFileSync } from 'node:child_process';
import { closeSync, existsSync, openSync, readSync, writeFileSync } from 'node:fs';
import { makeFigure } from '../../schema.js';
import { metricValue, type Part, runTool } from '../harness/index.js';
import type { SystemContext } from './context.js';

/** Drops `file` from the page cache: drop_caches when writable (root), else fadvise DONTNEED via dd. */
function dropCache(file: string): string {
  try {
    execFileSync('sync');
    writeFileSync('/proc/sys/vm/drop_caches', '1');
    return 'drop_caches';
  } catch {
    execFileSync('dd', [`of=${file}`, 'oflag=nocache', 'conv=notrunc,fdatasync', 'count=0'], {
      stdio: 'ignore',
    });
    return 'dd oflag=nocache';
  }
}

function readFileThrough(path: string): void {
  const fd = openSync(path, 'r');
  try {
    const buf = Buffer.allocUnsafe(16 << 20);
    while (readSync(fd, buf, 0, buf.length, null) > 0);
  } finally {
    closeSync(fd);
  }
}

/** Warm and cold load of the load model: engine spawn to ready and hydra_model_load_seconds, against llama-simple -n 1. */
export const load: Part<SystemContext> = {
  name: 'load',
  estimateS: 60,
  async run(c) {
    const { opts, h } = c;
    const path = c.modelPath('llama', opts.loadShape);
    const label = `${opts.loadShape} q4_0`;
    if (!existsSync(path)) throw new Error(`${path} missing: run --only synth first`);
    const metric = async (url: string) =>
      metricValue(await (await fetch(`${url}/metrics`)).text(), 'hydra_model_load_seconds') * 1000;
    const simple = async () =>
      (
        await runTool(
          c.tool('llama-simple'),
          ['-m', path, '-n', '1', '-ngl', String(opts.ngl), 'hello'],
          600_000,
        )
      ).ms;
    for (const kind of ['warm', 'cold'] as const) {
      const reps = kind === 'warm' ? Math.max(2, opts.reps - 1) : opts.coldReps;
      if (reps === 0) {
        h.skip(`${kind} load ${label}`, '--cold-reps 0');
        continue;
      }
      const est = kind === 'warm' ? 30 * reps : 200 * reps;
      if (!h.within(est, `${kind} load ${label}`)) continue;
      if (kind === 'warm') readFileThrough(path); // page the file in once
      const ours: number[] = [];
      const engineLoad: number[] = [];
      const anchor: number[] = [];
      let method: string | undefined;
      for (let r = 0; r < reps; r++) {
        if (kind === 'cold') method = dropCache(path);
        h.log(`${kind} load ${label}: engine (${r + 1}/${reps})`);
        const eng = await c.startEngine(['-m', path, '-ngl', String(opts.ngl), '-c', '4096', '-np', '1'], {
          timeoutMs: 580_000,
        });
        ours.push(eng.readyMs);
        const m = await metric(eng.url);
        if (Number.isFinite(m)) engineLoad.push(m);
        await h.processes.stop(eng.child);
        if (kind === 'cold') dropCache(path);
        h.log(`${kind} load ${label}: llama-simple -n 1 (${r + 1}/${reps})`);
        anchor.push(await simple());
      }
      if (method) c.notes.cold_method = method;
      const anchorDef = {
        name: 'llama-simple -n 1 wall time (load + 1 token + exit), same cache state',
        unit: 'ms',
        samples: anchor,
      };
      h.add(
        makeFigure({
          name: `${kind} model load ${label}: engine spawn to ready`,
          unit: 'ms',
          samples: ours,
          anchor: anchorDef,
        }),
      );
      if (engineLoad.length)
        h.add(
          makeFigure({
            name: `${kind} model load ${label}: hydra_model_load_seconds`,
            unit: 'ms',
            samples: engineLoad,
            anchor: anchorDef,
          }),
        );
    }
  },
};
