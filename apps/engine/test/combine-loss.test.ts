import { type ChildProcess, spawn } from 'node:child_process';
import { probeRpcServer } from '@hydra-engine/native-ggml';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { freePort, stream } from './control-helpers.js';
import { CLI, engineWith, tinyModel, waitFor } from './helpers.js';

interface Proc {
  url: string;
  rpc: string;
  child: ChildProcess;
  log(): string;
}

/** An engine as its own process (a peer must be killable; a head's parked threads stay its own). */
async function spawnEngine(flags: string[], rpcPortWanted?: number): Promise<Proc> {
  const port = await freePort();
  const rpcPort = rpcPortWanted ?? (await freePort());
  const child = spawn(
    process.execPath,
    [CLI, '--port', String(port), '--rpc-port', String(rpcPort), '--progress', 'off', '-t', '1', ...flags],
    { stdio: ['ignore', 'ignore', 'pipe'] },
  );
  let log = '';
  child.stderr!.on('data', (d) => {
    log += d;
  });
  const url = `http://127.0.0.1:${port}`;
  await waitFor(async () => {
    if (child.exitCode !== null) throw new Error(`engine exited ${child.exitCode}: ${log}`);
    const h = await fetch(`${url}/health`).then(
      (r) => r.json() as Promise<{ state: string }>,
      () => undefined,
    );
    if (h?.state === 'error') throw new Error(`engine failed to load: ${log}`);
    return h !== undefined && (flags.includes('-m') ? h.state === 'ready' : true);
  }, 60_000);
  return { url, rpc: `127.0.0.1:${rpcPort}`, child, log: () => log };
}

async function greedy(url: string, prompt: string): Promise<{ status: number; text: string }> {
  const res = await fetch(`${url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ prompt, max_tokens: 16, temperature: 0, ignore_eos: true }),
  });
  const body = (await res.json()) as { choices?: { text: string }[] };
  return { status: res.status, text: body.choices?.[0]?.text ?? '' };
}

describe('peer loss: kill -9 of the peer during a streamed generation', () => {
  const PROMPT = 'Hello world, this is a test';
  let tiny: string;
  let solo: string;
  const procs: ChildProcess[] = [];
  beforeAll(async () => {
    tiny = await tinyModel();
    const e = await engineWith(['-m', tiny]);
    solo = (await greedy(e.url, PROMPT)).text;
    await e.close();
  }, 60_000);
  afterAll(() => {
    for (const p of procs) if (p.exitCode === null) p.kill('SIGKILL');
  });

  it('ends the request with HYDRA_ERR_PEER_LOST, stays up, reports degraded, serves SOLO within 10 s, and rejoins the restarted peer', async () => {
    const peer = await spawnEngine([]);
    procs.push(peer.child);
    const head = await spawnEngine([
      '-m',
      tiny,
      '--rpc',
      peer.rpc,
      '--device',
      'RPC0',
      '-ngl',
      '99',
      '-c',
      '4096',
    ]);
    procs.push(head.child);
    expect(await greedy(head.url, PROMPT)).toEqual({ status: 200, text: solo });

    let killedAt = 0;
    const started = performance.now();
    const out = await stream(
      head.url,
      { prompt: PROMPT, max_tokens: 4000, temperature: 0, ignore_eos: true },
      () => {
        killedAt = performance.now();
        peer.child.kill('SIGKILL');
      },
    );
    const ended = performance.now();
    expect(killedAt).toBeGreaterThan(0);
    expect(out.error?.code).toBe('HYDRA_ERR_PEER_LOST');
    expect(out.finish).toBeUndefined();
    // Nothing after the loss: the text is a prefix of the greedy SOLO continuation's kind (ASCII
    // words of the tiny vocabulary), never a garbage tail; a bounded wait, not a hang.
    expect(ended - started).toBeLessThan(20_000);

    let health: { status: string; state: string; degraded?: { reason: string; since: string } } | undefined;
    await waitFor(async () => {
      const now = await fetch(`${head.url}/health`).then(
        (r) => r.json() as Promise<NonNullable<typeof health>>,
      );
      health = now;
      return now.state === 'ready' && now.status === 'degraded';
    }, 10_000);
    const again = await greedy(head.url, PROMPT);
    const recovered = performance.now() - killedAt;
    console.log(
      `peer loss: request ended ${(ended - killedAt).toFixed(0)} ms after kill -9; SOLO answered ${recovered.toFixed(0)} ms after it`,
    );
    expect(recovered).toBeLessThan(10_000);
    expect(again).toEqual({ status: 200, text: solo });
    expect(health!.degraded!.reason).toMatch(/peer|ggml-RPC/);

    const status = (await fetch(`${head.url}/control/status`).then((r) => r.json())) as {
      success: boolean;
      mode: string;
      peers: unknown[];
      degraded?: { peers: string[] };
    };
    expect(status).toMatchObject({ success: true, mode: 'solo', peers: [] });
    expect(status.degraded!.peers).toEqual([peer.rpc]);
    // Every port of the head still answers: HTTP above, the merged port's ggml-RPC HELLO here.
    await expect(probeRpcServer(head.rpc, 2000)).resolves.toMatchObject({ major: 6 });
    expect(head.child.exitCode).toBeNull();

    // The peer comes back at the same address; configuring it again rejoins it (registered under
    // another spelling of the address, with new device names), and COMBINE serves the same tokens.
    const back = await spawnEngine([], Number(peer.rpc.split(':')[1]));
    procs.push(back.child);
    const cfg = await fetch(`${head.url}/control/configure`, {
      method: 'POST',
      body: JSON.stringify({ rpc_servers: [peer.rpc], devices: ['RPC1'] }),
    });
    expect(await cfg.json()).toMatchObject({ success: true, tier: 'T3' });
    let rejoined:
      | { state: string; status: string; placement?: { device: string; description: string }[] }
      | undefined;
    await waitFor(async () => {
      rejoined = (await fetch(`${head.url}/health`).then((r) => r.json())) as NonNullable<typeof rejoined>;
      return rejoined.state === 'ready' && rejoined.status !== 'degraded';
    }, 30_000);
    expect(rejoined!.placement!.map((r) => r.device)).toEqual(['RPC1']);
    expect(await greedy(head.url, PROMPT)).toEqual({ status: 200, text: solo });
    const after = (await fetch(`${head.url}/control/status`).then((r) => r.json())) as {
      mode: string;
      peers: unknown[];
    };
    expect(after.mode).toBe('combined');
    expect(after.peers).toHaveLength(1);
  }, 120_000);
});
