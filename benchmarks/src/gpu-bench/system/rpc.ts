import { existsSync } from 'node:fs';
import { makeFigure } from '../../schema.js';
import { freeLoopbackPort, type LlamaBenchResult, type Part, startRpcServer } from '../harness/index.js';
import type { SystemContext } from './context.js';

/** llama-bench --rpc through our merged port (a model-less engine) against stock ggml-rpc-server. */
export const rpc: Part<SystemContext> = {
  name: 'rpc',
  estimateS: 90,
  async run(c) {
    const { opts, h } = c;
    const path = c.modelPath('llama', opts.rpcShape);
    const label = `${opts.rpcShape} q4_0`;
    if (!existsSync(path)) throw new Error(`${path} missing: run --only synth first`);
    const gpu = await c.localGpu();
    c.notes.rpc = { model: label, local_device: gpu ?? null, client: 'llama-bench --rpc (stock, same pin)' };
    // Ours: a model-less engine whose merged port serves its device over ggml-RPC.
    const rpcPort = await freeLoopbackPort();
    const ours = await c.startEngine(['--rpc-port', String(rpcPort)], { state: 'empty', timeoutMs: 60_000 });
    const stock = await startRpcServer(h.processes, c.tool('ggml-rpc-server'));
    const endpoints = { ours: `127.0.0.1:${rpcPort}`, stock: stock.endpoint };
    const configs: [string, string[]][] = [['all layers remote', ['-dev', 'RPC0']]];
    if (gpu) configs.push([`1/1 split ${gpu} + RPC0`, ['-dev', `${gpu}/RPC0`, '-ts', '1/1']]);
    else h.skip('rpc 1/1 split', 'no local GPU device for the other half');
    const base = [
      '-m',
      path,
      '-p',
      '512',
      '-n',
      '128',
      '-ngl',
      String(opts.ngl),
      '-fa',
      '1',
      '-r',
      String(opts.reps),
    ];
    for (const [what, extra] of configs) {
      if (!h.within(120, `rpc ${what}`)) continue;
      const res: Partial<Record<'ours' | 'stock', LlamaBenchResult>> = {};
      for (const side of ['ours', 'stock'] as const) {
        h.log(`rpc ${what}: llama-bench --rpc ${endpoints[side]} (${side})`);
        res[side] = await c.llamaBench([...base, '--rpc', endpoints[side], ...extra], 300_000);
      }
      const oursR = res.ours as LlamaBenchResult;
      const stockR = res.stock as LlamaBenchResult;
      const anchorName = (k: string) => `llama-bench --rpc ${k}, stock ggml-rpc-server (same pin)`;
      h.add(
        makeFigure({
          name: `ggml-RPC ${what} decode ${label}, hydra merged port`,
          unit: 'tok/s',
          samples: oursR.tg,
          anchor: { name: anchorName('tg128'), unit: 'tok/s', samples: stockR.tg },
        }),
      );
      h.add(
        makeFigure({
          name: `ggml-RPC ${what} prefill ${label}, hydra merged port`,
          unit: 'tok/s',
          samples: oursR.pp,
          anchor: { name: anchorName('pp512'), unit: 'tok/s', samples: stockR.pp },
        }),
      );
    }
    await h.processes.stop(ours.child);
    await h.processes.stop(stock.child);
  },
};
