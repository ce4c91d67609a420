import type { Socket } from 'node:net';
import { isHydraError } from '@hydra-engine/errors';
import {
  decodeBinaryFields,
  decodePayload,
  type Encoding,
  encodeFrame,
  encodePayload,
  type Frame,
  FrameReader,
  type Payload,
  sniffEncoding,
} from './codec.js';
import { HydraError } from './errors.js';
import type { Logger } from './logger.js';
import { BINARY_FIELDS, isHydraOpcode, type OpcodeName, opcodeName } from './opcodes.js';
import type { WireError } from './types.js';

/** How long a session closed for a protocol error keeps reading after its FIN (see #end). */
const LINGER_MS = 250;

/** What a handler learns about the request besides its payload. */
export interface HandlerContext {
  opcode: number;
  name: OpcodeName;
  /** The encoding the reply will use (the request's). */
  encoding: Encoding;
  remoteAddress: string | undefined;
}

/**
 * Serves one opcode. The request is untrusted wire data (only the binary fields are already
 * Buffers): validate it. Return the response fields besides `success`; throw a HydraError to fail
 * with its code. Anything else thrown becomes HYDRA_ERR_INTERNAL.
 */
export type HydraHandler = (request: Payload, context: HandlerContext) => unknown;

/** Counters shared by all Hydra sessions of a port. */
export interface HydraSessionStats {
  /** Hydra sessions open now. */
  active: number;
  /** Hydra sessions opened since start. */
  opened: number;
  /** Requests answered. */
  requests: number;
  /** Requests answered with `success: false`, per code. */
  errors: Record<string, number>;
  /** Connections closed because a frame stopped arriving. */
  readTimeouts: number;
  /** Sessions closed because no frame arrived for `idleTimeoutMs`. */
  idleTimeouts: number;
  /** Sessions refused at their first byte by `maxHydraSessions` or `maxHydraSessionsPerSource`. */
  refused: number;
}

export interface SessionConfig {
  handlers: ReadonlyMap<number, HydraHandler>;
  maxFrameBytes: number;
  readTimeoutMs: number;
  idleTimeoutMs: number;
  maxPipelined: number;
  logger: Logger;
  stats: HydraSessionStats;
}

type Work = { kind: 'request'; frame: Frame } | { kind: 'too-large'; opcode: number } | { kind: 'close' };

/**
 * One Hydra connection on the main thread. Requests are read as they arrive (pipelining) and run
 * one at a time, so replies leave in request order and each request sees the effects of the
 * previous one.
 */
export class HydraSession {
  readonly #socket: Socket;
  readonly #config: SessionConfig;
  readonly #reader: FrameReader;
  readonly #work: Work[] = [];
  readonly #closed: Promise<void>;
  #busy = false;
  #reading = true;
  #draining = false;
  #peerEnded = false;
  #timer: NodeJS.Timeout | undefined;
  #idleTimer: NodeJS.Timeout | undefined;

  constructor(socket: Socket, config: SessionConfig, initial?: Buffer) {
    this.#socket = socket;
    this.#config = config;
    this.#reader = new FrameReader(config.maxFrameBytes, isHydraOpcode);
    config.stats.active++;
    config.stats.opened++;
    this.#closed = new Promise((resolve) => {
      socket.once('close', () => {
        clearTimeout(this.#timer);
        clearTimeout(this.#idleTimer);
        config.stats.active--;
        resolve();
      });
    });
    // Peer resets are routine; 'close' follows and does the cleanup.
    socket.on('error', () => {});
    socket.on('data', (chunk: Buffer) => this.#onData(chunk));
    // The port's server is half-open: a client that shut down its sending side after its requests
    // still gets their replies; the session ends its side once they are written.
    socket.on('end', () => {
      this.#peerEnded = true;
      this.#stopReading();
      if (this.idle) this.#end();
    });
    this.#armIdleTimer();
    if (initial !== undefined) this.#onData(initial);
    socket.resume();
  }

  /** Resolves when the connection has closed. */
  get closed(): Promise<void> {
    return this.#closed;
  }

  /** True when no request is queued or running. */
  get idle(): boolean {
    return !this.#busy && this.#work.length === 0;
  }

  /** Stops reading; closes now when idle, otherwise after the requests already read are answered. */
  drain(): void {
    this.#draining = true;
    this.#stopReading();
    if (this.idle) this.#end();
  }

  /** Closes at once. */
  destroy(): void {
    this.#socket.destroy();
  }

  #onData(chunk: Buffer): void {
    if (!this.#reading) return;
    this.#armIdleTimer();
    this.#reader.push(chunk);
    for (;;) {
      const result = this.#reader.next();
      if (result.kind === 'frame') {
        this.#work.push({ kind: 'request', frame: result.frame });
        continue;
      }
      if (result.kind === 'too-large') {
        this.#work.push({ kind: 'too-large', opcode: result.opcode });
        this.#stopReading();
      } else if (result.kind === 'bad-opcode') {
        this.#work.push({ kind: 'close' });
        this.#stopReading();
      } else if (result.partial) {
        this.#armReadTimer();
      } else {
        clearTimeout(this.#timer);
      }
      break;
    }
    if (this.#reading && this.#work.length >= this.#config.maxPipelined) {
      // Backpressure: a client cannot queue unbounded work; TCP holds the rest.
      this.#socket.pause();
      clearTimeout(this.#timer);
    }
    void this.#process();
  }

  #armReadTimer(): void {
    clearTimeout(this.#timer);
    this.#timer = setTimeout(() => {
      this.#config.stats.readTimeouts++;
      this.#config.logger.info('hydra-rpc: frame stopped arriving; closing', {
        remoteAddress: this.#socket.remoteAddress,
      });
      this.#socket.destroy();
    }, this.#config.readTimeoutMs);
  }

