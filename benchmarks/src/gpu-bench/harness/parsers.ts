import { HydraError } from '@hydra-engine/errors';

// Parsers of the anchor tools' output at the pinned llama.cpp (fixtures in
// benchmarks/test/fixtures/anchor-tools/ are captured from real runs).

const failed = (tool: string, message: string) =>
  new HydraError('HYDRA_ERR_BENCH_FAILED', `${tool}: ${message}`, { keys: [tool] });

/** One row of `llama-bench -o json`: a test (pp or tg) with its per-repetition rates. */
export interface LlamaBenchRow {
  n_prompt: number;
  n_gen: number;
  avg_ts: number;
  samples_ts: number[];
  [key: string]: unknown;
}

/** The prefill and decode tests of one `llama-bench -o json` run. */
export interface LlamaBenchResult {
  /** Per-repetition tok/s of the prefill test (`-p N -n 0`), empty when it did not run. */
  pp: number[];
  /** Per-repetition tok/s of the decode test (`-p 0 -n N`). */
  tg: number[];
  /** llama-bench's own mean of each test (avg_ts). */
  ppAvg: number | undefined;
  tgAvg: number | undefined;
  rows: LlamaBenchRow[];
}

/** Reads `llama-bench -o json` stdout; `pp`/`tg` pick the test of that size when given. */
export function parseLlamaBenchJson(
  stdout: string,
  sizes: { pp?: number; tg?: number } = {},
): LlamaBenchResult {
  let rows: unknown;
  try {
    rows = JSON.parse(stdout);
  } catch {
    throw failed('llama-bench', `output is not JSON: ${stdout.slice(0, 200)}`);
  }
  if (!Array.isArray(rows)) throw failed('llama-bench', 'output is not a JSON array');
  const ok = rows.filter(
    (r): r is LlamaBenchRow =>
      typeof r === 'object' &&
      r !== null &&
      typeof r.n_prompt === 'number' &&
      typeof r.n_gen === 'number' &&
      Array.isArray(r.samples_ts),
  );
  const pp = ok.find(
    (r) => r.n_gen === 0 && (sizes.pp === undefined ? r.n_prompt > 0 : r.n_prompt === sizes.pp),
  );
  const tg = ok.find(
    (r) => r.n_prompt === 0 && (sizes.tg === undefined ? r.n_gen > 0 : r.n_gen === sizes.tg),
  );
  return {
    pp: pp?.samples_ts ?? [],
    tg: tg?.samples_ts ?? [],
    ppAvg: pp?.avg_ts,
    tgAvg: tg?.avg_ts,
    rows: ok,
  };
}

/** A device line of `llama-bench --list-devices` (an `--rpc` server shows as `RPC0: host:port`). */
export interface ToolDevice {
  name: string;
  description: string;
  totalMiB: number | undefined;
  freeMiB: number | undefined;
}

const DEVICE_LINE = /^\s+([A-Za-z][A-Za-z0-9_-]*\d*):\s+(.*?)(?:\s+\((\d+) MiB, (\d+) MiB free\))?\s*$/;

function deviceOf(line: string): ToolDevice | undefined {
  const m = DEVICE_LINE.exec(line);
  if (!m) return undefined;
  const mib = (s: string | undefined) => (s === undefined ? undefined : Number(s));
  return { name: m[1] as string, description: m[2] as string, totalMiB: mib(m[3]), freeMiB: mib(m[4]) };
}

/** The devices `llama-bench --list-devices` prints under "Available devices:" (`(none)` -> []). */
export function parseListDevices(out: string): ToolDevice[] {
  const lines = out.split('\n');
  const at = lines.findIndex((l) => l.startsWith('Available devices:'));
  if (at < 0) throw failed('llama-bench --list-devices', 'no "Available devices:" line');
  const devices: ToolDevice[] = [];
  for (const line of lines.slice(at + 1)) {
    const d = deviceOf(line);
    if (d) devices.push(d);
  }
  return devices;
}

/** The first local (not RPC) device that `--list-devices` names, as `-dev` spells it (CUDA0). */
export function localDevice(devices: readonly ToolDevice[]): string | undefined {
  return devices.find((d) => !d.name.startsWith('RPC'))?.name;
}

/** One `--output-format jsonl` row of llama-batched-bench. */
export interface BatchedBenchRow {
  pl: number;
  pp: number;
  tg: number;
  speed_tg: number;
  speed_pp: number;
  [key: string]: unknown;
}

/**
 * The rows of llama-batched-bench's jsonl output, wherever they sit in its stdout and stderr (its
 * logger can prefix them, or lose them at exit: a missing level has no row).
 */
export function parseBatchedBenchJsonl(text: string): BatchedBenchRow[] {
  const rows: BatchedBenchRow[] = [];
  for (const line of text.split('\n')) {
    const at = line.indexOf('{"n_kv_max"');
    if (at < 0) continue;
    let row: unknown;
    try {
      row = JSON.parse(line.slice(at));
    } catch {
      continue; // a row cut short by the exit
    }
    const r = row as Partial<BatchedBenchRow>;
    if (typeof r.pl === 'number' && typeof r.speed_tg === 'number') rows.push(row as BatchedBenchRow);
  }
  return rows;
}

/** Whether any slot of llama-server's `GET /slots` answer is processing; undefined if it is no slot list. */
export function llamaServerBusy(slots: unknown): boolean | undefined {
  if (!Array.isArray(slots)) return undefined;
  return slots.some(
    (s) => typeof s === 'object' && s !== null && (s as { is_processing?: unknown }).is_processing === true,
  );
}

/** The URL llama-server's log says it listens on (`llama_server: listening on http://...`). */
export function llamaServerListening(log: string): string | undefined {
  return /listening on (http:\/\/\S+)/.exec(log)?.[1];
}

/** A Prometheus gauge of the engine's `/metrics` text, NaN when absent. */
export function metricValue(text: string, name: string): number {
  const m = new RegExp(`^${name}\\s+([0-9.eE+-]+)`, 'm').exec(text);
  return m ? Number(m[1]) : Number.NaN;
}
