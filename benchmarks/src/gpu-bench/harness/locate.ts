import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { repoRoot } from '../../results.js';

/** Where a benchmark finds the repository, the engine, the stock tools and the addon. */
export interface Locations {
  root: string;
  /** The folder of the entry script (the bundle's folder when bundled). */
  here: string;
  /** The stock tools' folder: `--tools`, else native-ggml's build-cuda/bin or build/bin holding `probe`. */
  toolsDir: string | undefined;
  /** The engine CLI: cli.cjs beside the bundle, benchmarks/dist/gpu/cli.cjs, or apps/engine/dist/cli.js. */
  engineCli: string | undefined;
}

export function locate(entryUrl: string, tools: string | undefined, probe: string): Locations {
  const here = dirname(fileURLToPath(entryUrl));
  const root = repoRoot(here);
  const nativeDir = join(root, 'packages/native-ggml');
  const toolsDir =
    tools ??
    [join(nativeDir, 'build-cuda/bin'), join(nativeDir, 'build/bin')].find((d) => existsSync(join(d, probe)));
  const engineCli = [
    join(here, 'cli.cjs'),
    join(root, 'benchmarks/dist/gpu/cli.cjs'),
    join(root, 'apps/engine/dist/cli.js'),
  ].find((p) => existsSync(p));
  return { root, here, toolsDir, engineCli };
}

/** The path of a stock tool; throws, naming where it looked, when it is missing. */
export function toolPath(toolsDir: string | undefined, name: string): string {
  const p = toolsDir && join(toolsDir, name);
  if (!p || !existsSync(p))
    throw new Error(
      `${name} not found (looked in ${toolsDir ?? 'packages/native-ggml/build{-cuda,}/bin'}); run benchmarks/gpu/build.sh`,
    );
  return p;
}
