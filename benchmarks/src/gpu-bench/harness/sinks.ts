import { join } from 'node:path';
import { newResult, resultFileName, writeResult } from '../../results.js';
import type { Figure } from '../../schema.js';
import type { ResultSink } from './harness.js';

/** A results file of the schema (suite `suite`) in `dir`, rewritten on every save. */
export function schemaSink(suite: string, dir: string, started: Date): ResultSink<Figure> {
  return {
    write({ figures, skipped, notes }) {
      const r = newResult(suite, [...figures], [...skipped], notes, started);
      writeResult(r, dir);
      return join(dir, resultFileName(r));
    },
  };
}

/** One schema figure's progress line. */
export function describeFigure(f: Figure): string {
  const a = f.anchor
    ? ` | anchor ${f.anchor.median.toPrecision(4)} ${f.anchor.unit} (x${f.ratio?.toFixed(3)})`
    : '';
  return `${f.name}: ${f.median.toPrecision(4)} ${f.unit}${a}`;
}
