// Lifecycle events as structured log lines (issue 26): load, reconfigure, failover and rejoin, each
// one JSON line with `event` and `cause` and the event's fields. Asserts the fields, never the
// message text.
import type { ChildProcess } from 'node:child_process';
import { afterAll, describe, expect, it } from 'vitest';
import { configure, spawnCombined, spawnEngine } from './combine-helpers.js';
import { tinyModel, waitFor } from './helpers.js';

type Line = Record<string, unknown>;

function events(log: string): Line[] {
  const out: Line[] = [];
  for (const text of log.split('\n')) {
    if (!text.startsWith('{')) continue;
    try {
      const o = JSON.parse(text) as Line;
      if (typeof o.event === 'string') out.push(o);
    } catch {
      // not a log line (a native library's own output)
    }
  }
  return out;
}

describe('lifecycle log lines', () => {
  const procs: ChildProcess[] = [];
  afterAll(() => {
    for (const p of procs) if (p.exitCode === null) p.kill('SIGKILL');
  });

  it('names load, reconfigure, failover and rejoin with their causes', async () => {
    const tiny = await tinyModel();
    const { peer, head } = await spawnCombined(tiny, ['-c', '1024'], procs);
    const find = (event: string, extra: (l: Line) => boolean = () => true) =>
      events(head.log()).filter((l) => l.event === event && extra(l));

    // Start-up load.
    expect(find('load', (l) => l.cause === 'startup')).toHaveLength(1);
    expect(find('load')[0]).toMatchObject({ model: tiny, level: 30 });

    // A context rebuild (T2) and a model reload (T3), both applied at once on an idle engine.
    expect(await configure(head.url, { n_ctx: 2048 })).toMatchObject({ success: true, tier: 'T2' });
    expect(find('reconfigure', (l) => l.rebuild === 'context')).toEqual([
      expect.objectContaining({
        cause: 'configure',
        keys: ['n_ctx'],
        epoch: expect.any(Number),
        ms: expect.any(Number),
      }),
    ]);
    expect(await configure(head.url, { n_gpu_layers: 98 })).toMatchObject({ success: true, tier: 'T3' });
    expect(find('reconfigure', (l) => l.rebuild === 'model')).toEqual([
      expect.objectContaining({ cause: 'configure', keys: ['n_gpu_layers'] }),
    ]);
    expect(find('load', (l) => l.cause === 'configure')).toEqual([
      expect.objectContaining({ model: tiny, seconds: expect.any(Number) }),
    ]);

    // The peer dies: the watchdog fails over (solo by default) and will probe for a rejoin.
    peer.child.kill('SIGKILL');
    await waitFor(async () => find('failover').length > 0, 30_000);
    expect(find('failover')[0]).toMatchObject({
      cause: 'watchdog',
      peers: [peer.rpc],
      action: 'solo',
      rejoin: true,
      ended_requests: 0,
      reason: expect.any(String),
      level: 30,
    });

    // The peer comes back at the same port: the rejoin line names it.
    const back = await spawnEngine([], Number(peer.rpc.split(':')[1]));
    procs.push(back.child);
    await waitFor(async () => find('rejoin').length > 0, 30_000);
    expect(find('rejoin')[0]).toMatchObject({ cause: 'peer_answered', peers: [peer.rpc] });
    expect(find('rejoin_failed')).toEqual([]);
    expect(find('reconfigure_failed')).toEqual([]);
  }, 150_000);
});
