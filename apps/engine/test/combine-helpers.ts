// Engines as their own processes for the COMBINE loss tests (a peer must be killable; a head's
// parked threads stay its own).
import { type ChildProcess, spawn } from 'node:child_process';
import { freePort } from './control-helpers.js';
import { CLI, waitFor } from './helpers.js';

export interface Proc {
  url: string;
  rpc: string;
  child: ChildProcess;
  log(): string;
}

/** An engine as its own process (a peer must be killable; a head's parked threads stay its own). */
export async function spawnEngine(flags: string[], rpcPortWanted?: number): Promise<Proc> {
  const port = await freePort();
  const rpcPort = rpcPortWanted ?? (await freePort());
  const child = spawn(
    process.execPath,
    [CLI, '--port', String(port), '--rpc-port', String(rpcPort), '--progress', 'off', '-t', '1', ...flags],
    { stdio: ['ignore', 'ignore', 'pipe'] },
  );
  let log = '';
  child.stderr!.on('data', (d) => {
    log += d;
  });
  const url = `http://127.0.0.1:${port}`;
  await waitFor(async () => {
    if (child.exitCode !== null) throw new Error(`engine exited ${child.exitCode}: ${log}`);
    const h = await fetch(`${url}/health`).then(
      (r) => r.json() as Promise<{ state: string }>,
      () => undefined,
    );
    if (h?.state === 'error') throw new Error(`engine failed to load: ${log}`);
    return h !== undefined && (flags.includes('-m') ? h.state === 'ready' : true);
  }, 60_000);
  return { url, rpc: `127.0.0.1:${rpcPort}`, child, log: () => log };
}

export async function greedy(
  url: string,
  prompt: string,
): Promise<{ status: number; text: string; code?: string }> {
  const res = await fetch(`${url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ prompt, max_tokens: 16, temperature: 0, ignore_eos: true }),
  });
  const body = (await res.json()) as { choices?: { text: string }[]; error?: { code: string } };
  return {
    status: res.status,
    text: body.choices?.[0]?.text ?? '',
    ...(body.error ? { code: body.error.code } : {}),
  };
}
