import { type AddressInfo, createServer, type Server, type Socket } from 'node:net';
import { Allowlist, DEFAULT_ALLOW_FROM } from './allowlist.js';
import { badOption, HydraError } from './errors.js';
import { socketFd } from './fd.js';
import { type Logger, stderrLogger } from './logger.js';
import { GGML_RPC_HELLO, isHydraOpcode, OPCODES, type OpcodeName } from './opcodes.js';
import { RpcPool, type RpcPoolStats, type RpcWorkerSpec } from './pool.js';
import { type HydraHandler, HydraSession, type HydraSessionStats, type SessionConfig } from './session.js';

/**
 * Native fd operations (native-ggml provides them; injected so this package never imports the addon).
 */
export interface NativeFdOps {
  /** First byte of the stream without consuming it, off the JS thread; -1 on EOF or timeout. */
  peekFirstByte(fd: number, timeoutMs: number): Promise<number>;
  /** dup()s `fd`, makes the copy blocking with TCP_NODELAY and returns it. */
  detachFd(fd: number): number;
  /** Optional: shutdown(2) of a served fd, used to cut sessions still running at the shutdown timeout. */
  shutdownFd?(fd: number): void;
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
  /** Most open connections of both protocols; default 1024. */
  maxConnections?: number;
  /** How long close() lets running sessions finish before cutting them; default 30 000 ms. */
  shutdownTimeoutMs?: number;
  /** Where refusals and failures are logged; default one line each on stderr. */
  logger?: Logger;
  /** Hydra handlers by opcode name (more can be added with {@link HydraPort.handle}). */
  handlers?: Partial<Record<OpcodeName, HydraHandler>>;
  /** Native fd operations. Without them the port serves Hydra only and closes `0x0E` connections. */
  native?: NativeFdOps;
  /** The worker module serving ggml-RPC sessions; required with `native`. */
  rpcWorker?: RpcWorkerSpec;
  /** Extra fields merged into every worker task (e.g. `{devices, threads, cacheDir}`). */
  rpcTask?: Readonly<Record<string, unknown>>;
  /** Most concurrent ggml-RPC sessions; default 4. */
  poolSize?: number;
  /** ggml-RPC connections that may wait for a pool slot; default 64. */
  queueSize?: number;
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
 * natively by a bounded piscina pool) or to a Hydra control session (`0x30`..`0x46`, served here).
 */
