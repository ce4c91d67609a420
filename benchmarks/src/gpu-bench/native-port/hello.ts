import { connect } from 'node:net';
import { sleep } from '../harness/index.js';

/**
 * Connect-to-reply times of `n` ggml-RPC HELLO requests (command 14, 24-byte payload) on fresh
 * connections, the first 20 left out as warm-up; a reply is complete at 36 bytes.
 */
export async function helloLatency(port: number, n = 300): Promise<number[]> {
  const out: number[] = [];
  const req = Buffer.alloc(1 + 8 + 24);
  req[0] = 14;
  req.writeBigUInt64LE(24n, 1);
  for (let i = 0; i < n; i++) {
    const t0 = performance.now();
    await new Promise<void>((resolve, reject) => {
      const s = connect(port, '127.0.0.1', () => s.write(req));
      let got = 0;
      s.setTimeout(10_000, () => {
        s.destroy();
        reject(new Error(`no HELLO reply from port ${port} in 10 s`));
      });
      s.on('data', (chunk) => {
        got += chunk.length;
        if (got >= 36) {
          out.push(performance.now() - t0);
          s.destroy();
          resolve();
        }
      });
      s.on('error', reject);
    });
    await sleep(2);
  }
  return out.slice(20);
}
