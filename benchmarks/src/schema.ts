import { HydraError } from '@hydra-engine/errors';

/**
 * The one results format of every benchmark of this repository (benchmarks/README.md, "Results
 * format"). One JSON file per run and suite under benchmarks/results/.
 */
export const SCHEMA_VERSION = 1;

/** Where a run happened. */
export interface Machine {
  /** CPU model string (`os.cpus()[0].model`). */
  cpu: string;
  /** Logical CPUs. */
  cores: number;
  /** Total memory in GiB; null when a legacy file did not record it. */
  memory_gib: number | null;
  /** `os.type() os.release()` or a platform string. */
  os: string;
  /** `process.version`. */
  node: string;
  /** GPUs as `nvidia-smi` names them (absent on CPU-only runs). */
  gpus?: string[];
}

/** The figure a measurement is compared with, measured in the same run on the same machine. */
export interface Anchor {
  name: string;
  unit: string;
  median: number;
  p99?: number;
  samples?: number;
}

/** A physical bound the figure cannot beat (e.g. decode tok/s = memory bandwidth / model bytes). */
export interface Limit {
  name: string;
  unit: string;
  value: number;
}

/**
 * Where a figure sits in a parameter sweep of one run (e.g. the prefill budget): the dashboard draws
 * the figures of one `family` of the latest run against `value`.
 */
export interface Sweep {
  family: string;
  /** The swept parameter, as the x axis names it: `budget (n_batch)`. */
  key: string;
  value: number;
}

/** One measured quantity. */
export interface Figure {
  name: string;
  unit: string;
  samples: number;
  median: number;
  p99: number;
  mean: number;
  anchor: Anchor | null;
  /** `median / anchor.median`; null without an anchor. Read it with {@link Figure.better}. */
  ratio: number | null;
  /** Whether a larger value is better; derived from the unit when a file does not say. */
  better: 'higher' | 'lower';
  limit?: Limit;
  sweep?: Sweep;
}

/** A figure that could not be measured in this run, and why (not implemented, tool missing, ...). */
export interface Skipped {
  name: string;
  reason: string;
}

/** One results file. */
export interface BenchResult {
  schema: typeof SCHEMA_VERSION;
  /** What ran: `micro`, `gpu-solo`, `tiering-plan`, ... */
  suite: string;
  commit: string;
  machine: Machine;
  /** ISO 8601 start of the run. */
  date: string;
  figures: Figure[];
  skipped: Skipped[];
  /** Free-form facts about the run (models, flags, tool versions). */
  notes?: Record<string, unknown>;
}

/** Median, 99th percentile and mean of some samples (nearest-rank percentiles). */
export function summarize(samples: readonly number[]): {
  samples: number;
  median: number;
  p99: number;
  mean: number;
} {
  if (samples.length === 0) throw new HydraError('HYDRA_ERR_BENCH_FAILED', 'no samples to summarize');
  const sorted = [...samples].sort((a, b) => a - b);
  const rank = (q: number) =>
    sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil(q * sorted.length) - 1))]!;
  const mean = sorted.reduce((s, v) => s + v, 0) / sorted.length;
  const mid = sorted.length >> 1;
  const median = sorted.length % 2 === 1 ? sorted[mid]! : (sorted[mid - 1]! + sorted[mid]!) / 2;
  return { samples: sorted.length, median, p99: rank(0.99), mean };
}

/** Higher is better for rates (`x/s`), lower for durations and sizes. */
export function betterFor(unit: string): 'higher' | 'lower' {
  return /\/s$|^ratio$/.test(unit) ? 'higher' : 'lower';
}

/** Builds a figure from raw samples and an optional anchor (also raw samples or a summary). */
export function makeFigure(input: {
  name: string;
  unit: string;
  samples: readonly number[];
  anchor?: { name: string; unit?: string; samples: readonly number[] } | Anchor | null;
  better?: 'higher' | 'lower';
  limit?: Limit;
  sweep?: Sweep;
}): Figure {
  const s = summarize(input.samples);
  let anchor: Anchor | null = null;
  if (input.anchor) {
    const a = input.anchor;
    if ('samples' in a && Array.isArray(a.samples)) {
      const as = summarize(a.samples as readonly number[]);
      anchor = {
        name: a.name,
        unit: a.unit ?? input.unit,
        median: as.median,
        p99: as.p99,
        samples: as.samples,
      };
    } else {
      anchor = { ...(a as Anchor), unit: a.unit ?? input.unit };
    }
  }
  const figure: Figure = {
    name: input.name,
    unit: input.unit,
    ...s,
    anchor,
    ratio: anchor && anchor.median !== 0 ? s.median / anchor.median : null,
    better: input.better ?? betterFor(input.unit),
  };
  if (input.limit) figure.limit = input.limit;
  if (input.sweep) figure.sweep = input.sweep;
  return figure;
}

function bad(where: string, message: string): HydraError {
  return new HydraError('HYDRA_ERR_BAD_RESULT', `${where}: ${message}`, { keys: [where] });
}

const isObj = (v: unknown): v is Record<string, unknown> =>
  typeof v === 'object' && v !== null && !Array.isArray(v);
const num = (v: unknown): v is number => typeof v === 'number' && Number.isFinite(v);
const str = (v: unknown): v is string => typeof v === 'string' && v.length > 0;

function need<T>(where: string, value: unknown, check: (v: unknown) => v is T, what: string): T {
  if (!check(value)) throw bad(where, `must be ${what}`);
  return value;
}

