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
  // The service's "Batch 8192 / ubatch 256": the compute buffer scales with the ubatch.
  '-ub',
  '256',
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

  it('with the overhead the notes measured at 45 blocks (1149 MiB), 48 blocks is short by about the OOM they saw and auto takes 47', async () => {
    // The notes: 23854 MiB used on the worker at 45 blocks, where the plan puts 22705 MiB (weights,
    // KV, recurrent state, compute); the rest (CUDA context, the server's own buffers) is kept free.
    const planned = JSON.parse((await runCli([...common(), '-ts', '0.68,0.32', '--json'])).out).devices[0];
    const sum = planned.weight_bytes + planned.kv_bytes + planned.recurrent_bytes + planned.compute_bytes;
    expect(Math.abs(sum / MIB - 22705) / 22705).toBeLessThan(0.005);
    const prod = await runCli([...common(), '--fit-target', '1149', '-ts', '0.68,0.32', '--json']);
    expect(prod.code).toBe(0);
    const over = await runCli([...common(), '--fit-target', '1149', '-ts', '0.7197,0.2803', '--json']);
    expect(over.code).toBe(1);
    // "48 blocks ... OOM by ~0.85 GiB".
    const short = -JSON.parse(over.out).devices[0].headroom_bytes / MIB;
    expect(Math.abs(short - 870) / 870).toBeLessThan(0.15);
    const auto = await runCli([
      ...common(),
      '--fit-target',
      '1149',
      '-ts',
      'auto',
      '--fit-prefer',
      'RPC0',
      '--json',
    ]);
    expect(auto.code).toBe(0);
    const fit = JSON.parse(auto.out);
    expect(fit.auto.tensor_split).toBe(true);
    // 46 blocks "leaves ~0.3 GiB" in the notes; 47 still fits here, with 117 MiB to spare.
    expect(fit.devices[0].layers).toEqual({ first: 0, last: 46, count: 47 });
    expect(fit.devices[0].kv_layers).toBe(11);
  }, 60_000);
});
