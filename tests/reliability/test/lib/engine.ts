import { HydraClient, OPCODES, type OpcodeName } from '@hydra-engine/hydra-rpc';
import {
  health,
  type EngineProcess as KitEngine,
  tinyModel as kitTinyModel,
  metrics,
  type SpawnEngineOptions,
  spawnEngine as spawnKitEngine,
  waitFor,
} from '@hydra-engine/test-kit';

export {
  CLI,
  freePort,
  type Health,
  health,
  metrics,
  openFds,
  parseMetrics,
  REPO,
  rssBytes,
  sleep,
  waitFor,
} from '@hydra-engine/test-kit';

/**
 * The tiny synthetic model, written once per machine: every file of the suite reuses it, so its
 * generation time is paid once.
 */
export const tinyModel = (): Promise<string> => kitTinyModel({ shared: true });

/** The test-kit's engine process; `proc` is its child process, as this suite names it. */
export type EngineProcess = KitEngine & { proc: KitEngine['child'] };

/** The real `hydra-engine` CLI as a process (test-kit spawnEngine), ready to serve. */
export async function spawnEngine(flags: string[], options: SpawnEngineOptions = {}): Promise<EngineProcess> {
  const e = await spawnKitEngine(flags, options);
  return { ...e, proc: e.child };
}

/**
 * Throws unless the engine's HELLO lists every opcode in `names`. A suite calls it before testing
 * what those opcodes serve, so an engine that stopped serving one fails the suite instead of
 * passing it by skipping.
 */
export async function requireOpcodes(rpcPort: number, ...names: OpcodeName[]): Promise<void> {
  const c = await HydraClient.connect({ port: rpcPort });
  try {
    const served = new Set((await c.hello()).opcodes as number[]);
    const missing = names.filter((n) => !served.has(OPCODES[n]));
    if (missing.length > 0) throw new Error(`the engine's HELLO does not list ${missing.join(', ')}`);
  } finally {
    await c.close();
  }
}

/** Waits until every slot is free and the queue is empty (per /health and /metrics). */
export async function waitSlotsFree(url: string, timeoutMs = 10_000): Promise<void> {
  await waitFor(
    async () => {
      const h = await health(url);
      const m = await metrics(url);
      return (
        h.slots.busy === 0 &&
        h.queue === 0 &&
        m.get('hydra_slots_busy') === 0 &&
        m.get('hydra_queue_depth') === 0
      );
    },
    timeoutMs,
    'all slots free',
  );
}

/** One short non-streaming completion; returns its status and body. */
export async function completion(
  url: string,
  body: Record<string, unknown> = { prompt: 'hello', max_tokens: 4 },
  init: RequestInit = {},
): Promise<{ status: number; body: Record<string, unknown> }> {
  const res = await fetch(`${url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body),
    ...init,
  });
  return { status: res.status, body: (await res.json()) as Record<string, unknown> };
}
