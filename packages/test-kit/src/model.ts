import { existsSync, mkdirSync, mkdtempSync, renameSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { writeSyntheticModel } from '@hydra-engine/native-ggml/synth';

/**
 * The tiny synthetic llama model (q8_0, seed 3). `shared`: written once per machine and reused by
 * every suite (its folder must then not be written to); otherwise a fresh file in its own folder,
 * beside which a test may write variants.
 */
export async function tinyModel(options: { shared?: boolean } = {}): Promise<string> {
  const spec = { arch: 'llama', shape: 'tiny', quant: 'q8_0', seed: 3 } as const;
  if (!options.shared) {
    const out = join(mkdtempSync(join(tmpdir(), 'hydra-engine-test-')), 'tiny.gguf');
    await writeSyntheticModel({ ...spec, out });
    return out;
  }
  const dir = join(tmpdir(), 'hydra-reliability');
  mkdirSync(dir, { recursive: true });
  const out = join(dir, 'tiny-q8_0-seed3.gguf');
  if (existsSync(out)) return out;
  // Written aside and renamed, so a suite running at the same time never reads half a file.
  const partial = `${out}.${process.pid}.part`;
  await writeSyntheticModel({ ...spec, out: partial });
  renameSync(partial, out);
  return out;
}
