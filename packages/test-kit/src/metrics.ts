import { readdirSync, readFileSync } from 'node:fs';

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

/** Resident set size of `pid` in bytes (VmRSS of /proc/PID/status). */
export function rssBytes(pid: number): number {
  const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  return Number(m?.[1] ?? Number.NaN) * 1024;
}

/** Number of open file descriptors of `pid` (entries of /proc/PID/fd). */
export function openFds(pid: number): number {
  return readdirSync(`/proc/${pid}/fd`).length;
}
