import { expect, it } from 'vitest';
// @ts-expect-error: a plain .mjs build script without types
import { runWithProgress } from '../scripts/progress.mjs';

// A child that writes ninja's status lines slowly, as a long CUDA compile does.
const NINJA_LIKE = `
const lines = ['[1/4] Building CXX a.o', '[2/4] Building CXX b.o', '[3/4] Building CUDA c.o', '[4/4] Linking x.node'];
let i = 0;
const t = setInterval(() => { process.stdout.write(lines[i++] + '\\n'); if (i === lines.length) { clearInterval(t); } }, 120);
`;

it('passes the build output through and writes a progress line every interval', async () => {
  let text = '';
  const out = {
    write(t: string) {
      text += t;
    },
  };
  await runWithProgress(process.execPath, ['-e', NINJA_LIKE], {
    label: 'hydra native-ggml: building',
    intervalMs: 100,
    out,
  });
  expect(text).toContain('[4/4] Linking x.node\n');
  const progress = text.split('\n').filter((l) => l.startsWith('hydra native-ggml: building: '));
  expect(progress.length).toBeGreaterThanOrEqual(3);
  expect(progress.some((l) => /: \d\/4 steps \(\d+%\), \d+ s$/.test(l))).toBe(true);
});

it('rejects with the exit code of a failed build', async () => {
  await expect(
    runWithProgress(process.execPath, ['-e', 'process.exit(3)'], {
      label: 'b',
      intervalMs: 1000,
      out: { write() {} },
    }),
  ).rejects.toThrow(/exited 3/);
});
