import { type ChildProcess, spawn } from 'node:child_process';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { describeDevices, initBackend, listDevices } from '../src/index.js';
import { startStockRpcServer } from './helpers.js';

const procs: ChildProcess[] = [];
afterAll(() => {
  for (const p of procs) {
    if (p.exitCode !== null || p.signalCode !== null) continue;
    p.kill('SIGCONT');
    p.kill('SIGKILL');
  }
});

describe('describeDevices: device figures read off the JS thread', () => {
  beforeAll(() => {
    initBackend();
  });

  it('describes local devices as listDevices does', async () => {
    const listed = listDevices().filter((d) => !d.name.startsWith('RPC'));
    const described = await describeDevices(listed.map((d) => d.name));
    expect(
      described.map(({ name, type, description, total, bufferType }) => ({
        name,
        type,
        description,
        total,
        bufferType,
      })),
    ).toEqual(
      listed.map(({ name, type, description, total, bufferType }) => ({
        name,
        type,
        description,
        total,
        bufferType,
      })),
    );
    for (const d of described) expect(d.free).toBeGreaterThan(0);
  });

  it('refuses an unknown device name with HYDRA_ERR_NO_DEVICE', async () => {
    await expect(describeDevices(['NOPE9'])).rejects.toMatchObject({ code: 'HYDRA_ERR_NO_DEVICE' });
  });

  it('a peer that stops answering stalls only the read: the JS thread runs on and the process exits by itself', async () => {
    const { endpoint, child: server } = await startStockRpcServer(['CPU']);
    procs.push(server);
    // The child registers the peer, the peer is stopped (SIGSTOP: the connection stays open and
    // nothing answers), then the child asks for the peer's device memory and lets its loop drain.
    const script = `
      const n = await import(${JSON.stringify(join(import.meta.dirname, '../dist/index.js'))});
      n.initBackend();
      await n.addRpcServer(${JSON.stringify(endpoint)});
      process.send('registered');
      await new Promise((r) => process.once('message', r));
      let settled = false;
      n.describeDevices(['RPC0']).then(() => { settled = true; }, () => { settled = true; });
      const t0 = performance.now();
      await new Promise((r) => setTimeout(r, 300));
      process.send({ timerLateMs: performance.now() - t0 - 300, settled });
      process.disconnect();
    `;
    const child = spawn(process.execPath, ['--input-type=module', '-e', script], {
      stdio: ['ignore', 'ignore', 'pipe', 'ipc'],
    });
    procs.push(child);
    let err = '';
    child.stderr!.on('data', (d) => {
      err += d;
    });
    const messages: unknown[] = [];
    const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
    await new Promise<void>((resolve, reject) => {
      child.once('message', () => resolve());
      child.once('exit', () => reject(new Error(`child exited before registering: ${err}`)));
    });
    server.kill('SIGSTOP');
    child.on('message', (m) => messages.push(m));
    child.send('go');
    const code = await Promise.race([exited, new Promise((r) => setTimeout(() => r('hung'), 10_000))]);
    expect(code, err).toBe(0);
    expect(messages[0]).toMatchObject({ settled: false });
    expect((messages[0] as { timerLateMs: number }).timerLateMs).toBeLessThan(100);
  }, 30_000);
});