export class HydraPort {
  readonly #host: string;
  readonly #port: number;
  readonly #allowlist: Allowlist;
  readonly #firstByteTimeoutMs: number;
  readonly #shutdownTimeoutMs: number;
  readonly #maxConnections: number;
  readonly #poolSize: number;
  readonly #queueSize: number;
  readonly #logger: Logger;
  readonly #native: NativeFdOps | undefined;
  readonly #rpcWorker: RpcWorkerSpec | undefined;
  readonly #rpcTask: Readonly<Record<string, unknown>>;
  readonly #handlers = new Map<number, HydraHandler>();
  readonly #sessionConfig: SessionConfig;
  readonly #sessions = new Set<HydraSession>();
  readonly #waiting = new Set<Socket>();
  readonly #peeks = new Set<Promise<void>>();
  readonly #servedFds = new Set<number>();
  readonly #conn: HydraPortStats['connections'] = {
    accepted: 0,
    refusedByAllowlist: 0,
    badFirstByte: 0,
    noFirstByte: 0,
    rpcNotServed: 0,
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
    this.#poolSize = positiveInt(options, 'poolSize', 4);
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
    this.#rpcWorker = options.rpcWorker;
    if (this.#native !== undefined) {
      if (typeof this.#native.peekFirstByte !== 'function' || typeof this.#native.detachFd !== 'function') {
        throw badOption('native', 'must provide peekFirstByte() and detachFd()');
      }
      if (this.#rpcWorker === undefined)
        throw badOption('rpcWorker', 'is required when options.native is given');
    }
    if (this.#rpcWorker !== undefined) {
      if (this.#native === undefined)
        throw badOption('native', 'is required when options.rpcWorker is given');
      const { filename } = this.#rpcWorker;
      if (!(filename instanceof URL) && (typeof filename !== 'string' || filename === '')) {
        throw badOption('rpcWorker', 'must have a filename (absolute path or file URL)');
      }
    }
    this.#rpcTask = options.rpcTask ?? {};
    if (typeof this.#rpcTask !== 'object' || this.#rpcTask === null)
      throw badOption('rpcTask', 'must be an object');
    this.#sessionConfig = {
      handlers: this.#handlers,
      maxFrameBytes: positiveInt(options, 'maxFrameBytes', 64 * MiB),
      readTimeoutMs: positiveInt(options, 'readTimeoutMs', 10_000),
      maxPipelined: positiveInt(options, 'maxPipelined', 64),
      logger: this.#logger,
      stats: { active: 0, opened: 0, requests: 0, errors: {}, readTimeouts: 0 },
    };
    this.handle('PIPELINE_ATTACH', () => {
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
    if (typeof handler !== 'function') throw badOption(`handlers.${name}`, 'must be a function');
    this.#handlers.set(OPCODES[name], handler);
    return this;
  }

  /** Binds and starts accepting; resolves with the bound address. */
  listen(): Promise<AddressInfo> {
    if (this.#server !== undefined)
      return Promise.reject(new HydraError('HYDRA_ERR_INTERNAL', 'already listening'));
    if (this.#rpcWorker !== undefined) {
      this.#pool = new RpcPool({
        worker: this.#rpcWorker,
        size: this.#poolSize,
        queueSize: this.#queueSize,
        logger: this.#logger,
      });
    }
    const server = createServer({ pauseOnConnect: true, noDelay: true }, (socket) =>
      this.#onConnection(socket),
    );
    server.maxConnections = this.#maxConnections;
    this.#server = server;
    return new Promise((resolve, reject) => {
      server.once('error', reject);
      server.listen(this.#port, this.#host, () => {
        server.off('error', reject);
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
        served: 0,
        failed: 0,
        bytesIn: 0,
        bytesOut: 0,
        commands: 0,
        setTensorBytes: 0,
      },
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
      this.#logger.warn(`hydra-rpc: refused connection from ${label}: not on the allowlist`);
      socket.destroy();
      return;
    }
    if (this.#native !== undefined) this.#peekNative(socket, this.#native, label);
    else this.#readFirstChunk(socket, label);
  }

  #peekNative(socket: Socket, native: NativeFdOps, label: string): void {
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
        (byte) => this.#dispatch(socket, byte, label, fd),
        (err: unknown) => {
          this.#logger.error(`hydra-rpc: first-byte peek failed for ${label}`, { err });
          socket.destroy();
        },
      )
      .finally(() => this.#peeks.delete(peek));
    this.#peeks.add(peek);
  }

  // Hydra-only port: the first byte is read in JS and handed to the session with the rest.
  #readFirstChunk(socket: Socket, label: string): void {
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
      settled = true;
      clearTimeout(timer);
      this.#waiting.delete(socket);
      this.#dispatch(socket, chunk[0]!, label, undefined, chunk);
    };
    socket.once('data', onData);
    socket.once('close', giveUp);
    socket.resume();
  }

  #dispatch(socket: Socket, byte: number, label: string, fd: number | undefined, initial?: Buffer): void {
    if (this.#closing !== undefined || socket.destroyed) {
      socket.destroy();
      return;
    }
    if (byte < 0) {
      this.#conn.noFirstByte++;
      socket.destroy();
      return;
    }
    if (isHydraOpcode(byte)) {
      const session = new HydraSession(socket, this.#sessionConfig, initial);
      this.#sessions.add(session);
      void session.closed.then(() => this.#sessions.delete(session));
      return;
    }
    if (byte !== GGML_RPC_HELLO) {
      this.#conn.badFirstByte++;
      socket.destroy();
      return;
    }
    const pool = this.#pool;
    const native = this.#native;
    if (pool === undefined || native === undefined || fd === undefined) {
      this.#conn.rpcNotServed++;
      this.#logger.warn(`hydra-rpc: closed ggml-RPC connection from ${label}: this port serves Hydra only`);
      socket.destroy();
      return;
    }
    let served: number | undefined;
    const admitted = pool.admit({
      label,
      start: () => {
        if (socket.destroyed) throw new HydraError('HYDRA_ERR_INTERNAL', 'connection closed while queued');
        const remoteAddress = socket.remoteAddress ?? '';
        served = native.detachFd(fd);
        // The duplicate alone owns the connection from here; Node's handle lets go of its copy.
        socket.destroy();
        this.#servedFds.add(served);
        return { ...this.#rpcTask, fd: served, remoteAddress };
      },
      abort: () => socket.destroy(),
      ended: () => {
        if (served !== undefined) this.#servedFds.delete(served);
      },
    });
    // Refused: admit() has logged and counted it; the socket still owns the fd.
    if (!admitted) socket.destroy();
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
    const native = this.#native;
    const rpcDone =
      this.#pool?.close(Math.max(0, deadline - Date.now()), () => {
        for (const fd of this.#servedFds) {
          try {
            native?.shutdownFd?.(fd);
          } catch (err) {
            this.#logger.error('hydra-rpc: shutdownFd failed', { err, fd });
          }
        }
      }) ?? Promise.resolve();
    await Promise.all([hydraDone, peeksDone, rpcDone]);
    await serverClosed;
  }
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
