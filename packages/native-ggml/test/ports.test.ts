import { readFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { expect, it } from 'vitest';
import { freeLoopbackPort } from '../src/index.js';

// listen(0) hands out ports of the kernel's ephemeral range, the one other processes' outgoing
// connections draw from; the helper must pick below it, and a port it returns must be bindable.
it('returns a bindable loopback port below the ephemeral range', async () => {
  const low = Number(readFileSync('/proc/sys/net/ipv4/ip_local_port_range', 'utf8').trim().split(/\s+/)[0]);
  for (let i = 0; i < 5; i++) {
    const port = await freeLoopbackPort();
    expect(port).toBeGreaterThanOrEqual(20000);
    expect(port).toBeLessThan(low);
    const s = createServer();
    await new Promise<void>((resolve, reject) => {
      s.once('error', reject);
      s.listen(port, '127.0.0.1', resolve);
    });
    await new Promise<void>((resolve) => s.close(() => resolve()));
  }
});
