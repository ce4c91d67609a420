// Which llama.cpp devices a model load may use, and a device list that never dials a lost peer.
//
// llama.cpp keeps every registered ggml-RPC device for the life of the process, and its client
// keeps one dispatcher (one connection and one thread) per endpoint string for as long as anything
// holds it. Two consequences shape this module:
// - A load without explicit `devices` uses every registered device, a dead peer's included, and
//   would dial it (upstream aborts; with the park hook the load thread hangs). So once any peer
//   was registered, every load names its devices: the local ones plus the RPC devices of the peers
//   configured now.
// - `listDevices()` asks every RPC device for its memory (a ggml-RPC round trip on the calling
//   thread). Against a lost peer that round trip never returns (its dispatcher is parked), which on
//   the JS thread would freeze the whole engine. The list is therefore only refreshed while every
//   registered peer is believed alive; otherwise the last good list is served.
import { addRpcServer, type Device, listDevices } from '@hydra-engine/native-ggml';
import { HydraError } from '../errors.js';

const endpoints = new Map<string, string[]>();
const buffers = new Map<string, string[]>();
const lost = new Set<string>();
let local: Device[] | undefined;
let last: Device[] = [];

function localDevices(): Device[] {
  if (!local) {
    // Before any registration listDevices() holds only this host's devices; after it (a head
    // started with --rpc registers first) RPC devices are filtered out by name.
    local = listDevices().filter((d) => !d.name.startsWith('RPC'));
  }
  return local;
}

/**
 * Registers a peer's devices (HELLO-probed first by native-ggml) and remembers their names.
 * Registering an endpoint again returns the same devices.
 */
export async function registerPeer(endpoint: string): Promise<{ names: string[]; bufferTypes: string[] }> {
  if (lost.has(endpoint)) {
    // Upstream would hand the parked dispatcher of the lost connection back (and hang).
    throw new HydraError(
      'HYDRA_ERR_PEER_LOST',
      `peer ${endpoint} was lost earlier in this process; add it again under another spelling of its address (e.g. localhost:PORT)`,
      { keys: ['rpc_servers'], details: { peer: endpoint } },
    );
  }
  localDevices();
  const devices = await addRpcServer(endpoint);
  const names = devices.map((d) => d.name);
  const bufferTypes = devices.map((d) => d.bufferType);
  endpoints.set(endpoint, names);
  buffers.set(endpoint, bufferTypes);
  return { names, bufferTypes };
}

/** Marks a peer lost: the device list stops refreshing (see the module comment). */
export function markPeerLost(endpoint: string): void {
  lost.add(endpoint);
}

/** Peers ever lost in this process. */
export function lostPeers(): string[] {
  return [...lost];
}

/**
 * The device list for STATUS and HELLO. Refreshed from llama.cpp only while no registered peer
 * was ever lost; afterwards the last good list (memory figures frozen), with lost peers' devices
 * left out.
 */
export function safeDevices(): Device[] {
  try {
    if (lost.size === 0) {
      last = listDevices();
      return last;
    }
  } catch {
    return last;
  }
  const dead = new Set([...lost].flatMap((e) => endpoints.get(e) ?? []));
  return last.filter((d) => !dead.has(d.name));
}

/**
 * Explicit `devices` and overrides for a load with `rpcServers` configured now, or `undefined`
 * when no peer was ever registered in this process (llama.cpp's default selection is then safe).
 * Configured device names outside the allowed set are dropped, as are overrides that place
 * tensors on a peer not configured now; with devices dropped a `tensorSplit` no longer lines up
 * and is dropped too. No allowed device at all means the CPU alone (`['CPU']`, which llama.cpp
 * treats like its default placement on a host without GPUs).
 */
export function loadDevices(
  rpcServers: readonly string[],
  configured: { devices?: string[] | undefined; overrides?: string[] | undefined },
): { devices: string[]; overrides: string[] | undefined; dropped: boolean } | undefined {
  if (endpoints.size === 0) return undefined;
  const rpc = rpcServers.flatMap((e) => endpoints.get(e) ?? []);
  const gpus = localDevices()
    .filter((d) => d.type !== 'cpu' && d.type !== 'accel')
    .map((d) => d.name);
  // Upstream's default order: RPC devices first (fewer transfers), then local GPUs.
  const allowed = [...rpc, ...gpus];
  const wanted = configured.devices ?? [];
  let devices = wanted.length > 0 ? wanted.filter((n) => allowed.includes(n)) : allowed;
  const dropped = wanted.length > 0 && devices.length !== wanted.length;
  if (devices.length === 0) devices = ['CPU'];
  const keep = new Set(rpcServers);
  const overrides = configured.overrides?.filter((spec) => {
    const m = /=RPC\d+\[(.+)\]$/.exec(spec);
    return !m || keep.has(m[1]!);
  });
  return { devices, overrides, dropped };
}
