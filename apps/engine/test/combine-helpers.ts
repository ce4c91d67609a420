// Engines as their own processes for the COMBINE loss tests (a peer must be killable; a head's
// parked threads stay its own).
import type { ChildProcess } from 'node:child_process';
import { type EngineProcess, spawnEngine as spawnKitEngine } from '@hydra-engine/test-kit';

/** An engine process with its merged port (`rpc`: the `host:port` a head's `--rpc` takes). */
export type Proc = EngineProcess & { rpc: string };

/** An engine as its own process (a peer must be killable; a head's parked threads stay its own). */
export async function spawnEngine(flags: string[], rpcPortWanted?: number): Promise<Proc> {
  const options = rpcPortWanted !== undefined ? { rpcPort: rpcPortWanted } : { rpc: true };
  return (await spawnKitEngine(['-t', '1', ...flags], options)) as Proc;
}

/**
 * A peer, then a head in COMBINE with every layer of `model` on it (`--rpc`, `--device RPC0`,
 * `-ngl 99`); both children go on `procs` as soon as they start, for the suite's afterAll to kill.
 */
export async function spawnCombined(
  model: string,
  headFlags: string[],
  procs: ChildProcess[],
  peerFlags: string[] = [],
): Promise<{ peer: Proc; head: Proc }> {
  const peer = await spawnEngine(peerFlags);
  procs.push(peer.child);
  const head = await spawnEngine([
    '-m',
    model,
    '--rpc',
    peer.rpc,
    '--device',
    'RPC0',
    '-ngl',
    '99',
    ...headFlags,
  ]);
  procs.push(head.child);
  return { peer, head };
}

/** A POST /control/configure with `delta`; its JSON reply. */
export const configure = (url: string, delta: Record<string, unknown>) =>
  fetch(`${url}/control/configure`, { method: 'POST', body: JSON.stringify(delta) }).then(
    (r) => r.json() as Promise<{ success: boolean; tier?: string }>,
  );

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
