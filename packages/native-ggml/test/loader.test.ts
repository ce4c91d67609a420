import { execFile } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { expect, it } from 'vitest';

const entry = fileURLToPath(new URL('../dist/index.js', import.meta.url));

it('throws one error naming every place it tried when the addon is missing', async () => {
  const script = `import('${entry}').then((m) => { try { m.listDevices(); } catch (e) { console.log(JSON.stringify({ code: e.code, message: e.message })); } })`;
  const out = await new Promise<string>((resolve, reject) =>
    execFile(
      process.execPath,
      ['-e', script],
      { env: { ...process.env, HYDRA_NATIVE_ADDON: '/nonexistent/hydra_ggml.node' } },
      (err, stdout) => (err ? reject(err) : resolve(stdout)),
    ),
  );
  const { code, message } = JSON.parse(out) as { code: string; message: string };
  expect(code).toBe('HYDRA_ERR_NATIVE_MISSING');
  expect(message).toContain('/nonexistent/hydra_ggml.node (missing)');
  expect(message).toContain('HYDRA_CUDA=1');
});