  // Idle means no byte from the client for idleTimeoutMs; a request still being answered is not idle
  // (the timer re-arms until it is done), and any frame, a STATUS poll included, starts it over.
  #armIdleTimer(): void {
    clearTimeout(this.#idleTimer);
    this.#idleTimer = setTimeout(() => {
      if (!this.idle) {
        this.#armIdleTimer();
        return;
      }
      this.#config.stats.idleTimeouts++;
      this.#config.logger.info('hydra-rpc: Hydra session idle; closing', {
        remoteAddress: this.#socket.remoteAddress,
        idleTimeoutMs: this.#config.idleTimeoutMs,
      });
      this.#stopReading();
      this.#end();
    }, this.#config.idleTimeoutMs);
    this.#idleTimer.unref();
  }

  #stopReading(): void {
    this.#reading = false;
    clearTimeout(this.#timer);
    this.#socket.pause();
  }

  /**
   * Sends FIN once the replies already written are flushed. After a protocol error the client may
   * still have bytes in flight: closing with unread bytes makes the kernel answer RST, which throws
   * away the replies still on their way. So that close lingers, reading and dropping input for a
   * moment. A drain (shutdown) never lingers: the server is going away and must not wait on peers.
   */
  #end(linger = false): void {
    if (this.#socket.destroyed) return;
    this.#socket.end();
    if (!linger) {
      this.#socket.once('finish', () => this.#socket.destroy());
      return;
    }
    this.#socket.resume();
    const timer = setTimeout(() => this.#socket.destroy(), LINGER_MS);
    timer.unref();
    this.#socket.once('end', () => this.#socket.destroy());
    this.#socket.once('close', () => clearTimeout(timer));
  }

  async #process(): Promise<void> {
    if (this.#busy) return;
    this.#busy = true;
    try {
      while (this.#work.length > 0 && !this.#socket.destroyed) {
        const work = this.#work.shift()!;
        if (work.kind === 'close') {
          // No reply to the bad frame; replies already written still go out before the FIN.
          this.#end(true);
          return;
        }
        if (work.kind === 'too-large') {
          const error = new HydraError(
            'HYDRA_ERR_FRAME_TOO_LARGE',
            `frame payload is over the limit of ${this.#config.maxFrameBytes} bytes`,
            { details: { limit: this.#config.maxFrameBytes } },
          );
          await this.#write(this.#errorFrame(work.opcode, 'json', error));
          this.#end(true);
          return;
        }
        await this.#write(await this.#answer(work.frame));
        if (this.#reading && this.#socket.isPaused() && this.#work.length < this.#config.maxPipelined) {
          this.#socket.resume();
          if (this.#reader.buffered > 0) this.#armReadTimer();
        }
      }
    } finally {
      this.#busy = false;
    }
    if (this.#draining || this.#peerEnded) this.#end();
  }

  #write(frame: Buffer): Promise<void> {
    if (this.#socket.destroyed) return Promise.resolve();
    if (this.#socket.write(frame)) return Promise.resolve();
    return new Promise((resolve) => {
      const done = (): void => {
        this.#socket.off('drain', done);
        this.#socket.off('close', done);
        resolve();
      };
      this.#socket.on('drain', done);
      this.#socket.on('close', done);
    });
  }

  async #answer(frame: Frame): Promise<Buffer> {
    const { opcode } = frame;
    let encoding: Encoding = sniffEncoding(frame.payload) ?? 'json';
    try {
      const decoded = decodePayload(frame.payload);
      encoding = decoded.encoding;
      const name = opcodeName(opcode);
      if (name === undefined) {
        throw new HydraError(
          'HYDRA_ERR_UNKNOWN_OPCODE',
          `opcode 0x${opcode.toString(16)} is not defined by protocol version 1`,
        );
      }
      const handler = this.#config.handlers.get(opcode);
      if (handler === undefined) {
        throw new HydraError('HYDRA_ERR_NO_HANDLER', `this engine serves no ${name} handler`);
      }
      const request = decodeBinaryFields(decoded.value, BINARY_FIELDS.request[name]);
      const result = await handler(request, {
        opcode,
        name,
        encoding,
        remoteAddress: this.#socket.remoteAddress,
      });
      if (typeof result !== 'object' || result === null || Array.isArray(result)) {
        throw new Error(
          `${name} handler returned ${result === null ? 'null' : typeof result}, not an object`,
        );
      }
      const reply = encodePayload({ ...(result as Payload), success: true }, encoding);
      this.#config.stats.requests++;
      return encodeFrame(opcode, reply);
    } catch (err) {
      return this.#errorFrame(opcode, encoding, err);
    }
  }

  #errorFrame(opcode: number, encoding: Encoding, err: unknown): Buffer {
    let error: WireError;
    if (err instanceof HydraError) {
      error = err.toJSON();
    } else if (isHydraError(err)) {
      const keys = (err as { keys?: unknown }).keys;
      error = { code: err.code, message: String(err.message) };
      if (Array.isArray(keys)) error.keys = keys.map(String);
    } else {
      this.#config.logger.error('hydra-rpc: handler failed', { opcode, err });
      error = { code: 'HYDRA_ERR_INTERNAL', message: 'internal error' };
    }
    const { stats } = this.#config;
    stats.requests++;
    stats.errors[error.code] = (stats.errors[error.code] ?? 0) + 1;
    try {
      return encodeFrame(opcode, encodePayload({ success: false, error }, encoding));
    } catch {
      // details a handler attached may not encode (BigInt, cycles): the code and message always do.
      return encodeFrame(
        opcode,
        encodePayload({ success: false, error: { code: error.code, message: error.message } }, encoding),
      );
    }
  }
}
