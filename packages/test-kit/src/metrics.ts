import { readdirSync, readFileSync } from 'node:fs';
import { waitFor } from './wait.js';

/** Parses Prometheus text into `name{labels}` -> value. */
export function parseMetrics(text: string): Map<string, number> {
  const out = new Map<string, number>();
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const i = line.lastIndexOf(' ');
    out.set(line.slice(0, i), Number(line.slice(i + 1)));
  }
  return out;
}

/** An engine's `/metrics`, parsed. */
export async function metrics(url: string): Promise<Map<string, number>> {
  const res = await fetch(`${url}/metrics`);
  return parseMetrics(await res.text());
}

/** The fields of an engine's `/health` the suites read. */
export interface Health {
  state: string;
  epoch: number;
  slots: { total: number; busy: number; nCtxSeq: number };
  queue: number;
}

export async function health(url: string): Promise<Health> {
  return (await (await fetch(`${url}/health`)).json()) as Health;
}

/**
 * Polls an engine's `/health` (every 20 ms) until `check` holds and resolves with that answer;
 * throws `what: not met within N ms` at the time-out. `H` is the shape the caller reads.
 */
export async function healthUntil<H = Health>(
  url: string,
  check: (h: H) => boolean,
  timeoutMs: number,
  what = 'health',
): Promise<H> {
  let last: H | undefined;
  await waitFor(
    async () => {
      last = (await (await fetch(`${url}/health`)).json()) as H;
      return check(last);
    },
    timeoutMs,
    what,
  );
  return last!;
}

/** Resident set size of `pid` in bytes (VmRSS of /proc/PID/status). */
export function rssBytes(pid: number): number {
  const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  return Number(m?.[1] ?? Number.NaN) * 1024;
}

/** Number of open file descriptors of `pid` (entries of /proc/PID/fd). */
export function openFds(pid: number): number {
  return readdirSync(`/proc/${pid}/fd`).length;
}
