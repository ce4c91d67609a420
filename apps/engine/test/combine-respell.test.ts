import { afterAll, expect, it } from 'vitest';
import { currentName, loadDevices, markPeerLost, registerPeer } from '../src/combine/devices.js';
import { freeLoopbackPort } from '../src/ports.js';
import { engineWith } from './helpers.js';

// Issue 22: a peer registered again after a loss gets new device names (RPC1, ...) and its buffer
// types a new endpoint spelling; what the operator wrote for its first registration keeps naming it.
const engines: { close(): Promise<void> }[] = [];
afterAll(async () => {
  for (const e of engines.reverse()) await e.close();
});

it("maps a rejoined peer's old device and buffer type names to its new ones in devices and overrides", async () => {
  // The peer stays up while the head marks it lost, so every registration's session stays open
  // beside the next one's probes: room for them all (the default lets one source run 3 at once,
  // and a fourth waits for a new host process, slow on a loaded 2-core machine).
  const peer = await engineWith(['--rpc-port', String(await freeLoopbackPort()), '--rpc-pool-size', '8']);
  engines.push(peer);
  const endpoint = `127.0.0.1:${peer.rpcPort}`;
  const first = await registerPeer(endpoint);
  expect(first.names).toEqual(['RPC0']);
  const oldBuft = first.bufferTypes[0]!;
  expect(oldBuft).toContain(endpoint);
  const written = { devices: ['RPC0'], overrides: [`blk\\.1\\.=${oldBuft}`, 'output=CPU'] };
  expect(loadDevices([endpoint], written)).toMatchObject({ devices: ['RPC0'], overrides: written.overrides });

  markPeerLost(endpoint);
  const again = await registerPeer(endpoint);
  expect(again.names).toEqual(['RPC1']);
  const newBuft = again.bufferTypes[0]!;
  expect(newBuft).not.toBe(oldBuft);
  expect(newBuft).toContain(`0177.0.0.1:${peer.rpcPort}`);
  const sel = loadDevices([endpoint], written)!;
  expect(sel.devices).toEqual(['RPC1']);
  expect(sel.dropped).toBe(false);
  expect(sel.overrides).toEqual([`blk\\.1\\.=${newBuft}`, 'output=CPU']);
  expect(currentName('RPC0')).toBe('RPC1');
  expect(currentName(oldBuft)).toBe(newBuft);

  // A second loss: both earlier spellings name the third registration.
  markPeerLost(endpoint);
  const third = await registerPeer(endpoint);
  expect(third.names).toEqual(['RPC2']);
  expect(loadDevices([endpoint], { devices: ['RPC0'] })!.devices).toEqual(['RPC2']);
  expect(loadDevices([endpoint], { devices: ['RPC1'] })!.devices).toEqual(['RPC2']);
  expect(currentName(oldBuft)).toBe(third.bufferTypes[0]);
}, 60_000);
