import { type AddressInfo, createServer, type Server, type Socket } from 'node:net';
import { Allowlist, DEFAULT_ALLOW_FROM } from './allowlist.js';
import { badOption, HydraError } from './errors.js';
import { socketFd, socketHandle } from './fd.js';
import { type Logger, stderrLogger } from './logger.js';
import { GGML_RPC_HELLO, isHydraOpcode, OPCODES, type OpcodeName } from './opcodes.js';
import { type RpcHostSpec, RpcPool, type RpcPoolStats } from './pool.js';
import { type HydraHandler, HydraSession, type HydraSessionStats, type SessionConfig } from './session.js';

/**
 * Native fd operations (native-ggml provides them; injected so this package never imports the addon).
 */
export interface NativeFdOps {
  /** First byte of the stream without consuming it, off the JS thread; -1 on EOF or timeout. */
  peekFirstByte(fd: number, timeoutMs: number): Promise<number>;
}

/** Options of {@link HydraPort}. */
export interface HydraPortOptions {
  /** Address to bind; default `127.0.0.1`. */
  host?: string;
  /** TCP port; default 0 (any free port). */
  port?: number;
  /** CIDR allowlist for both protocols, checked before anything is read; default loopback only. */
  allowFrom?: readonly string[];
  /** A connection that sends no first byte within this is closed; default 10 000 ms. */
  firstByteTimeoutMs?: number;
  /** A Hydra frame that stops arriving (header or payload) for this long closes the connection; default 10 000 ms. */
  readTimeoutMs?: number;
  /** Largest Hydra request payload; default 64 MiB. */
  maxFrameBytes?: number;
  /** Requests one Hydra connection may have read but not answered before reading pauses; default 64. */
  maxPipelined?: number;
  /** Most open connections of both protocols (ggml-RPC sessions included); default 1024. */
  maxConnections?: number;
  /** Most open connections of both protocols from one source address; default 128. */
  maxConnectionsPerSource?: number;
  /** Most Hydra sessions; default 512. */
  maxHydraSessions?: number;
  /** Most Hydra sessions from one source address; default 64. */
  maxHydraSessionsPerSource?: number;
  /** A Hydra session that sends no frame for this long is closed; default 300 000 ms (5 min). */
  idleTimeoutMs?: number;
  /** How long close() lets running sessions finish before cutting them; default 30 000 ms. */
  shutdownTimeoutMs?: number;
  /** Where refusals and failures are logged; default one line each on stderr. */
  logger?: Logger;
  /** Hydra handlers by opcode name (more can be added with {@link HydraPort.handle}). */
  handlers?: Partial<Record<OpcodeName, HydraHandler>>;
  /** Native fd operations. Without them the port serves Hydra only and closes `0x0E` connections. */
  native?: NativeFdOps;
  /** The child process that serves ggml-RPC sessions (one at a time each); required with `native`. */
  rpcHost?: RpcHostSpec;
  /** Extra fields merged into every session's task (e.g. `{devices, threads, cacheDir}`). */
  rpcTask?: Readonly<Record<string, unknown>>;
  /** Most concurrent ggml-RPC sessions (host processes serving); default 4. */
  poolSize?: number;
  /** ggml-RPC connections that may wait for a free host; default 64. */
  queueSize?: number;
  /** A queued ggml-RPC connection that gets no host within this is closed; default 30 000 ms. */
  queueTimeoutMs?: number;
  /**
   * ggml-RPC sessions one source address may run at once; its further connections wait (at most
   * half the queue). Default poolSize - 1 (at least 1), so another address always finds a host.
   */
  rpcMaxPerSource?: number;
}

/** Counters of a {@link HydraPort}. */
export interface HydraPortStats {
  connections: {
    /** Connections accepted by the OS and seen by the port. */
    accepted: number;
    /** Closed because the peer address is not on the allowlist. */
    refusedByAllowlist: number;
    /** Closed because the first byte picks no protocol. */
    badFirstByte: number;
    /** Closed because no first byte arrived in time (or the peer closed first). */
    noFirstByte: number;
    /** `0x0E` connections closed because this port serves no ggml-RPC. */
    rpcNotServed: number;
    /** Closed at accept: `maxConnections` or `maxConnectionsPerSource` reached. */
    refusedByCap: number;
  };
  hydra: HydraSessionStats;
  rpc: RpcPoolStats;
}

