import { mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { readGguf } from '@hydra-engine/resolver';
import { describe, expect, it } from 'vitest';
import { parseSynthArgs, writeSyntheticModel } from '../src/synth/index.js';

// Speculative pairs (SYNTH.md): the target's shared tensors are the plain model's bytes, the extra
// blocks' output projections are scaled, and models without the options are written as before.
const dir = mkdtempSync(join(tmpdir(), 'hydra-synth-pair-'));

async function tensors(path: string): Promise<Map<string, Buffer>> {
  const buf = readFileSync(path);
  const g = await readGguf({
    size: buf.length,
    read: async (offset, length) => buf.subarray(offset, offset + length),
  });
  const out = new Map<string, Buffer>();
  for (const t of g.tensors)
    out.set(t.name, buf.subarray(g.dataOffset + t.offset, g.dataOffset + t.offset + t.bytes));
  return out;
}

describe('synthetic speculative pairs', () => {
  it('the target holds the draft tensors byte for byte, and extra blocks whose projections scale', async () => {
    const draft = join(dir, 'draft.gguf');
    await writeSyntheticModel({ arch: 'llama', shape: 'tiny', quant: 'f32', seed: 3, out: draft });
    const a = join(dir, 'a.gguf');
    const b = join(dir, 'b.gguf');
    await writeSyntheticModel({
      arch: 'llama',
      shape: 'tiny',
      quant: 'f32',
      seed: 3,
      out: a,
      extraLayers: 2,
      extraScale: 0.1,
    });
    await writeSyntheticModel({
      arch: 'llama',
      shape: 'tiny',
      quant: 'f32',
      seed: 3,
      out: b,
      extraLayers: 2,
      extraScale: 0.2,
    });
    const d = await tensors(draft);
    const ta = await tensors(a);
    const tb = await tensors(b);
    expect(ta.size).toBe(d.size + 2 * 9);
    for (const [name, bytes] of d) expect([name, ta.get(name)!.equals(bytes)]).toEqual([name, true]);
    const std = (x: Buffer) => {
      const f = new Float32Array(x.buffer, x.byteOffset, x.length / 4);
      let s = 0;
      for (const v of f) s += v * v;
      return Math.sqrt(s / f.length);
    };
    // 1/sqrt(n_embd) = 0.0625 for tiny; the extra blocks' projections at 0.1x and 0.2x of it.
    for (const name of ['blk.4.attn_output.weight', 'blk.5.ffn_down.weight']) {
      expect(std(ta.get(name)!)).toBeCloseTo(0.00625, 3);
      expect(std(tb.get(name)!) / std(ta.get(name)!)).toBeCloseTo(2, 2);
    }
    expect(std(ta.get('blk.4.attn_q.weight')!)).toBeCloseTo(0.0625, 2);
  });

  it('the CLI takes --extra-layers and --extra-scale and refuses them by name when wrong', () => {
    expect(parseSynthArgs(['--out', 'x', '--extra-layers', '4', '--extra-scale', '0.07'])).toMatchObject({
      extraLayers: 4,
      extraScale: 0.07,
    });
    for (const [argv, key] of [
      [['--out', 'x', '--extra-layers', '0'], 'extra-layers'],
      [['--out', 'x', '--extra-scale', '0.1'], 'extra-scale'],
      [['--out', 'x', '--extra-layers', '2', '--extra-scale', '-1'], 'extra-scale'],
      [['--out', 'x', '--arch', 'qwen35', '--extra-layers', '2'], 'extra-layers'],
    ] as const) {
      let err: { code?: string; keys?: string[] } | undefined;
      try {
        parseSynthArgs(argv);
      } catch (e) {
        err = e as typeof err;
      }
      expect([argv.join(' '), err?.code, err?.keys]).toEqual([
        argv.join(' '),
        'HYDRA_ERR_BAD_ARGUMENT',
        [key],
      ]);
    }
  });
});
