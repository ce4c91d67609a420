// Engines as their own processes for the COMBINE loss tests (a peer must be killable; a head's
// parked threads stay its own).
import { type EngineProcess, spawnEngine as spawnKitEngine } from '@hydra-engine/test-kit';

/** An engine process with its merged port (`rpc`: the `host:port` a head's `--rpc` takes). */
export type Proc = EngineProcess & { rpc: string };

/** An engine as its own process (a peer must be killable; a head's parked threads stay its own). */
export async function spawnEngine(flags: string[], rpcPortWanted?: number): Promise<Proc> {
  const options = rpcPortWanted !== undefined ? { rpcPort: rpcPortWanted } : { rpc: true };
  return (await spawnKitEngine(['-t', '1', ...flags], options)) as Proc;
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
