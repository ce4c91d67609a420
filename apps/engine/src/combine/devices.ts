// Which llama.cpp devices a model load may use, and a device list that never blocks on a peer.
//
// llama.cpp keeps every registered ggml-RPC device for the life of the process, and its client
// keeps one dispatcher (one connection and one thread) per endpoint string for as long as anything
// holds it. Two consequences shape this module:
// - A load without explicit `devices` uses every registered device, a dead peer's included, and
//   would dial it (upstream aborts; with the park hook the load thread hangs). So once any peer
//   was registered, every load names its devices: the local ones plus the RPC devices of the peers
//   configured now.
// - Asking an RPC device for its memory is a ggml-RPC round trip, and against a peer that died
//   (before the watchdog has noticed) it never returns. On the JS thread that froze the whole
//   engine: /health, SIGTERM and all. So the list served is always the last one read, and it is
//   refreshed in the background (at most once a second) by native-ggml's describeDevices, one
//   detached native thread per device; a device whose read has not come back is not asked again
//   (its last figures stay), so a dead peer costs one parked thread per device, never the JS
//   thread. Devices of peers marked lost are never listed or asked again.
// - A lost peer that comes back at the same address cannot be dialled under the same endpoint
//   string (the parked dispatcher would be handed back). It is registered again under another
//   spelling of the same IPv4 address: its first octet in octal, one more leading zero per loss
//   (`0177.0.0.1:PORT`, `00177.0.0.1:PORT` for 127.0.0.1). inet_aton reads these as the same
//   address in both resolvers that dial it (glibc's gethostbyname in llama.cpp, getaddrinfo in
//   Node's HELLO probe); a hex spelling would pass Node's and fail glibc's digits-and-dots check.
//   Its devices get new names (`RPC1`, ...); the configured endpoint stays the one written, and
//   the device and buffer type names written for its earlier registration (`devices: [RPC0]`,
//   `-ot ...=RPC0[127.0.0.1:PORT]`) are read as the new ones.
import { lookup } from 'node:dns/promises';
import { isIPv4 } from 'node:net';
import { addRpcServer, type Device, describeDevices, listDevices } from '@hydra-engine/native-ggml';
import { HydraError } from '../errors.js';

const endpoints = new Map<string, string[]>();
const buffers = new Map<string, string[]>();
/** Peers lost and not registered again since. */
const lost = new Set<string>();
/** Device names of every lost registration: never listed or used again. */
const dead = new Set<string>();
/** How many times each peer was lost (the spelling of its next registration); empty: none ever. */
const losses = new Map<string, number>();
/** The endpoint string each configured peer was registered under. */
const wire = new Map<string, string>();
/**
 * Device and buffer type names of earlier registrations of a peer that came back, to the names
 * of its current one (`RPC0` -> `RPC1`, `RPC0[127.0.0.1:5]` -> `RPC1[0177.0.0.1:5]`): what the
 * operator wrote keeps naming the same device across rejoins.
 */
const nameAlias = new Map<string, string>();
const buftAlias = new Map<string, string>();
let local: Device[] | undefined;
/**
 * A registration was started: llama.cpp may hold the peer's devices even when it did not finish
 * (a peer that died during it), so from then on every load names its devices.
 */
let attempted = false;
/** The last description read of every device listed, in llama.cpp's order (local, then peers'). */
const known = new Map<string, Device>();
/** Device reads in flight; a device is not asked again until its read settles. */
const asking = new Map<string, Promise<void>>();
let lastRefresh = Number.NEGATIVE_INFINITY;
/** The background refresh runs at most this often. */
export const DEVICE_REFRESH_MS = 1000;

function localDevices(): Device[] {
  if (!local) {
    // Before any registration this lists only this host's devices and dials nothing (registerPeer
    // calls it before its first registration).
    local = listDevices().filter((d) => !d.name.startsWith('RPC'));
    for (const d of local) if (!known.has(d.name)) known.set(d.name, d);
  }
  return local;
}

function listed(): Device[] {
  localDevices();
  return [...known.values()].filter((d) => !dead.has(d.name));
}

