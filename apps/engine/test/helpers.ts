import { spawn } from 'node:child_process';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { writeSyntheticModel } from '@hydra-engine/native-ggml/synth';
import { parseServeArgs } from '../src/args.js';
import { type RunningEngine, startEngine } from '../src/serve.js';

export const CLI = new URL('../dist/cli.js', import.meta.url).pathname;

export async function tinyModel(): Promise<string> {
  const dir = mkdtempSync(join(tmpdir(), 'hydra-engine-test-'));
  const out = join(dir, 'tiny.gguf');
  await writeSyntheticModel({ arch: 'llama', shape: 'tiny', quant: 'q8_0', seed: 3, out });
  return out;
}

const quiet = { write: () => true };

/** An in-process engine on 127.0.0.1 with an ephemeral port, model loaded. */
export async function engineWith(flags: string[]): Promise<RunningEngine & { url: string }> {
  const running = await startEngine(
    parseServeArgs(['--port', '0', '--progress', 'off', '-t', '1', ...flags]),
    { log: quiet },
  );
  await running.loaded;
  return Object.assign(running, { url: `http://127.0.0.1:${running.httpPort}` });
}

/** Runs the CLI as a process; resolves with exit code and output. */
export function runCli(args: string[], timeoutMs = 20_000): Promise<{ code: number | null; out: string }> {
  return new Promise((resolve) => {
    const p = spawn(process.execPath, [CLI, ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    p.stdout.on('data', (d) => {
      out += d;
    });
    p.stderr.on('data', (d) => {
      out += d;
    });
    const timer = setTimeout(() => p.kill('SIGKILL'), timeoutMs);
    p.on('exit', (code) => {
      clearTimeout(timer);
      resolve({ code, out });
    });
  });
}

export async function waitFor(check: () => Promise<boolean>, timeoutMs: number): Promise<void> {
  const end = Date.now() + timeoutMs;
  while (Date.now() < end) {
    if (await check()) return;
    await new Promise((r) => setTimeout(r, 25));
  }
  throw new Error(`condition not met in ${timeoutMs} ms`);
}
