import { mkdirSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

/** Where each test file leaves the figures it measured (docs/reliability.md quotes them). */
export const FIGURES_DIR =
  process.env.HYDRA_RELIABILITY_FIGURES ?? join(tmpdir(), 'hydra-reliability', 'figures');

/** Records the figures of one test file: printed for the CI log and written as JSON. */
export function recordFigures(name: string, figures: Record<string, unknown>): void {
  mkdirSync(FIGURES_DIR, { recursive: true });
  const text = JSON.stringify({ name, at: new Date().toISOString(), ...figures }, null, 2);
  writeFileSync(join(FIGURES_DIR, `${name}.json`), `${text}\n`);
  console.log(`FIGURES ${name} ${JSON.stringify(figures)}`);
}
