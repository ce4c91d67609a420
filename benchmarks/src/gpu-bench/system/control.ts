import { existsSync } from 'node:fs';
import { HydraClient } from '@hydra-engine/hydra-rpc';
import { makeFigure } from '../../schema.js';
import { freeLoopbackPort, type Part } from '../harness/index.js';
import type { SystemContext } from './context.js';

/** Times `n` calls; returns ms samples, or throws the first error. */
export async function timeCalls(n: number, call: (i: number) => Promise<unknown>): Promise<number[]> {
  const ms: number[] = [];
  for (let i = 0; i < n; i++) {
    const t = performance.now();
    await call(i);
    ms.push(performance.now() - t);
  }
  return ms;
}

const codeOf = (err: unknown) => (err as { code?: string }).code ?? 'error';
const messageOf = (err: unknown) => (err instanceof Error ? err.message : String(err));

/** T1 CONFIGURE and SET_EXPERT_MODE round trips against STATUS on the same connection. */
export const control: Part<SystemContext> = {
  name: 'control',
  estimateS: 60,
  async run(c) {
    const { opts, h } = c;
    const rpcPort = await freeLoopbackPort();
    const eng = await c.startEngine(['--rpc-port', String(rpcPort)], { state: 'empty', timeoutMs: 60_000 });
    const client = await HydraClient.connect({ port: rpcPort, timeoutMs: 30_000 });
    try {
      const status = await timeCalls(300, () => client.status());
      const statusAnchor = { name: 'STATUS round trip, same connection', unit: 'ms', samples: status };
      try {
        const t1 = await timeCalls(300, (i) => client.configure({ sampling: { temp: i % 2 ? 0.5 : 0.6 } }));
        h.add(
          makeFigure({
            name: 'T1 CONFIGURE latency (sampling.temp)',
            unit: 'ms',
            samples: t1,
            anchor: statusAnchor,
          }),
        );
      } catch (err) {
        h.skip('T1 CONFIGURE latency', `${codeOf(err)}: ${messageOf(err)}`);
      }
    } finally {
      await client.close();
      await h.processes.stop(eng.child);
    }
    // SET_EXPERT_MODE: an MoE head with a peer engine to put experts on.
    const moe = c.modelPath('moe', opts.moeShape);
    if (!existsSync(moe)) {
      h.skip('SET_EXPERT_MODE latency', `${moe} missing`);
      return;
    }
    const peerPort = await freeLoopbackPort();
    const peer = await c.startEngine(['--rpc-port', String(peerPort)], { state: 'empty', timeoutMs: 60_000 });
    const headPort = await freeLoopbackPort();
    const head = await c.startEngine([
      '-m',
      moe,
      '-ngl',
      String(opts.ngl),
      '--rpc-port',
      String(headPort),
      '--rpc',
      `127.0.0.1:${peerPort}`,
      '-c',
      '4096',
      '-np',
      '1',
    ]);
    const hc = await HydraClient.connect({ port: headPort, timeoutMs: 60_000 });
    try {
      const status = await timeCalls(100, () => hc.status());
      const switchMs: number[] = [];
      const rt = await timeCalls(20, async (i) => {
        const r = await hc.call('SET_EXPERT_MODE', { mode: i % 2 ? 'solo' : 'combined' });
        if (typeof r.switch_ms === 'number') switchMs.push(r.switch_ms);
      });
      h.add(
        makeFigure({
          name: `SET_EXPERT_MODE round trip, MoE ${opts.moeShape}`,
          unit: 'ms',
          samples: rt,
          anchor: { name: 'STATUS round trip, same connection', unit: 'ms', samples: status },
        }),
      );
      if (switchMs.length)
        h.add(
          makeFigure({
            name: `SET_EXPERT_MODE switch_ms (engine-reported), MoE ${opts.moeShape}`,
            unit: 'ms',
            samples: switchMs,
            limit: { name: 'design target: well under 100 ms', unit: 'ms', value: 100 },
          }),
        );
    } catch (err) {
      h.skip('SET_EXPERT_MODE latency', `${codeOf(err)}: ${messageOf(err)}`);
    } finally {
      await hc.close();
      await h.processes.stop(head.child);
      await h.processes.stop(peer.child);
    }
  },
};