function normalizeMachine(where: string, raw: unknown): Machine {
  if (!isObj(raw)) throw bad(where, 'must be an object');
  const m: Machine = {
    cpu: need(`${where}.cpu`, raw.cpu, str, 'a string'),
    cores: need(`${where}.cores`, raw.cores, num, 'a number'),
    memory_gib: num(raw.memory_gib) ? raw.memory_gib : null,
    // hydra-rpc-port.json (written before this schema) says `platform` instead of `os`.
    os: str(raw.os) ? raw.os : str(raw.platform) ? raw.platform : 'unknown',
    node: need(`${where}.node`, raw.node, str, 'a string'),
  };
  if (Array.isArray(raw.gpus)) m.gpus = raw.gpus.filter(str);
  return m;
}

function normalizeAnchor(
  where: string,
  raw: unknown,
  figureUnit: string,
): { anchor: Anchor | null; ratio: number | null } {
  if (raw === null || raw === undefined) return { anchor: null, ratio: null };
  if (!isObj(raw)) throw bad(where, 'must be an object or null');
  const anchor: Anchor = {
    name: need(`${where}.name`, raw.name, str, 'a string'),
    // hydra-rpc-port.json's anchors have no unit: they share the figure's.
    unit: str(raw.unit) ? raw.unit : figureUnit,
    median: need(`${where}.median`, raw.median, num, 'a finite number'),
  };
  if (num(raw.p99)) anchor.p99 = raw.p99;
  if (num(raw.samples)) anchor.samples = raw.samples;
  // tiering-plan.json keeps the ratio inside the anchor, hydra-rpc-port.json as ratio_median.
  const ratio = num(raw.ratio) ? raw.ratio : num(raw.ratio_median) ? raw.ratio_median : null;
  return { anchor, ratio };
}

function normalizeFigure(where: string, raw: unknown): Figure {
  if (!isObj(raw)) throw bad(where, 'must be an object');
  const unit = need(`${where}.unit`, raw.unit, str, 'a string');
  const median = need(`${where}.median`, raw.median, num, 'a finite number');
  const { anchor, ratio: legacyRatio } = normalizeAnchor(`${where}.anchor`, raw.anchor, unit);
  const ratio = num(raw.ratio)
    ? raw.ratio
    : (legacyRatio ?? (anchor && anchor.median !== 0 ? median / anchor.median : null));
  const figure: Figure = {
    name: need(`${where}.name`, raw.name, str, 'a string'),
    unit,
    samples: need(`${where}.samples`, raw.samples, num, 'a number'),
    median,
    p99: need(`${where}.p99`, raw.p99, num, 'a finite number'),
    mean: need(`${where}.mean`, raw.mean, num, 'a finite number'),
    anchor,
    ratio,
    better: raw.better === 'higher' || raw.better === 'lower' ? raw.better : betterFor(unit),
  };
  if (raw.limit !== undefined) {
    const l = raw.limit;
    if (!isObj(l)) throw bad(`${where}.limit`, 'must be an object');
    figure.limit = {
      name: need(`${where}.limit.name`, l.name, str, 'a string'),
      unit: need(`${where}.limit.unit`, l.unit, str, 'a string'),
      value: need(`${where}.limit.value`, l.value, num, 'a finite number'),
    };
  }
  if (raw.sweep !== undefined) {
    const w = raw.sweep;
    if (!isObj(w)) throw bad(`${where}.sweep`, 'must be an object');
    figure.sweep = {
      family: need(`${where}.sweep.family`, w.family, str, 'a string'),
      key: need(`${where}.sweep.key`, w.key, str, 'a string'),
      value: need(`${where}.sweep.value`, w.value, num, 'a finite number'),
    };
  }
  return figure;
}

/**
 * Checks a parsed results file and returns it in the current schema. Files written before the
 * schema existed (tiering-plan.json, hydra-rpc-port.json: `name` instead of `suite`, the ratio
 * inside the anchor) are accepted and converted. Anything else that does not fit throws
 * `HYDRA_ERR_BAD_RESULT` naming the offending field.
 */
export function normalizeResult(raw: unknown, source = 'result'): BenchResult {
  if (!isObj(raw)) throw bad(source, 'must be a JSON object');
  if (raw.schema !== undefined && raw.schema !== SCHEMA_VERSION) {
    throw bad(`${source}.schema`, `must be ${SCHEMA_VERSION}`);
  }
  const suite = str(raw.suite) ? raw.suite : str(raw.name) ? raw.name : undefined;
  if (suite === undefined) throw bad(`${source}.suite`, 'must be a string');
  const date = need(`${source}.date`, raw.date, str, 'a string');
  if (Number.isNaN(Date.parse(date))) throw bad(`${source}.date`, 'must be an ISO 8601 date');
  const figures = need(`${source}.figures`, raw.figures, Array.isArray, 'an array') as unknown[];
  const skippedRaw = Array.isArray(raw.skipped) ? raw.skipped : Array.isArray(raw.pending) ? raw.pending : [];
  const result: BenchResult = {
    schema: SCHEMA_VERSION,
    suite,
    commit: need(`${source}.commit`, raw.commit, str, 'a string'),
    machine: normalizeMachine(`${source}.machine`, raw.machine),
    date,
    figures: figures.map((f, i) => normalizeFigure(`${source}.figures[${i}]`, f)),
    skipped: skippedRaw.map((s: unknown, i: number) => {
      if (isObj(s)) return { name: String(s.name ?? `#${i}`), reason: String(s.reason ?? '') };
      return { name: String(s), reason: '' };
    }),
  };
  if (isObj(raw.notes)) result.notes = raw.notes;
  return result;
}
