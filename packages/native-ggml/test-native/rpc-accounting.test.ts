// rpcAccounting (native/hydra_rpc_stats.cpp): a head's client calls to a stock ggml-rpc-server,
// counted by command in ggml's backend tables, and the kernel's TCP_INFO of upstream's connection.
import type { ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RpcAccounting } from '../src/index.js';
import { CPU_PEER, run, startStockRpcServer, tinyModel } from './helpers.js';

const fixture = fileURLToPath(new URL('./fixtures/rpc-accounting.mjs', import.meta.url));
const STEPS = 16;

describe('rpcAccounting against a stock ggml-rpc-server', () => {
  let server: { endpoint: string; child: ChildProcess };
  let model: string;
  beforeAll(async () => {
    model = await tinyModel('f32');
    server = await startStockRpcServer(CPU_PEER);
  });
  afterAll(() => {
    server?.child.kill('SIGKILL');
  });

  it('counts every decode step: one graph (recomputed once the same), the replies, the kernel bytes', async () => {
    const { stdout } = await run(process.execPath, [fixture, model, server.endpoint, String(STEPS)], 120_000);
    const { before, after } = JSON.parse(stdout.trim().split('\n').at(-1)!) as {
      before: RpcAccounting;
      after: RpcAccounting;
    };
    const a = before.peers.find((p) => p.endpoint === server.endpoint)!;
    const b = after.peers.find((p) => p.endpoint === server.endpoint)!;
    // The load went over the same connection: buffers allocated, weights set (not hashed: under 10 MiB).
    expect(a.commands.alloc_buffer).toBeGreaterThan(0);
    expect(a.commands.set_tensor).toBeGreaterThan(0);
    expect(a.commands.set_tensor_hash).toBe(0);
    const d = (k: keyof RpcAccounting['peers'][number]['commands']) => b.commands[k] - a.commands[k];
    // Every layer on the peer: each step is one graph there, the same graph from the second on.
    expect(d('graph_compute') + d('graph_recompute')).toBe(STEPS);
    expect(d('graph_recompute')).toBeGreaterThanOrEqual(STEPS - 1);
    // Its output comes back: at least one reply per step, each a round trip.
    expect(d('get_tensor')).toBeGreaterThanOrEqual(STEPS);
    expect(b.roundTrips - a.roundTrips).toBe(
      d('get_tensor') + d('copy_tensor') + d('alloc_buffer') + d('set_tensor_hash'),
    );
    expect(b.waitReplyMs).toBeGreaterThan(a.waitReplyMs);
    // The kernel's counters of upstream's own socket: at least the asked-for bytes came back.
    expect(a.tcp).not.toBeNull();
    expect(b.tcp!.fd).toBe(a.tcp!.fd);
    const asked = b.commandBytes.get_tensor - a.commandBytes.get_tensor;
    expect(b.tcp!.bytesReceived - a.tcp!.bytesReceived).toBeGreaterThanOrEqual(asked);
    expect(b.tcp!.bytesSent).toBeGreaterThan(a.tcp!.bytesSent);
    // initBackend installed the local devices too.
    expect(after.local.find((l) => l.device === 'CPU')).toBeDefined();
  });
});
