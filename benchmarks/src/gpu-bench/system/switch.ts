import { existsSync } from 'node:fs';
import { HydraClient } from '@hydra-engine/hydra-rpc';
import { makeFigure } from '../../schema.js';
import { freeLoopbackPort, type Part, waitHttp } from '../harness/index.js';
import { complete, type SystemContext } from './context.js';

/** DENSE -> MoE -> DENSE via CONFIGURE `model`, to the first token, against restarting the engine. */
export const profileSwitch: Part<SystemContext> = {
  name: 'switch',
  estimateS: 90,
  async run(c) {
    const { opts, h } = c;
    const dense = c.modelPath('llama', opts.shapes[0] ?? '8b');
    const moe = c.modelPath('moe', opts.moeShape);
    for (const p of [dense, moe]) if (!existsSync(p)) throw new Error(`${p} missing: run --only synth first`);
    const rpcPort = await freeLoopbackPort();
    const base = ['-ngl', String(opts.ngl), '-c', '4096', '-np', '1'];
    const eng = await c.startEngine([
      '-m',
      dense,
      '-ngl',
      String(opts.ngl),
      '--rpc-port',
      String(rpcPort),
      '-c',
      '4096',
      '-np',
      '1',
    ]);
    const client = await HydraClient.connect({ port: rpcPort, timeoutMs: 300_000 });
    try {
      const ms: number[] = [];
      for (const target of [moe, dense, moe, dense]) {
        const t = performance.now();
        await client.configure({ model: target });
        await waitHttp(
          `${eng.url}/health`,
          (s, b) => s === 200 && b.state === 'ready',
          t,
          eng.child,
          300_000,
        );
        await complete(eng.url, 'hello', 1);
        ms.push(performance.now() - t);
      }
      // Anchor: the same switch done by restarting (stop, spawn with the other model, first token).
      const restart: number[] = [];
      for (const target of [moe, dense]) {
        const t = performance.now();
        const e = await c.startEngine(['-m', target, ...base]);
        await complete(e.url, 'hello', 1);
        restart.push(performance.now() - t);
        await h.processes.stop(e.child);
      }
      h.add(
        makeFigure({
          name: 'profile switch DENSE <-> MoE via CONFIGURE model (to first token)',
          unit: 'ms',
          samples: ms,
          anchor: {
            name: 'engine restart with the other model (spawn to first token)',
            unit: 'ms',
            samples: restart,
          },
        }),
      );
    } catch (err) {
      h.skip(
        'profile switch DENSE -> MoE -> DENSE',
        `${(err as { code?: string }).code ?? 'error'}: ${err instanceof Error ? err.message : String(err)}`,
      );
    } finally {
      await client.close();
      await h.processes.stop(eng.child);
    }
  },
};