/** Starts a read of every listed device (local ones only without `rpc`) that has none in flight. */
function refresh(rpc = true): Promise<void>[] {
  if (rpc) lastRefresh = performance.now();
  const pending: Promise<void>[] = [];
  for (const { name } of listed()) {
    if (!rpc && name.startsWith('RPC')) continue;
    let p = asking.get(name);
    if (!p) {
      p = describeDevices([name]).then(
        ([d]) => {
          if (d && !dead.has(name)) known.set(name, d);
        },
        () => undefined,
      );
      asking.set(name, p);
      void p.finally(() => asking.delete(name));
    }
    pending.push(p);
  }
  return pending;
}

/**
 * Fresh device figures for a caller that can wait (a memory check before a rebuild): starts a read
 * of every device and waits for them up to `timeoutMs`; a device that has not answered by then
 * keeps its last figures. Without `rpc` only local devices are read: a load has just registered
 * (and so described) its peers, and another read with no model holding the peer's dispatcher
 * would be one more ggml-RPC connection to it.
 */
export async function freshDevices(timeoutMs = 2000, rpc = true): Promise<Device[]> {
  const pending = refresh(rpc);
  let timer: NodeJS.Timeout | undefined;
  await Promise.race([
    Promise.all(pending),
    new Promise<void>((resolve) => {
      timer = setTimeout(resolve, timeoutMs);
      timer.unref();
    }),
  ]);
  clearTimeout(timer);
  return listed();
}

/**
 * Registers a peer's devices (HELLO-probed first by native-ggml) and remembers their names.
 * Registering an endpoint again returns the same devices; a peer lost earlier is registered anew
 * under another spelling of its address (see the module comment).
 */
export async function registerPeer(endpoint: string): Promise<{ names: string[]; bufferTypes: string[] }> {
  const generation = losses.get(endpoint) ?? 0;
  const target = generation === 0 ? endpoint : await respell(endpoint, generation);
  localDevices();
  attempted = true;
  const devices = await addRpcServer(target);
  const names = devices.map((d) => d.name);
  const bufferTypes = devices.map((d) => d.bufferType);
  // A registration anew: every earlier name of these devices now means the new one.
  const before = generation > 0 ? endpoints.get(endpoint) : undefined;
  const beforeBufts = generation > 0 ? buffers.get(endpoint) : undefined;
  if (before && beforeBufts && before.length === names.length) {
    for (const [i, n] of names.entries()) {
      repoint(nameAlias, before[i]!, n);
      repoint(buftAlias, beforeBufts[i]!, bufferTypes[i]!);
    }
  }
  endpoints.set(endpoint, names);
  buffers.set(endpoint, bufferTypes);
  wire.set(endpoint, target);
  lost.delete(endpoint);
  // Described by the registration itself, off the JS thread.
  for (const d of devices) known.set(d.name, d);
  return { names, bufferTypes };
}

/** Maps `from` (and every name that meant it) to `to`. */
function repoint(aliases: Map<string, string>, from: string, to: string): void {
  for (const [k, v] of aliases) if (v === from) aliases.set(k, to);
  if (from !== to) aliases.set(from, to);
}

/** The device or buffer type name in force for one an operator wrote (an earlier registration's). */
export function currentName(name: string): string {
  return nameAlias.get(name) ?? buftAlias.get(name) ?? name;
}

/** `host:port` with the first octet of the IPv4 address in octal after `generation` zeros. */
async function respell(endpoint: string, generation: number): Promise<string> {
  const m = /^(.+):(\d+)$/.exec(endpoint);
  if (!m)
    throw new HydraError('HYDRA_ERR_BAD_VALUE', `peer ${endpoint} is not host:port`, {
      keys: ['rpc_servers'],
    });
  const host = m[1]!;
  let ip = host;
  if (!isIPv4(host)) {
    try {
      ip = (await lookup(host, { family: 4 })).address;
    } catch (err) {
      throw new HydraError('HYDRA_ERR_PEER_UNREACHABLE', `peer ${endpoint}: ${(err as Error).message}`, {
        keys: ['rpc_servers'],
        details: { peer: endpoint },
      });
    }
  }
  const [first, ...rest] = ip.split('.');
  return `${'0'.repeat(generation)}${Number(first).toString(8)}.${rest.join('.')}:${m[2]}`;
}

/** The device names a registered (and not lost) peer added; undefined when it is not registered. */
export function peerDeviceNames(endpoint: string): string[] | undefined {
  if (lost.has(endpoint)) return undefined;
  const names = endpoints.get(endpoint);
  return names ? [...names] : undefined;
}