const MiB = 1024 * 1024;

function positiveInt(options: HydraPortOptions, name: keyof HydraPortOptions, fallback: number): number {
  const value = options[name] ?? fallback;
  if (typeof value !== 'number' || !Number.isSafeInteger(value) || value <= 0) {
    throw badOption(name, 'must be a positive integer');
  }
  return value;
}

/**
 * The merged port: one TCP listener whose first byte routes a connection to ggml-RPC (`0x0E`, served
 * natively in a bounded pool of child processes) or to a Hydra control session (`0x30`..`0x46`, served here).
 */
export class HydraPort {
  readonly #host: string;
  readonly #port: number;
  readonly #allowlist: Allowlist;
  readonly #firstByteTimeoutMs: number;
  readonly #shutdownTimeoutMs: number;
  readonly #maxConnections: number;
  readonly #maxConnectionsPerSource: number;
  readonly #maxHydraSessions: number;
  readonly #maxHydraSessionsPerSource: number;
  readonly #poolSize: number;
  readonly #queueSize: number;
  readonly #queueTimeoutMs: number;
  readonly #rpcMaxPerSource: number;
  readonly #logger: Logger;
  readonly #native: NativeFdOps | undefined;
  readonly #rpcHost: RpcHostSpec | undefined;
  readonly #rpcTask: Readonly<Record<string, unknown>>;
  readonly #handlers = new Map<number, HydraHandler>();
  readonly #sessionConfig: SessionConfig;
  readonly #sessions = new Set<HydraSession>();
  readonly #waiting = new Set<Socket>();
  readonly #peeks = new Set<Promise<void>>();
  readonly #open = new Map<string, number>();
  readonly #hydraBySource = new Map<string, number>();
  readonly #refusalLog = new Map<string, { at: number; suppressed: number }>();
  #openTotal = 0;
  readonly #conn: HydraPortStats['connections'] = {
    accepted: 0,
    refusedByAllowlist: 0,
    badFirstByte: 0,
    noFirstByte: 0,
    rpcNotServed: 0,
    refusedByCap: 0,
  };
  #server: Server | undefined;
  #pool: RpcPool | undefined;
  #closing: Promise<void> | undefined;

  constructor(options: HydraPortOptions = {}) {
    if (typeof options !== 'object' || options === null) throw badOption('', 'must be an object');
    this.#host = options.host ?? '127.0.0.1';
    if (typeof this.#host !== 'string' || this.#host === '')
      throw badOption('host', 'must be a non-empty string');
    this.#port = options.port ?? 0;
    if (!Number.isInteger(this.#port) || this.#port < 0 || this.#port > 65535) {
      throw badOption('port', 'must be an integer in 0..65535');
    }
    const allowFrom = options.allowFrom ?? DEFAULT_ALLOW_FROM;
    if (!Array.isArray(allowFrom) || allowFrom.some((entry) => typeof entry !== 'string')) {
      throw badOption('allowFrom', 'must be an array of CIDR strings');
    }
    this.#allowlist = new Allowlist(allowFrom);
    this.#firstByteTimeoutMs = positiveInt(options, 'firstByteTimeoutMs', 10_000);
    this.#shutdownTimeoutMs = positiveInt(options, 'shutdownTimeoutMs', 30_000);
    this.#maxConnections = positiveInt(options, 'maxConnections', 1024);
    this.#maxConnectionsPerSource = positiveInt(options, 'maxConnectionsPerSource', 128);
    this.#maxHydraSessions = positiveInt(options, 'maxHydraSessions', 512);
    this.#maxHydraSessionsPerSource = positiveInt(options, 'maxHydraSessionsPerSource', 64);
    this.#poolSize = positiveInt(options, 'poolSize', 4);
    this.#queueTimeoutMs = positiveInt(options, 'queueTimeoutMs', 30_000);
    this.#rpcMaxPerSource = positiveInt(options, 'rpcMaxPerSource', Math.max(1, this.#poolSize - 1));
    const queueSize = options.queueSize ?? 64;
    if (!Number.isSafeInteger(queueSize) || queueSize < 0)
      throw badOption('queueSize', 'must be a non-negative integer');
    this.#queueSize = queueSize;
    this.#logger = options.logger ?? stderrLogger;
    for (const method of ['info', 'warn', 'error'] as const) {
      if (typeof this.#logger[method] !== 'function')
        throw badOption('logger', `must have a ${method}() method`);
    }
    this.#native = options.native;
    this.#rpcHost = options.rpcHost;
    if (this.#native !== undefined) {
      if (typeof this.#native.peekFirstByte !== 'function') {
        throw badOption('native', 'must provide peekFirstByte()');
      }
      if (this.#rpcHost === undefined) throw badOption('rpcHost', 'is required when options.native is given');
    }
    if (this.#rpcHost !== undefined) {
      if (this.#native === undefined) throw badOption('native', 'is required when options.rpcHost is given');
      const { command, args } = this.#rpcHost;
      if (command !== undefined && (typeof command !== 'string' || command === '')) {
        throw badOption('rpcHost', 'command must be a non-empty string');
      }
      if (!Array.isArray(args) || args.some((a) => typeof a !== 'string')) {
        throw badOption('rpcHost', 'args must be an array of strings');
      }
    }
    this.#rpcTask = options.rpcTask ?? {};
    if (typeof this.#rpcTask !== 'object' || this.#rpcTask === null)
      throw badOption('rpcTask', 'must be an object');
    this.#sessionConfig = {
      handlers: this.#handlers,
      maxFrameBytes: positiveInt(options, 'maxFrameBytes', 64 * MiB),
      readTimeoutMs: positiveInt(options, 'readTimeoutMs', 10_000),
      idleTimeoutMs: positiveInt(options, 'idleTimeoutMs', 300_000),
      maxPipelined: positiveInt(options, 'maxPipelined', 64),
      logger: this.#logger,
      stats: { active: 0, opened: 0, requests: 0, errors: {}, readTimeouts: 0, idleTimeouts: 0, refused: 0 },
    };
    // The one answer to the retired opcode, here so no embedder registers its own.
    this.#handlers.set(OPCODES.PIPELINE_ATTACH, () => {
      throw new HydraError(
        'HYDRA_ERR_RETIRED',
        'PIPELINE_ATTACH is retired: use CONFIGURE with rpc_servers and tensor_split',
      );
    });
    for (const [name, handler] of Object.entries(options.handlers ?? {})) {
      if (handler !== undefined) this.handle(name as OpcodeName, handler);
    }
  }

  /** Registers (or replaces) the handler of one opcode. Returns this port. */
  handle(name: OpcodeName, handler: HydraHandler): this {
    if (!Object.hasOwn(OPCODES, name))
      throw badOption('handlers', `has an unknown opcode name ${JSON.stringify(name)}`);
    if (name === 'PIPELINE_ATTACH')
      throw badOption('handlers.PIPELINE_ATTACH', 'is retired: the port answers it with HYDRA_ERR_RETIRED');
    if (typeof handler !== 'function') throw badOption(`handlers.${name}`, 'must be a function');
    this.#handlers.set(OPCODES[name], handler);
    return this;
  }

  /** Binds and starts accepting; resolves with the bound address. */
  listen(): Promise<AddressInfo> {
    if (this.#server !== undefined)
      return Promise.reject(new HydraError('HYDRA_ERR_INTERNAL', 'already listening'));
    if (this.#rpcHost !== undefined) {
      this.#pool = new RpcPool({
        host: this.#rpcHost,
        size: this.#poolSize,
        queueSize: this.#queueSize,
        maxPerSource: this.#rpcMaxPerSource,
        queueTimeoutMs: this.#queueTimeoutMs,
        logger: this.#logger,
      });
    }
    // allowHalfOpen: a Hydra client may shut down its sending side after its request and still
    // read the reply (the session ends its side once it has answered).
    const server = createServer({ pauseOnConnect: true, noDelay: true, allowHalfOpen: true }, (socket) =>
      this.#onConnection(socket),
    );
    this.#server = server;
    return new Promise((resolve, reject) => {
      server.once('error', reject);
      server.listen(this.#port, this.#host, () => {
        server.off('error', reject);
        this.#pool?.warm();
        server.on('error', (err) => this.#logger.error('hydra-rpc: server error', { err }));
        resolve(server.address() as AddressInfo);
      });
    });
  }

  /** The bound address, once listening. */
  get address(): AddressInfo | undefined {
    const address = this.#server?.address();
    return typeof address === 'object' && address !== null ? address : undefined;
  }

  stats(): HydraPortStats {
    const hydra = this.#sessionConfig.stats;
    return {
      connections: { ...this.#conn },
      hydra: { ...hydra, errors: { ...hydra.errors } },
      rpc: this.#pool?.stats() ?? {
        active: 0,
        queued: 0,
        refused: 0,
        refusedBySource: 0,
        queueTimeouts: 0,
        served: 0,
        failed: 0,
        crashed: 0,
        hosts: 0,
        hostsSpawned: 0,
        ended: {},
        refusals: 0,
        bytesIn: 0,
        bytesOut: 0,
        commands: 0,
        setTensorBytes: 0,
        setTensorHashHits: 0,
      },
    };
  }

  /**
   * Sends `data` to every ggml-RPC host process, now and to each started later, before any session
   * it serves (e.g. `{weights: file}` for native-ggml's host). No-op on a Hydra-only port.
   */
  broadcastToHosts(data: unknown): void {
    if (this.#pool === undefined) {
      if (this.#rpcHost === undefined) return;
      throw new HydraError('HYDRA_ERR_INTERNAL', 'broadcastToHosts() before listen()');
    }
    this.#pool.broadcast(data);
  }

  /** The running ggml-RPC sessions (`label` is the peer's address:port) and the host process of each. */
  rpcSessions(): { label: string; source: string; pid: number | undefined }[] {
    return this.#pool?.sessions() ?? [];
  }

  /** Process ids of the live ggml-RPC host processes. */
  hostPids(): number[] {
    return this.#pool?.hostPids() ?? [];
  }

  // One line per refusal reason at most once a second: a flood of refusals must not become a flood of log lines.
  #logRefusal(reason: string, line: string): void {
    const now = Date.now();
    const seen = this.#refusalLog.get(reason);
    if (seen !== undefined && now - seen.at < 1000) {
      seen.suppressed++;
      return;
    }
    const more =
      seen !== undefined && seen.suppressed > 0 ? ` (${seen.suppressed} more since the last line)` : '';
    this.#refusalLog.set(reason, { at: now, suppressed: 0 });
    this.#logger.warn(`${line}${more}`);
  }

  // Counts an open connection against the caps; returns its release (idempotent), or undefined when refused.
  #track(source: string): (() => void) | undefined {
    const held = this.#open.get(source) ?? 0;
    if (this.#openTotal >= this.#maxConnections || held >= this.#maxConnectionsPerSource) {
      return undefined;
    }
    this.#open.set(source, held + 1);
    this.#openTotal++;
    let released = false;
    return () => {
      if (released) return;
      released = true;
      this.#openTotal--;
      const left = (this.#open.get(source) ?? 1) - 1;
      if (left > 0) this.#open.set(source, left);
      else this.#open.delete(source);
    };
  }

  #onConnection(socket: Socket): void {
    this.#conn.accepted++;
    socket.on('error', () => {});
    if (this.#closing !== undefined) {
      socket.destroy();
      return;
    }
    const label = `${socket.remoteAddress}:${socket.remotePort}`;
    if (!this.#allowlist.allows(socket.remoteAddress)) {
      this.#conn.refusedByAllowlist++;
      this.#logRefusal('allowlist', `hydra-rpc: refused connection from ${label}: not on the allowlist`);
      socket.destroy();
      return;
    }
    const source = sourceOf(socket.remoteAddress);
    const release = this.#track(source);
    if (release === undefined) {
      this.#conn.refusedByCap++;
      this.#logRefusal(
        `cap ${source}`,
        `hydra-rpc: refused connection from ${label}: ${this.#openTotal} connections open, ${this.#open.get(source) ?? 0} from ${source} (maxConnections ${this.#maxConnections}, maxConnectionsPerSource ${this.#maxConnectionsPerSource})`,
      );
      socket.destroy();
      return;
    }
    socket.once('close', release);
    const conn: Conn = { socket, label, source, release };
    if (this.#native !== undefined) this.#peekNative(conn, this.#native);
    else this.#readFirstChunk(conn);
  }

  #peekNative(conn: Conn, native: NativeFdOps): void {
    const { socket, label } = conn;
    let fd: number;
    try {
      fd = socketFd(socket);
    } catch (err) {
      this.#logger.error(`hydra-rpc: closing ${label}`, { err });
      socket.destroy();
      return;
    }
    const peek = Promise.resolve()
      .then(() => native.peekFirstByte(fd, this.#firstByteTimeoutMs))
      .then(
        (byte) => this.#dispatch(conn, byte),
        (err: unknown) => {
          this.#logger.error(`hydra-rpc: first-byte peek failed for ${label}`, { err });
          socket.destroy();
        },
      )
      .finally(() => this.#peeks.delete(peek));
    this.#peeks.add(peek);
  }

  // Hydra-only port: the first byte is read in JS and handed to the session with the rest.
  #readFirstChunk(conn: Conn): void {
    const { socket } = conn;
    this.#waiting.add(socket);
    let settled = false;
    const giveUp = (): void => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      this.#waiting.delete(socket);
      if (this.#closing === undefined) this.#conn.noFirstByte++;
      socket.destroy();
    };
    const timer = setTimeout(giveUp, this.#firstByteTimeoutMs);
    const onData = (chunk: Buffer): void => {
      socket.pause();
      socket.off('close', giveUp);
      socket.off('end', giveUp);
      settled = true;
      clearTimeout(timer);
      this.#waiting.delete(socket);
      this.#dispatch(conn, chunk[0]!, chunk);
    };
    socket.once('data', onData);
    socket.once('close', giveUp);
    // The server is half-open: a peer that ends before its first byte gets 'end', not 'close'.
    socket.once('end', giveUp);
    socket.resume();
  }

  #dispatch(conn: Conn, byte: number, initial?: Buffer): void {
    const { socket, label, source } = conn;
    if (this.#closing !== undefined || socket.destroyed) {
      socket.destroy();
      return;
    }
    if (byte < 0) {
      this.#conn.noFirstByte++;
      this.#logRefusal(
        'no first byte',
        `hydra-rpc: closed connection from ${label}: it closed or sent nothing within ${this.#firstByteTimeoutMs} ms`,
      );
      socket.destroy();
      return;
    }
    if (isHydraOpcode(byte)) {
      this.#startHydra(conn, initial);
      return;
    }
    if (byte !== GGML_RPC_HELLO) {
      this.#conn.badFirstByte++;
      this.#logRefusal(
        'bad first byte',
        `hydra-rpc: closed connection from ${label}: first byte 0x${byte.toString(16).padStart(2, '0')} is neither ggml-RPC HELLO nor a Hydra opcode`,
      );
      socket.destroy();
      return;
    }
    const pool = this.#pool;
    if (pool === undefined || this.#native === undefined) {
      this.#conn.rpcNotServed++;
      this.#logger.warn(`hydra-rpc: closed ggml-RPC connection from ${label}: this port serves Hydra only`);
      socket.destroy();
      return;
    }
    // From here the connection counts until its session ends in a host, not until Node's socket closes.
    socket.off('close', conn.release);
    const admitted = pool.admit({
      label,
      source,
      start: () => {
        if (socket.destroyed) throw new HydraError('HYDRA_ERR_INTERNAL', 'connection closed while queued');
        const remoteAddress = socket.remoteAddress ?? '';
        return { task: { ...this.#rpcTask, remoteAddress }, handle: socketHandle(socket) };
      },
      // The host holds its own copy of the fd once the handle is sent; this process lets go of its copy.
      sent: () => socket.destroy(),
      abort: () => {
        socket.destroy();
        conn.release();
      },
      ended: () => conn.release(),
    });
    // Refused: admit() has logged and counted it.
    if (!admitted) {
      socket.destroy();
      conn.release();
    }
  }

  #startHydra(conn: Conn, initial: Buffer | undefined): void {
    const { socket, label, source } = conn;
    const stats = this.#sessionConfig.stats;
    const held = this.#hydraBySource.get(source) ?? 0;
    if (stats.active >= this.#maxHydraSessions || held >= this.#maxHydraSessionsPerSource) {
      stats.refused++;
      this.#logRefusal(
        `hydra ${source}`,
        `hydra-rpc: refused Hydra session from ${label}: ${stats.active} open, ${held} from ${source} (maxHydraSessions ${this.#maxHydraSessions}, maxHydraSessionsPerSource ${this.#maxHydraSessionsPerSource})`,
      );
      socket.destroy();
      return;
    }
    this.#hydraBySource.set(source, held + 1);
    const session = new HydraSession(socket, this.#sessionConfig, initial);
    this.#sessions.add(session);
    void session.closed.then(() => {
      this.#sessions.delete(session);
      const left = (this.#hydraBySource.get(source) ?? 1) - 1;
      if (left > 0) this.#hydraBySource.set(source, left);
      else this.#hydraBySource.delete(source);
    });
  }

  /**
   * Stops accepting, closes idle Hydra sessions at once and busy ones after their answered
   * requests, lets ggml-RPC sessions end (bounded by `shutdownTimeoutMs`), and resolves when every
   * connection is closed. Calling it again returns the same promise.
   */
  close(): Promise<void> {
    this.#closing ??= this.#shutdown();
    return this.#closing;
  }

  async #shutdown(): Promise<void> {
    const server = this.#server;
    const serverClosed =
      server === undefined
        ? Promise.resolve()
        : new Promise<void>((resolve) => {
            server.close(() => resolve());
          });
    for (const socket of this.#waiting) socket.destroy();
    const deadline = Date.now() + this.#shutdownTimeoutMs;
    const hydraDone = (async () => {
      for (const session of this.#sessions) session.drain();
      const all = Promise.all([...this.#sessions].map((session) => session.closed));
      if (!(await within(all, deadline - Date.now()))) {
        for (const session of this.#sessions) session.destroy();
        await all;
      }
    })();
    const peeksDone = within(Promise.allSettled([...this.#peeks]), deadline - Date.now());
    const rpcDone = this.#pool?.close(Math.max(0, deadline - Date.now())) ?? Promise.resolve();
    await Promise.all([hydraDone, peeksDone, rpcDone]);
    await serverClosed;
  }
}

interface Conn {
  socket: Socket;
  label: string;
  source: string;
  /** Releases the connection's place under the caps (idempotent). */
  release: () => void;
}

/** The address caps count by: `::ffff:a.b.c.d` is the IPv4 peer it maps. */
function sourceOf(address: string | undefined): string {
  if (address === undefined) return '';
  const mapped = /^::ffff:(\d{1,3}(?:\.\d{1,3}){3})$/i.exec(address);
  return mapped !== null ? mapped[1]! : address;
}

async function within(promise: Promise<unknown>, ms: number): Promise<boolean> {
  let timer: NodeJS.Timeout | undefined;
  const result = await Promise.race([
    promise.then(() => true),
    new Promise<boolean>((resolve) => {
      timer = setTimeout(() => resolve(false), Math.max(0, ms));
    }),
  ]);
  clearTimeout(timer);
  return result;
}
