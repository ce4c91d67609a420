import { describe, expect, it } from 'vitest';
import { CheckpointList, checkpointCut } from '../src/core/checkpoints.js';

const ckpt = (nTokens: number, bytes = 10) => ({ nTokens, data: Buffer.alloc(bytes) });

describe('checkpointCut (llama-server checkpoint_offsets {4 + n_ubatch, 4})', () => {
  it('cuts n_ubatch + 4 and 4 tokens before the end, the nearer one first, each at most n_batch back', () => {
    expect(checkpointCut(0, 1000, 2048, 512)).toBe(1000 - 516);
    expect(checkpointCut(484, 1000, 2048, 512)).toBe(996);
    expect(checkpointCut(996, 1000, 2048, 512)).toBeUndefined();
    // n_batch 16: min(16, 4 + 16) = 16 tokens before the end, then 4.
    expect(checkpointCut(0, 100, 16, 16)).toBe(84);
    expect(checkpointCut(84, 100, 16, 16)).toBe(96);
    // A prompt of 4 tokens or fewer has nothing before its last 4 to checkpoint.
    expect(checkpointCut(0, 4, 2048, 512)).toBeUndefined();
    expect(checkpointCut(0, 5, 2048, 512)).toBe(1);
  });
});

describe('CheckpointList', () => {
  it('keeps at most max, evicting the oldest, and counts their bytes', () => {
    const l = new CheckpointList();
    for (const n of [10, 20, 30, 40]) l.add(ckpt(n, n), 3);
    expect(l.count).toBe(3);
    expect(l.bytes).toBe(20 + 30 + 40);
    expect(l.newestWithin(15)).toBeUndefined();
    expect(l.newestWithin(35)?.nTokens).toBe(30);
    expect(l.lastTokens).toBe(40);
  });

  it('takes none with max 0', () => {
    const l = new CheckpointList();
    l.add(ckpt(5), 0);
    expect([l.count, l.bytes, l.lastTokens]).toEqual([0, 0, -1]);
  });

  it('drops what lies past a position, and a new checkpoint replaces those at or after it', () => {
    const l = new CheckpointList();
    for (const n of [10, 20, 30]) l.add(ckpt(n), 8);
    l.dropAbove(25);
    expect([l.count, l.lastTokens, l.bytes]).toEqual([2, 20, 20]);
    l.add(ckpt(15), 8);
    expect([l.count, l.lastTokens]).toEqual([2, 15]);
    expect(l.newestWithin(100)?.nTokens).toBe(15);
    l.clear();
    expect([l.count, l.bytes, l.newestWithin(100)]).toEqual([0, 0, undefined]);
  });
});
