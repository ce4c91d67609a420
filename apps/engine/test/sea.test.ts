import { spawn } from 'node:child_process';
import { copyFileSync, mkdtempSync, readdirSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { probeRpcServer } from '@hydra-engine/native-ggml';
import { expect, it } from 'vitest';
import { freeLoopbackPort } from '../src/ports.js';
import { tinyModel } from './helpers.js';

const dist = new URL('../dist/', import.meta.url).pathname;

it('the single executable starts from a copied folder with a clean environment and serves a completion', async () => {
  const model = await tinyModel();
  const dir = mkdtempSync(join(tmpdir(), 'hydra-sea-'));
  for (const name of readdirSync(dist)) {
    if (
      name === 'hydra-engine' ||
      name.endsWith('.node') ||
      name.endsWith('.cjs') ||
      /\.so(\.\d+)?$/.test(name)
    ) {
      copyFileSync(join(dist, name), join(dir, name));
    }
  }
  const exe = join(dir, 'hydra-engine');
  const { chmodSync } = await import('node:fs');
  chmodSync(exe, 0o755);
  // No PATH, no HOME, no NODE_*: nothing of this machine's Node install is reachable.
  const rpcPort = await freeLoopbackPort();
  const args = ['-m', model, '--port', '0', '--progress', 'lines', '-t', '1', '--rpc-port', String(rpcPort)];
  const p = spawn(exe, args, {
    env: {},
    cwd: dir,
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let buf = '';
  try {
    const url = await new Promise<string>((resolve, reject) => {
      let http = '';
      p.stderr.on('data', (d) => {
        buf += d;
        http ||= /HTTP on (http:\/\/\S+)/.exec(buf)?.[1] ?? '';
        if (http && /model ready/.test(buf)) resolve(http);
      });
      p.on('exit', (code) => reject(new Error(`exited ${code}: ${buf}`)));
    });
    const res = await fetch(`${url}/v1/completions`, {
      method: 'POST',
      body: JSON.stringify({ prompt: 'Hello world', max_tokens: 6, temperature: 0 }),
    });
    expect(res.status).toBe(200);
    // A normal start prints no Node warning (the SEA require one came from msgpackr's optional addon).
    expect(buf).not.toMatch(/\(node:\d+\) |Warning: /);
    const body = (await res.json()) as {
      usage: { completion_tokens: number };
      choices: { finish_reason: string }[];
    };
    expect(body.usage.completion_tokens).toBe(6);
    expect(body.choices[0]!.finish_reason).toBe('length');
    // ggml-RPC is served by copies of the executable (`hydra-engine rpc-host`)
    expect((await probeRpcServer(`127.0.0.1:${rpcPort}`, 10_000)).major).toBe(6);
  } finally {
    p.kill('SIGTERM');
  }
});
