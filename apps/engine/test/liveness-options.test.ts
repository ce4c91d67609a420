import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { errorCode as code } from '@hydra-engine/test-kit';
import { describe, expect, it } from 'vitest';
import { parseServeArgs } from '../src/args.js';
import { PeerWatchdog } from '../src/combine/watchdog.js';
import type { Engine } from '../src/engine.js';

describe('peer watchdog and batching options', () => {
  it('takes the watchdog settings from flags and from the hydra: map, flags winning', () => {
    const dflt = parseServeArgs([]).settings;
    expect(dflt).toMatchObject({
      peerStallMs: 15_000,
      peerProbeIntervalMs: 1000,
      peerProbeTimeoutMs: 1000,
      peerProbeFailures: 2,
    });
    const dir = mkdtempSync(join(tmpdir(), 'hydra-liveness-'));
    const file = join(dir, 'c.yaml');
    writeFileSync(file, 'hydra:\n  peer_stall_ms: 700\n  peer_probe_failures: 5\n');
    const s = parseServeArgs([
      '--config',
      file,
      '--peer-stall-ms',
      '300',
      '--peer-probe-interval-ms',
      '50',
    ]).settings;
    expect(s).toMatchObject({ peerStallMs: 300, peerProbeIntervalMs: 50, peerProbeFailures: 5 });
    expect(code(() => parseServeArgs(['--peer-stall-ms', '0']))).toBe('HYDRA_ERR_BAD_ARGUMENT');
    expect(code(() => parseServeArgs(['--peer-probe-timeout-ms', 'x']))).toBe('HYDRA_ERR_BAD_ARGUMENT');
    writeFileSync(file, 'hydra:\n  peer_stall_ms: -1\n');
    expect(code(() => parseServeArgs(['--config', file]))).toBe('HYDRA_ERR_CONFIG_INVALID');
  });

  it('-kvu sets kv_unified (one KV buffer: a prompt chunk and decode tokens share one ubatch)', () => {
    expect(parseServeArgs(['-kvu']).layers.get('kv_unified')).toBe(true);
    expect(parseServeArgs([]).layers.get('kv_unified')).toBe(false);
  });

  it('the watchdog refuses a bad option by name', () => {
    const engine = {} as Engine;
    for (const k of ['stallMs', 'intervalMs', 'probeTimeoutMs', 'failures']) {
      expect(code(() => new PeerWatchdog({ engine, [k]: 0 }))).toBe('HYDRA_ERR_BAD_ARGUMENT');
    }
  });
});
