import { readdirSync, readFileSync, readlinkSync } from 'node:fs';
import { connect } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type EngineProcess, health, metrics, sleep, spawnEngine, tinyModel, waitFor } from './lib/engine.js';
import { recordFigures } from './lib/figures.js';
import { CMD, command, RpcConn } from './lib/ggml-rpc.js';
import { frame } from './lib/hydra-wire.js';

/**
 * Containment and caps of the merged port against the real engine: ggml-RPC sessions run in host
 * processes (a host that dies ends its session only), and neither idle Hydra sessions nor
 * connections that stall after 0x0E from one address lock another address out (127.0.0.2 is the
 * second source address). The default allowlist (loopback) admits both.
 */

let eng: EngineProcess;
const fig: Record<string, unknown> = {};

beforeAll(async () => {
  eng = await spawnEngine(['-m', await tinyModel(), '-t', '1', '-c', '512'], { rpc: true });
});

afterAll(async () => {
  await eng?.stop();
  recordFigures('port-containment', fig);
});

/** The child processes of `pid` (the engine's ggml-RPC hosts). */
function children(pid: number): number[] {
  const out: number[] = [];
  for (const task of readdirSync(`/proc/${pid}/task`)) {
    const text = readFileSync(`/proc/${pid}/task/${task}/children`, 'utf8').trim();
    if (text) out.push(...text.split(/\s+/).map(Number));
  }
  return out;
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

/** The process among `pids` that holds the server side of the loopback connection from `clientPort`. */
function holderOf(pids: number[], serverPort: number, clientPort: number): number | undefined {
  const hex = (n: number) => n.toString(16).toUpperCase().padStart(4, '0');
  let inode: string | undefined;
  for (const line of readFileSync('/proc/net/tcp', 'utf8').split('\n').slice(1)) {
    const f = line.trim().split(/\s+/);
    if (f.length < 10) continue;
    if (f[1]!.endsWith(`:${hex(serverPort)}`) && f[2]!.endsWith(`:${hex(clientPort)}`)) inode = f[9];
  }
  if (inode === undefined) return undefined;
  for (const pid of pids) {
    for (const fd of readdirSync(`/proc/${pid}/fd`)) {
      try {
        if (readlinkSync(`/proc/${pid}/fd/${fd}`) === `socket:[${inode}]`) return pid;
      } catch {
        // fd closed meanwhile
      }
    }
  }
  return undefined;
}

async function status(localAddress: string, timeoutMs = 3000): Promise<boolean> {
  const s = connect({ port: eng.rpcPort!, host: '127.0.0.1', localAddress });
  s.on('error', () => {});
  let got = Buffer.alloc(0);
  s.on('data', (d: Buffer) => {
    got = Buffer.concat([got, d]);
  });
  s.once('connect', () => s.write(frame(0x31, Buffer.from('{}'))));
  const end = Date.now() + timeoutMs;
  while (Date.now() < end && !s.destroyed) {
    if (got.byteLength >= 9 && got.byteLength >= 9 + Number(got.readBigUInt64LE(1))) {
      s.destroy();
      return JSON.parse(got.subarray(9).toString()).success === true;
    }
    await sleep(10);
  }
  s.destroy();
  return false;
}

describe('ggml-RPC containment (sessions in host processes)', () => {
  it('a host process that dies mid-session (SIGSEGV) ends that session only: HTTP, the other session and new sessions go on', async () => {
    const a = await RpcConn.open(eng.rpcPort!);
    expect((await a.hello()).major).toBe(6);
    const bufA = await a.alloc(4096n);
    const b = await RpcConn.open(eng.rpcPort!, { localAddress: '127.0.0.2' });
    await b.hello();
    const bufB = await b.alloc(4096n);
    const crashedBefore = (await metrics(eng.url)).get('hydra_rpc_sessions_crashed_total') ?? 0;
    const pid = holderOf(children(eng.pid), eng.rpcPort!, a.socket.localPort!);
    expect(pid).toBeDefined();
    process.kill(pid!, 'SIGSEGV');
    expect(await a.waitClosed(5_000)).toBe(true);
    void bufA;
    // the engine and the other session are untouched
    expect((await health(eng.url)).state).toBe('ready');
    expect(await b.base(bufB.ptr)).not.toBe(0n);
    const c = await RpcConn.open(eng.rpcPort!);
    expect((await c.hello()).major).toBe(6);
    expect(await c.deviceCount()).toBe(1);
    const res = await fetch(`${eng.url}/v1/completions`, {
      method: 'POST',
      body: JSON.stringify({ prompt: 'hello', max_tokens: 4, temperature: 0 }),
    });
    expect(res.status).toBe(200);
    await waitFor(
      async () =>
        ((await metrics(eng.url)).get('hydra_rpc_sessions_crashed_total') ?? 0) === crashedBefore + 1,
      5_000,
      'crash counted',
    );
    expect(eng.log()).toMatch(new RegExp(`host process ${pid} killed by SIGSEGV`));
    b.destroy();
    c.destroy();
    expect(eng.exited()).toBeUndefined();
    fig.crash = { signal: 'SIGSEGV', engineUp: true, otherSessionServed: true, newSessionServed: true };
  });

  it('four connections that send only 0x0E from one address: three run, one waits, another address still gets a session', async () => {
    const stalled: RpcConn[] = [];
    for (let i = 0; i < 4; i++) {
      const s = await RpcConn.open(eng.rpcPort!);
      s.write(Buffer.from([CMD.HELLO]));
      stalled.push(s);
    }
    await sleep(500);
    const other = await RpcConn.open(eng.rpcPort!, { localAddress: '127.0.0.2' });
    const t0 = Date.now();
    expect((await other.hello()).major).toBe(6);
    const helloMs = Date.now() - t0;
    // three of the pool's four hosts are the stalled address's; its fourth connection waits
    const m = await metrics(eng.url);
    expect(m.get('hydra_rpc_sessions_queued')).toBe(1);
    fig.stalledHello = {
      stalled: stalled.length,
      queued: m.get('hydra_rpc_sessions_queued'),
      otherAddressHelloMs: helloMs,
    };
    other.destroy();
    for (const s of stalled) s.destroy();
    expect((await health(eng.url)).state).toBe('ready');
  });
});

describe('Hydra session caps and half-close', () => {
  it('1024 idle Hydra sessions from 127.0.0.1 do not lock 127.0.0.2 out of either protocol', async () => {
    const idle = [];
    for (let i = 0; i < 1024; i++) {
      const s = connect({ port: eng.rpcPort!, host: '127.0.0.1' });
      s.on('error', () => {});
      s.once('connect', () => s.write(frame(0x31, Buffer.from('{}'))));
      idle.push(s);
      if (i % 64 === 63) await sleep(20);
    }
    await sleep(1000);
    const open = idle.filter((s) => !s.destroyed).length;
    const t0 = Date.now();
    expect(await status('127.0.0.2')).toBe(true);
    const statusMs = Date.now() - t0;
    const rpc = await RpcConn.open(eng.rpcPort!, { localAddress: '127.0.0.2' });
    expect((await rpc.hello()).major).toBe(6);
    rpc.destroy();
    const h0 = Date.now();
    expect((await health(eng.url)).state).toBe('ready');
    const m = await metrics(eng.url);
    fig.idleHydra = {
      opened: idle.length,
      stillOpen: open,
      refused: m.get('hydra_hydra_sessions_refused_total'),
      otherAddressStatusMs: statusMs,
      healthMs: Date.now() - h0,
    };
    expect(open).toBeLessThanOrEqual(128);
    for (const s of idle) s.destroy();
    // The next test connects from 127.0.0.1 again: it must not race the engine's count of these
    // closes against the per-source session cap.
    await waitFor(
      async () => (await metrics(eng.url)).get('hydra_hydra_sessions_active') === 0,
      10_000,
      'idle Hydra sessions counted closed',
    );
  }, 60_000);

  it('a Hydra client that half-closes right after its request gets the answer', async () => {
    const reply = await new Promise<Buffer>((resolve, reject) => {
      const s = connect({ port: eng.rpcPort!, host: '127.0.0.1' });
      let got = Buffer.alloc(0);
      s.on('data', (d: Buffer) => {
        got = Buffer.concat([got, d]);
      });
      s.on('error', reject);
      s.on('close', () => resolve(got));
      s.once('connect', () => {
        s.write(frame(0x31, Buffer.from('{}')));
        s.end();
      });
    });
    expect(reply.byteLength).toBeGreaterThan(9);
    expect(JSON.parse(reply.subarray(9).toString())).toMatchObject({ success: true, state: 'ready' });
  });
});

describe('host processes die with the engine', () => {
  it('SIGKILL of the engine: every ggml-RPC host process exits', async () => {
    const s = await RpcConn.open(eng.rpcPort!);
    await s.hello();
    s.write(command(CMD.DEVICE_COUNT));
    await s.reply();
    const hosts = children(eng.pid);
    expect(hosts.length).toBeGreaterThanOrEqual(1);
    eng.proc.kill('SIGKILL');
    await waitFor(async () => hosts.every((p) => !alive(p)), 10_000, 'hosts gone');
    fig.orphans = { hosts: hosts.length, aliveAfterEngineKill: hosts.filter(alive).length };
    s.destroy();
  });
});
