import { makeFigure } from '../../schema.js';
import { freeLoopbackPort, type Part, waitHttp } from '../harness/index.js';
import type { SystemContext } from './context.js';

const BARE =
  'require("node:http").createServer((q,s)=>{s.setHeader("content-type","application/json");s.end(JSON.stringify({state:"empty"}))}).listen(Number(process.argv[1]),"127.0.0.1")';

/** A model-less engine, spawn to /health 200, against a bare node:http server. */
export const boot: Part<SystemContext> = {
  name: 'boot',
  estimateS: 15,
  async run(c) {
    const { h } = c;
    const reps = Math.max(5, c.opts.reps);
    const ours: number[] = [];
    const anchor: number[] = [];
    for (let r = 0; r < reps; r++) {
      const eng = await c.startEngine([], { state: 'empty', timeoutMs: 60_000 });
      ours.push(eng.readyMs);
      await h.processes.stop(eng.child);
      const port = await freeLoopbackPort();
      const since = performance.now();
      const child = h.processes.start(process.execPath, ['-e', BARE, String(port)]);
      anchor.push(await waitHttp(`http://127.0.0.1:${port}/health`, (s) => s === 200, since, child, 30_000));
      await h.processes.stop(child);
    }
    h.add(
      makeFigure({
        name: 'boot to ready, model-less engine (spawn to /health 200)',
        unit: 'ms',
        samples: ours,
        anchor: { name: 'bare node:http server, spawn to first 200', unit: 'ms', samples: anchor },
      }),
    );
  },
};
