import { type ChildProcess, execFileSync, spawn } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { request } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { SseCompletion } from './control-helpers.js';

/**
 * Two network namespaces joined by one veth pair: a stand-in for two hosts on one machine.
 * Addresses exist only inside the two namespaces; the root namespace gets no link, address or
 * route. The test reaches the head's HTTP through a unix socket (see `relay`): filesystem
 * sockets are not separated by network namespaces.
 */
export interface NetnsPair {
  head: string;
  peer: string;
  headIf: string;
  peerIf: string;
  headAddr: string;
  peerAddr: string;
  dir: string;
}

function ip(args: string[]): string {
  return execFileSync('ip', args, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'], timeout: 10_000 });
}

/** Why two namespaces cannot be made here, or undefined when they can (tried for real). */
export function netnsUnavailable(): string | undefined {
  if (process.platform !== 'linux') return `not Linux (${process.platform})`;
  if (process.getuid?.() !== 0) return 'not root: ip netns needs CAP_SYS_ADMIN';
  const probe = `hydra-probe-${process.pid}`;
  try {
    ip(['netns', 'add', probe]);
  } catch (err) {
    return `ip netns unavailable: ${(err as Error).message.split('\n')[0]}`;
  }
  try {
    ip(['netns', 'del', probe]);
  } catch {
    // Deleting an empty namespace we just made does not fail in practice; nothing to keep.
  }
  return undefined;
}

/** Pair `n` of this process (namespace and link names carry the pid and `n`). */
export function createNetnsPair(n = 0): NetnsPair {
  const id = `${process.pid}-${n}`;
  // The addresses live only in our own namespaces, so they cannot clash with anything else.
  const x = n % 254;
  const pair: NetnsPair = {
    head: `hydra-h-${id}`,
    peer: `hydra-p-${id}`,
    // Interface names are at most 15 bytes: pid up to 7 digits plus n.
    headIf: `hyh${process.pid}n${n}`.slice(0, 15),
    peerIf: `hyp${process.pid}n${n}`.slice(0, 15),
    headAddr: `10.213.${x}.1`,
    peerAddr: `10.213.${x}.2`,
    dir: mkdtempSync(join(tmpdir(), 'hydra-netns-')),
  };
  try {
    ip(['netns', 'add', pair.head]);
    ip(['netns', 'add', pair.peer]);
    // Made inside the head namespace and its other end moved straight into the peer's: the pair
    // never appears in the root namespace.
    ip([
      '-n',
      pair.head,
      'link',
      'add',
      pair.headIf,
      'type',
      'veth',
      'peer',
      'name',
      pair.peerIf,
      'netns',
      pair.peer,
    ]);
    ip(['-n', pair.head, 'addr', 'add', `${pair.headAddr}/30`, 'dev', pair.headIf]);
    ip(['-n', pair.peer, 'addr', 'add', `${pair.peerAddr}/30`, 'dev', pair.peerIf]);
    for (const [ns, dev] of [
      [pair.head, pair.headIf],
      [pair.peer, pair.peerIf],
    ] as const) {
      ip(['-n', ns, 'link', 'set', 'lo', 'up']);
      ip(['-n', ns, 'link', 'set', dev, 'up']);
    }
  } catch (err) {
    destroyNetnsPair(pair);
    throw err;
  }
  return pair;
}

/** Deletes both namespaces (the veth pair goes with them); safe to call twice. */
export function destroyNetnsPair(pair: NetnsPair): void {
  for (const ns of [pair.head, pair.peer]) {
    try {
      ip(['netns', 'del', ns]);
    } catch {
      // Already gone (or never made): nothing else to undo.
    }
  }
  rmSync(pair.dir, { recursive: true, force: true });
}

export function setLink(pair: NetnsPair, side: 'head' | 'peer', state: 'up' | 'down'): void {
  ip(['-n', pair[side], 'link', 'set', side === 'head' ? pair.headIf : pair.peerIf, state]);
}

export interface NsProc {
  child: ChildProcess;
  log(): string;
  kill(): Promise<void>;
}

/**
 * Runs a command in a namespace. `ip netns exec` execs the command in place, so the child's pid
 * is the command's own and killing it leaves nothing behind.
 */
export function spawnInNs(ns: string, argv: string[]): NsProc {
  const child = spawn('ip', ['netns', 'exec', ns, ...argv], { stdio: ['ignore', 'pipe', 'pipe'] });
  let log = '';
  child.stdout!.on('data', (d) => {
    log += d;
  });
  child.stderr!.on('data', (d) => {
    log += d;
  });
  return {
    child,
    log: () => log,
    kill: () =>
      new Promise<void>((resolve) => {
        if (child.exitCode !== null || child.signalCode !== null) return resolve();
        const timer = setTimeout(resolve, 5_000);
        child.once('exit', () => {
          clearTimeout(timer);
          resolve();
        });
        child.kill('SIGKILL');
      }),
  };
}

export async function waitForLog(p: NsProc, pattern: RegExp, timeoutMs: number): Promise<void> {
  const end = Date.now() + timeoutMs;
  while (Date.now() < end) {
    if (pattern.test(p.log())) return;
    if (p.child.exitCode !== null) throw new Error(`process exited ${p.child.exitCode}: ${p.log()}`);
    await new Promise((r) => setTimeout(r, 25));
  }
  throw new Error(`no ${pattern} in ${timeoutMs} ms: ${p.log()}`);
}

const RELAY = `
const net = require('node:net');
const [sock, port] = process.argv.slice(1);
net.createServer((c) => {
  const u = net.connect(Number(port), '127.0.0.1');
  c.pipe(u); u.pipe(c);
  c.on('error', () => u.destroy()); u.on('error', () => c.destroy());
  c.on('close', () => u.destroy()); u.on('close', () => c.destroy());
}).listen(sock, () => console.log('relay ready'));
`;

/**
 * A byte relay in `ns` from a unix socket under the pair's folder to `127.0.0.1:port` there: the
 * test process (root namespace) reaches the head's loopback HTTP with no address of its own in
 * the test network. Taking the veth link down never touches this path.
 */
export async function relay(pair: NetnsPair, ns: string, port: number): Promise<NsProc & { socket: string }> {
  const socket = join(pair.dir, `${ns}-${port}.sock`);
  if (existsSync(socket)) rmSync(socket);
  const p = spawnInNs(ns, [process.execPath, '-e', RELAY, socket, String(port)]);
  await waitForLog(p, /relay ready/, 10_000);
  return Object.assign(p, { socket });
}

export interface HttpReply {
  status: number;
  json: any;
}

/** One HTTP request over a unix socket, bounded by `timeoutMs`. */
export function httpUnix(
  socket: string,
  method: string,
  path: string,
  body?: unknown,
  timeoutMs = 30_000,
): Promise<HttpReply> {
  return new Promise((resolve, reject) => {
    const data = body === undefined ? undefined : JSON.stringify(body);
    const req = request(
      {
        socketPath: socket,
        method,
        path,
        headers: data
          ? { 'content-type': 'application/json', 'content-length': Buffer.byteLength(data) }
          : {},
        timeout: timeoutMs,
      },
      (res) => {
        let text = '';
        res.setEncoding('utf8');
        res.on('data', (d) => {
          text += d;
        });
        res.on('end', () => {
          try {
            resolve({ status: res.statusCode ?? 0, json: JSON.parse(text) });
          } catch (err) {
            reject(new Error(`not JSON (${res.statusCode}): ${text.slice(0, 200)}`, { cause: err }));
          }
        });
        res.on('error', reject);
      },
    );
    req.on('timeout', () => req.destroy(new Error(`${method} ${path}: no answer in ${timeoutMs} ms`)));
    req.on('error', reject);
    req.end(data);
  });
}

/** A streamed completion over a unix socket: the text, the SSE error if any, the finish reason. */
export function streamUnix(
  socket: string,
  body: Record<string, unknown>,
  onFirst: () => void,
  timeoutMs = 60_000,
): Promise<{ status: number; text: string; error?: { code: string }; finish?: string }> {
  return new Promise((resolve, reject) => {
    const data = JSON.stringify({ ...body, stream: true });
    const req = request(
      {
        socketPath: socket,
        method: 'POST',
        path: '/v1/completions',
        headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(data) },
        timeout: timeoutMs,
      },
      (res) => {
        const sse = new SseCompletion(onFirst);
        res.setEncoding('utf8');
        res.on('data', (d: string) => sse.push(d));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, ...sse.result() }));
        res.on('error', reject);
      },
    );
    req.on('timeout', () => req.destroy(new Error(`stream: no bytes for ${timeoutMs} ms`)));
    req.on('error', reject);
    req.end(data);
  });
}
