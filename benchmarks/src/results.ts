import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { cpus, hostname, release, totalmem, type } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { HydraError } from '@hydra-engine/errors';
import {
  type BenchResult,
  type Figure,
  type Machine,
  normalizeResult,
  SCHEMA_VERSION,
  type Skipped,
} from './schema.js';

/** The repository root: the nearest folder above `from` with pnpm-workspace.yaml. */
export function repoRoot(from = dirname(fileURLToPath(import.meta.url))): string {
  let dir = resolve(from);
  while (!existsSync(join(dir, 'pnpm-workspace.yaml'))) {
    const up = dirname(dir);
    if (up === dir) throw new HydraError('HYDRA_ERR_BENCH_FAILED', `no pnpm-workspace.yaml above ${from}`);
    dir = up;
  }
  return dir;
}

/** benchmarks/results/ of this checkout. */
export function resultsDir(root = repoRoot()): string {
  return join(root, 'benchmarks', 'results');
}

/** The commit checked out at `root`; `HYDRA_BENCH_COMMIT` wins (the device machine may lack .git). */
export function gitCommit(root = repoRoot()): string {
  if (process.env.HYDRA_BENCH_COMMIT) return process.env.HYDRA_BENCH_COMMIT;
  try {
    const head = execFileSync('git', ['rev-parse', 'HEAD'], {
      cwd: root,
      encoding: 'utf8',
      stdio: ['ignore', 'pipe', 'ignore'],
    }).trim();
    const dirty = execFileSync('git', ['status', '--porcelain', '--untracked-files=no'], {
      cwd: root,
      encoding: 'utf8',
      stdio: ['ignore', 'pipe', 'ignore'],
    }).trim();
    return dirty ? `${head}-dirty` : head;
  } catch {
    return 'unknown';
  }
}

/** CPU, cores, memory, OS and Node of this machine, plus GPUs when `nvidia-smi` answers. */
export function machineInfo(): Machine {
  const m: Machine = {
    cpu: cpus()[0]?.model.trim() ?? 'unknown',
    cores: cpus().length,
    memory_gib: Math.round((totalmem() / 2 ** 30) * 10) / 10,
    os: `${type()} ${release()}`,
    node: process.version,
  };
  try {
    const out = execFileSync('nvidia-smi', ['--query-gpu=name', '--format=csv,noheader'], {
      encoding: 'utf8',
      stdio: ['ignore', 'pipe', 'ignore'],
      timeout: 10_000,
    });
    const gpus = out
      .split('\n')
      .map((s) => s.trim())
      .filter(Boolean);
    if (gpus.length > 0) m.gpus = gpus;
  } catch {
    // no NVIDIA driver: a CPU-only run
  }
  return m;
}

/** A short name for the machine in file names: the first GPU, else the host name. */
export function machineSlug(m: Machine): string {
  const base = m.gpus?.[0] ?? hostname();
  return (
    base
      .toLowerCase()
      .replace(/nvidia|geforce/g, '')
      .replace(/[^a-z0-9]+/g, '-')
      .replace(/^-|-$/g, '') || 'machine'
  );
}

/** `<suite>-<YYYYMMDD-HHMMSS>-<machine>.json`. */
export function resultFileName(r: Pick<BenchResult, 'suite' | 'date' | 'machine'>): string {
  const d = r.date.replace(/[-:]/g, '').replace('T', '-').slice(0, 15);
  return `${r.suite}-${d}-${machineSlug(r.machine)}.json`;
}

/** Assembles a result of the current schema with this machine and commit. */
export function newResult(
  suite: string,
  figures: Figure[],
  skipped: Skipped[] = [],
  notes?: Record<string, unknown>,
  date = new Date(),
): BenchResult {
  const r: BenchResult = {
    schema: SCHEMA_VERSION,
    suite,
    commit: gitCommit(),
    machine: machineInfo(),
    date: date.toISOString(),
    figures,
    skipped,
  };
  if (notes) r.notes = notes;
  return r;
}

/** Checks `result` against the schema and writes it into `dir`; returns the path. */
export function writeResult(result: BenchResult, dir = resultsDir()): string {
  const checked = normalizeResult(JSON.parse(JSON.stringify(result)), result.suite);
  mkdirSync(dir, { recursive: true });
  const path = join(dir, resultFileName(checked));
  writeFileSync(path, `${JSON.stringify(checked, null, 2)}\n`);
  return path;
}

/** Reads and normalizes every `*.json` of `dir`, oldest first; a bad file throws HYDRA_ERR_BAD_RESULT. */
export function readResults(dir = resultsDir()): (BenchResult & { file: string })[] {
  if (!existsSync(dir)) return [];
  const out: (BenchResult & { file: string })[] = [];
  for (const file of readdirSync(dir)
    .filter((f) => f.endsWith('.json'))
    .sort()) {
    let raw: unknown;
    try {
      raw = JSON.parse(readFileSync(join(dir, file), 'utf8'));
    } catch (cause) {
      throw new HydraError('HYDRA_ERR_BAD_RESULT', `${file}: not JSON`, { keys: [file], cause });
    }
    out.push({ ...normalizeResult(raw, file), file });
  }
  return out.sort((a, b) => Date.parse(a.date) - Date.parse(b.date));
}
