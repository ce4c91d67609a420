// --rpc-limit values the engine accepts at start are exactly those serveRpcFd accepts: a limit that
// passed the flag check must never fail every session later.
import { openSync } from 'node:fs';
import { rpcWorkerPath } from '@hydra-engine/native-ggml';
import { SERVE_LIMIT_KEYS } from '@hydra-engine/native-ggml/rpc-host';
import { describe, expect, it } from 'vitest';
import { parseServeArgs } from '../src/args.js';

/** The session worker's own verdict: a device that does not exist is refused after the limits. */
async function nativeVerdict(name: string, n: number): Promise<string | undefined> {
  const serve = ((await import(rpcWorkerPath)) as { default: (task: unknown) => unknown }).default;
  const fd = openSync('/dev/null', 'r');
  try {
    serve({ fd, devices: ['NO-SUCH-DEVICE'], threads: 1, limits: { [name]: n } });
  } catch (err) {
    const e = err as { code?: string; message: string };
    if (e.message.includes('no local device')) return undefined;
    expect(e.message).toContain(`options.${name}`);
    return e.code;
  }
  throw new Error('served /dev/null');
}

describe('--rpc-limit agrees with serveRpcFd', () => {
  for (const name of SERVE_LIMIT_KEYS) {
    for (const n of [0, 1]) {
      it(`${name}=${n}`, async () => {
        let cli: string | undefined;
        try {
          parseServeArgs(['--rpc-limit', `${name}=${n}`]);
        } catch (err) {
          cli = (err as { code?: string }).code;
        }
        expect(cli).toBe(await nativeVerdict(name, n));
        if (n === 1) expect(cli).toBeUndefined();
      });
    }
  }
});
