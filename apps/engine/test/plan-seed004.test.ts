import { closeSync, ftruncateSync, mkdtempSync, openSync, writeSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import { runCli } from './helpers.js';

// A two-machine 27B hybrid split through `hydra-engine plan` (the resolver's planFit and the fit object PLAN replies):
// Qwen3.8-27B hybrid, 66 layers (65 blocks + MTP), q8_0/f16 KV at 262144, the RTX 3090 worker
// (RPC0, 24576 MiB) first and the Strix head (ROCm0) second, KV by round(f x 66) as measured on
// b10433. The GGUF is its header over a sparse file of the real size.
let gguf: string;
const MIB = 1024 * 1024;
const common = () => [
  'plan',
  '-m',
  gguf,
  '--device',
  'RPC0=24576',
  '--device',
  'ROCm0=98304',
  '-c',
  '262144',
  '--cache-type-k',
  'q8_0',
  '--cache-type-v',
  'f16',
  '--kv-placement',
  'rounded-fraction',
];

// The resolver's test model writer, loaded by path so this package's type check stays within it.
const MODELS = new URL('../../../packages/resolver/test/helpers/models.ts', import.meta.url).pathname;

beforeAll(async () => {
  const { hybrid27b } = (await import(/* @vite-ignore */ MODELS)) as {
    hybrid27b(): { bytes: Uint8Array; size: number };
  };
  const m = hybrid27b();
  gguf = join(mkdtempSync(join(tmpdir(), 'hydra-seed004-')), 'qwen-27b-q6k.gguf');
  const fd = openSync(gguf, 'w');
  writeSync(fd, m.bytes);
  ftruncateSync(fd, m.size);
  closeSync(fd);
});

describe('27B hybrid split limits (3090 worker, Strix head) by hydra-engine plan', () => {
  it('0.7196 and 0.7197 hold the same 48 blocks; round(f x 66) gives the second the 12th FA layer (+784 MiB)', async () => {
    const at = async (f: number) => {
      const r = await runCli([...common(), '-ts', `${f},${1 - f}`, '--json']);
      return { code: r.code, fit: JSON.parse(r.out) };
    };
    const below = await at(0.7196);
    const above = await at(0.7197);
    const b = below.fit.devices[0];
    const a = above.fit.devices[0];
    expect([b.layers.count, a.layers.count]).toEqual([48, 48]);
    expect([b.kv_layers, a.kv_layers]).toEqual([11, 12]);
    expect([b.kv_bytes, a.kv_bytes]).toEqual([8624 * MIB, 9408 * MIB]);
    expect(b.weight_bytes).toBe(a.weight_bytes);
    // The weights of 35 blocks at f=0.53: the notes' RPC0 buffer of 10429.88 MiB, within 0.5%.
    const p53 = JSON.parse((await runCli([...common(), '-ts', '0.53,0.47', '--json'])).out).devices[0];
    expect(p53.layers.count).toBe(35);
    expect(Math.abs(p53.weight_bytes / MIB - 10429.88) / 10429.88).toBeLessThan(0.005);
  }, 60_000);

  it('with the per-device overhead the notes measured (2048 MiB: 273 MiB free at 45 blocks), auto finds the production maximum', async () => {
    // The production split, 0.68 = 45 blocks, fits with 2048 MiB kept free; the OOM of 48 blocks does not.
    const prod = await runCli([...common(), '--fit-target', '2048', '-ts', '0.68,0.32', '--json']);
    expect(prod.code).toBe(0);
    const over = await runCli([...common(), '--fit-target', '2048', '-ts', '0.7197,0.2803']);
    expect(over.code).toBe(1);
    expect(over.out).toMatch(/does NOT fit: RPC0 short by/);
    const auto = await runCli([
      ...common(),
      '--fit-target',
      '2048',
      '-ts',
      'auto',
      '--fit-prefer',
      'RPC0',
      '--json',
    ]);
    expect(auto.code).toBe(0);
    const fit = JSON.parse(auto.out);
    expect(fit.auto.tensor_split).toBe(true);
    expect(fit.devices[0].layers).toEqual({ first: 0, last: 44, count: 45 });
    expect(fit.devices[0].kv_layers).toBe(11);
  }, 60_000);
});
