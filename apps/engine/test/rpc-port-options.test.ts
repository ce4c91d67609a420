import { writeFileSync } from 'node:fs';
import { connect } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { parseServeArgs } from '../src/args.js';
import { freeLoopbackPort } from '../src/ports.js';
import { engineWith } from './helpers.js';

// The merged port's caps and the ggml-RPC session limits as flags and YAML keys, and that a limit
// reaches the host process that serves the session.
describe('merged-port flags', () => {
  it('parses the caps, timeouts and --rpc-limit (repeatable) into settings', () => {
    const { settings } = parseServeArgs([
      '--rpc-pool-size',
      '2',
      '--rpc-queue-size',
      '0',
      '--rpc-max-per-source',
      '1',
      '--hydra-idle-timeout-ms',
      '5000',
      '--rpc-limit',
      'maxBuffers=8',
      '--rpc-limit',
      'helloTimeoutMs=300,idleTimeoutMs=0',
    ]);
    expect(settings).toMatchObject({
      rpcPoolSize: 2,
      rpcQueueSize: 0,
      rpcMaxPerSource: 1,
      hydraIdleTimeoutMs: 5000,
      rpcLimits: { maxBuffers: 8, helloTimeoutMs: 300, idleTimeoutMs: 0 },
    });
  });

  it.each([
    [['--rpc-pool-size', '0'], '@rpcPoolSize'],
    [['--hydra-max-sessions', '-1'], '@hydraMaxSessions'],
    [['--rpc-limit', 'maxWidgets=3'], '@rpcLimits'],
    [['--rpc-limit', 'maxBuffers=-3'], '@rpcLimits'],
    [['--rpc-limit', 'maxBuffers'], '@rpcLimits'],
  ])('refuses %j by name', (argv, key) => {
    try {
      parseServeArgs(argv);
      expect.unreachable();
    } catch (err) {
      expect((err as { code: string }).code).toBe('HYDRA_ERR_BAD_ARGUMENT');
      expect((err as { keys: string[] }).keys).toEqual([key]);
    }
  });

  it('reads the same settings from the hydra: map of --config', () => {
    const file = join(tmpdir(), `hydra-rpc-port-${process.pid}.yaml`);
    writeFileSync(
      file,
      'hydra:\n  rpc_pool_size: 3\n  hydra_max_sessions_per_source: 5\n  rpc_limits:\n    maxGraphNodes: 100\n',
    );
    const { settings } = parseServeArgs(['--config', file]);
    expect(settings).toMatchObject({
      rpcPoolSize: 3,
      hydraMaxSessionsPerSource: 5,
      rpcLimits: { maxGraphNodes: 100 },
    });
    writeFileSync(file, 'hydra:\n  rpc_limits:\n    nope: 1\n');
    expect(() => parseServeArgs(['--config', file])).toThrow(
      expect.objectContaining({ code: 'HYDRA_ERR_CONFIG_INVALID' }),
    );
  });

  it('--rpc-limit reaches the session: helloTimeoutMs=300 closes a connection that sent only 0x0E', async () => {
    const rpcPort = await freeLoopbackPort();
    const peer = await engineWith(['--rpc-port', String(rpcPort), '--rpc-limit', 'helloTimeoutMs=300']);
    try {
      const t0 = Date.now();
      const closedAfter = await new Promise<number>((resolve, reject) => {
        const s = connect({ port: rpcPort, host: '127.0.0.1' }, () => s.write(Buffer.from([0x0e])));
        s.on('error', () => {});
        s.on('close', () => resolve(Date.now() - t0));
        setTimeout(() => reject(new Error('not closed in 5 s')), 5000);
      });
      expect(closedAfter).toBeLessThan(3000);
      await new Promise((r) => setTimeout(r, 200));
      expect(peer.port!.stats().rpc.ended).toMatchObject({ timeout: 1 });
    } finally {
      await peer.close();
    }
  }, 30_000);
});
