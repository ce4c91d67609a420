// Runs a long build step with its output passed through and a progress line every interval: a
// CUDA build compiles single files for minutes, and ninja writes a line only when a step ends.
import { spawn } from 'node:child_process';

/**
 * Runs `command args` (stdout and stderr passed through line by line to `out`) and writes
 * `<label>: N/M steps (P%), S s` every `intervalMs` from ninja's `[N/M]` lines, or `S s` before
 * the first one. Resolves when the command exits 0; rejects with its exit code or signal otherwise.
 */
export function runWithProgress(command, args, options) {
  const { cwd, label, intervalMs = 30_000, out = process.stderr, env = process.env } = options;
  const started = Date.now();
  let step;
  return new Promise((resolve, reject) => {
    const child = spawn(command, args, { cwd, env, stdio: ['ignore', 'pipe', 'pipe'] });
    const pass = (stream) => {
      let rest = '';
      stream.on('data', (chunk) => {
        const text = rest + chunk.toString();
        const lines = text.split('\n');
        rest = lines.pop() ?? '';
        for (const line of lines) {
          const m = /^\[(\d+)\/(\d+)\]/.exec(line);
          if (m) step = [Number(m[1]), Number(m[2])];
          out.write(`${line}\n`);
        }
      });
      stream.on('end', () => {
        if (rest) out.write(`${rest}\n`);
      });
    };
    pass(child.stdout);
    pass(child.stderr);
    const timer = setInterval(() => {
      const s = Math.round((Date.now() - started) / 1000);
      const where = step ? `${step[0]}/${step[1]} steps (${Math.floor((100 * step[0]) / step[1])}%), ` : '';
      out.write(`${label}: ${where}${s} s\n`);
    }, intervalMs);
    child.on('error', (err) => {
      clearInterval(timer);
      reject(err);
    });
    child.on('close', (code, signal) => {
      clearInterval(timer);
      if (code === 0) resolve();
      else reject(new Error(`${label}: ${command} exited ${signal ?? code}`));
    });
  });
}