/** Marks a peer lost: its devices are dead for good (never listed or asked again). */
export function markPeerLost(endpoint: string): void {
  for (const name of endpoints.get(endpoint) ?? []) dead.add(name);
  if (!lost.has(endpoint)) losses.set(endpoint, (losses.get(endpoint) ?? 0) + 1);
  lost.add(endpoint);
}

/**
 * The device list for STATUS and HELLO: the last figures read, returned at once, with a background
 * refresh started when the last one is older than {@link DEVICE_REFRESH_MS}. Never blocks.
 */
export function safeDevices(): Device[] {
  if (performance.now() - lastRefresh >= DEVICE_REFRESH_MS) refresh();
  return listed();
}

/** `<regex>=<buffer type>` with an earlier registration's buffer type replaced by the current one. */
function respelled(spec: string): string {
  const at = spec.lastIndexOf('=');
  const now = at > 0 ? buftAlias.get(spec.slice(at + 1)) : undefined;
  return now === undefined ? spec : `${spec.slice(0, at + 1)}${now}`;
}

/**
 * Explicit `devices` and overrides for a load with `rpcServers` configured now, or `undefined`
 * when no peer was ever registered in this process (llama.cpp's default selection is then safe).
 * Configured device names outside the allowed set are dropped, as are overrides that place
 * tensors on a peer not configured now; with devices dropped a `tensorSplit` no longer lines up
 * and is dropped too. No allowed device at all means the CPU alone (`['CPU']`, which llama.cpp
 * treats like its default placement on a host without GPUs).
 *
 * A peer device that a kept override places tensors on (the COMBINED experts) but that the
 * configured `devices` leave out is put in front of them (upstream's order): llama.cpp builds a
 * backend only for the model's devices, and a weight in a buffer no backend can run aborts the
 * context build (`pre-allocated tensor ... in a buffer ... that cannot run the operation`). It gets
 * no layers: `tensorSplit` gains a 0 for it (the other devices keep the configured split, else
 * their free memory's), and with no local GPU named (`['CPU']`) nothing is offloaded
 * (`noOffload`), so the layers stay where the configured devices put them.
 */
export function loadDevices(
  rpcServers: readonly string[],
  configured: {
    devices?: string[] | undefined;
    overrides?: string[] | undefined;
    tensorSplit?: number[] | undefined;
  },
):
  | {
      devices: string[];
      overrides: string[] | undefined;
      dropped: boolean;
      tensorSplit?: number[];
      noOffload?: boolean;
    }
  | undefined {
  if (endpoints.size === 0 && !attempted) return undefined;
  const rpc = rpcServers.flatMap((e) => endpoints.get(e) ?? []);
  const gpus = localDevices()
    .filter((d) => d.type !== 'cpu' && d.type !== 'accel')
    .map((d) => d.name);
  // Upstream's default order: RPC devices first (fewer transfers), then local GPUs.
  const allowed = [...rpc, ...gpus];
  const wanted = (configured.devices ?? []).map((n) => nameAlias.get(n) ?? n);
  let devices = wanted.length > 0 ? wanted.filter((n) => allowed.includes(n)) : allowed;
  const dropped = wanted.length > 0 && devices.length !== wanted.length;
  if (devices.length === 0) devices = ['CPU'];
  const keep = new Set(rpcServers.map((e) => wire.get(e) ?? e));
  const overrides = configured.overrides?.map(respelled).filter((spec) => {
    const m = /=RPC\d+\[(.+)\]$/.exec(spec);
    return !m || keep.has(m[1]!);
  });
  const targeted = new Set<string>();
  for (const spec of overrides ?? []) {
    const buft = spec.slice(spec.lastIndexOf('=') + 1);
    for (const e of rpcServers) {
      const i = (buffers.get(e) ?? []).indexOf(buft);
      const name = i >= 0 ? endpoints.get(e)?.[i] : undefined;
      if (name !== undefined && !devices.includes(name)) targeted.add(name);
    }
  }
  if (targeted.size === 0) return { devices, overrides, dropped };
  const added = [...targeted];
  if (devices.length === 1 && devices[0] === 'CPU')
    return { devices: added, overrides, dropped, noOffload: true };
  const given = configured.tensorSplit;
  const weights =
    !dropped && given !== undefined && given.length === devices.length && given.some((x) => x > 0)
      ? given
      : devices.map((n) => known.get(n)?.free || 1);
  return {
    devices: [...added, ...devices],
    overrides,
    dropped,
    tensorSplit: [...added.map(() => 0), ...weights],
  };
}
