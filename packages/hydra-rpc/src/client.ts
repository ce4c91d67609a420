import { connect as netConnect, type Socket } from 'node:net';
import {
  decodeBinaryFields,
  decodePayload,
  type Encoding,
  encodeFrame,
  encodePayload,
  FrameReader,
  type Payload,
} from './codec.js';
import { badOption, HydraError } from './errors.js';
import { BINARY_FIELDS, OPCODES, type OpcodeName } from './opcodes.js';
import type {
  ConfigureRequest,
  ConfigureResponse,
  HelloRequest,
  HelloResponse,
  HydraRequests,
  HydraResponses,
  PlanRequest,
  PlanResponse,
  SetExpertModeResponse,
  StateGetRequest,
  StateGetResponse,
  StatePutRequest,
  StatePutResponse,
  StatusResponse,
  SwapQuantResponse,
} from './types.js';

/** Options of {@link HydraClient.connect}. */
export interface HydraClientOptions {
  /** Port of the engine. */
  port: number;
  /** Host of the engine; default `127.0.0.1`. */
  host?: string;
  /** Source address to bind (e.g. to pick an interface). */
  localAddress?: string;
  /** Payload encoding of requests; default `json`. */
  encoding?: Encoding;
  /** Per-request reply timeout; default 10 000 ms. */
  timeoutMs?: number;
  /** Connect timeout; default 5 000 ms. */
  connectTimeoutMs?: number;
  /** Largest reply payload accepted; default 256 MiB. */
  maxFrameBytes?: number;
}

/** Per-request overrides. */
export interface RequestOptions {
  encoding?: Encoding;
  timeoutMs?: number;
}

interface Pending {
  opcode: number;
  resolve(value: Payload): void;
  reject(err: Error): void;
  timer: NodeJS.Timeout | undefined;
  settled: boolean;
}

function checkPositive(name: string, value: number): number {
  if (!Number.isSafeInteger(value) || value <= 0) throw badOption(name, 'must be a positive integer');
  return value;
}

/**
 * A client of the Hydra control protocol over one connection. Requests may be pipelined: each call
 * writes its frame at once and replies are matched in order. Typed methods throw a HydraError
 * carrying the server's code when a reply has `success: false`.
 */
export class HydraClient {
  readonly #socket: Socket;
  readonly #reader: FrameReader;
  readonly #encoding: Encoding;
  readonly #timeoutMs: number;
  readonly #pending: Pending[] = [];
  #closedError: HydraError | undefined;

  private constructor(
    socket: Socket,
    options: Required<Pick<HydraClientOptions, 'encoding' | 'timeoutMs' | 'maxFrameBytes'>>,
  ) {
    this.#socket = socket;
    this.#encoding = options.encoding;
    this.#timeoutMs = options.timeoutMs;
    this.#reader = new FrameReader(options.maxFrameBytes);
    socket.setNoDelay(true);
    socket.on('data', (chunk: Buffer) => this.#onData(chunk));
    socket.on('error', () => {});
    socket.on('close', () =>
      this.#failAll(new HydraError('HYDRA_ERR_CONNECTION_CLOSED', 'connection closed')),
    );
  }

  /** Opens a connection to an engine's port. */
  static connect(options: HydraClientOptions): Promise<HydraClient> {
    if (typeof options !== 'object' || options === null) throw badOption('', 'must be an object');
    if (!Number.isInteger(options.port) || options.port <= 0 || options.port > 65535) {
      throw badOption('port', 'must be an integer in 1..65535');
    }
    const encoding = options.encoding ?? 'json';
    if (encoding !== 'json' && encoding !== 'msgpack')
      throw badOption('encoding', 'must be "json" or "msgpack"');
    const timeoutMs = checkPositive('timeoutMs', options.timeoutMs ?? 10_000);
    const connectTimeoutMs = checkPositive('connectTimeoutMs', options.connectTimeoutMs ?? 5_000);
    const maxFrameBytes = checkPositive('maxFrameBytes', options.maxFrameBytes ?? 256 * 1024 * 1024);
    return new Promise((resolve, reject) => {
      const socket = netConnect({
        port: options.port,
        host: options.host ?? '127.0.0.1',
        ...(options.localAddress === undefined ? {} : { localAddress: options.localAddress }),
      });
      const timer = setTimeout(() => {
        socket.destroy();
        reject(new HydraError('HYDRA_ERR_TIMEOUT', `connect timed out after ${connectTimeoutMs} ms`));
      }, connectTimeoutMs);
      socket.once('error', (err) => {
        clearTimeout(timer);
        reject(
          new HydraError('HYDRA_ERR_CONNECTION_CLOSED', `connect failed: ${err.message}`, { cause: err }),
        );
      });
      socket.once('connect', () => {
        clearTimeout(timer);
        socket.removeAllListeners('error');
        resolve(new HydraClient(socket, { encoding, timeoutMs, maxFrameBytes }));
      });
    });
  }

  /** True once the connection has closed. */
  get closed(): boolean {
    return this.#closedError !== undefined || this.#socket.destroyed;
  }

  /**
   * Sends one request and resolves with the whole reply payload (`success` included), whatever
   * `success` says. Rejects with HYDRA_ERR_TIMEOUT or HYDRA_ERR_CONNECTION_CLOSED.
   */
  request(opcode: number, payload: Payload = {}, options: RequestOptions = {}): Promise<Payload> {
    if (!Number.isInteger(opcode) || opcode < 0 || opcode > 0xff) {
      return Promise.reject(badOption('opcode', 'must be a byte'));
    }
    return this.#send(opcode, encodePayload(payload, options.encoding ?? this.#encoding), options.timeoutMs);
  }

  /** Sends an already-encoded payload (any bytes, for tests of the server's limits). */
  requestRaw(
    opcode: number,
    payload: Uint8Array,
    options: Pick<RequestOptions, 'timeoutMs'> = {},
  ): Promise<Payload> {
    return this.#send(opcode, payload, options.timeoutMs);
  }

  /** Sends a typed request and returns the reply fields; throws a HydraError on `success: false`. */
  async call<K extends OpcodeName>(
    name: K,
    request: HydraRequests[K],
    options: RequestOptions = {},
  ): Promise<HydraResponses[K]> {
    const reply = await this.request(OPCODES[name], request as Payload, options);
    if (reply.success === true) {
      try {
        return decodeBinaryFields(reply, BINARY_FIELDS.response[name]) as unknown as HydraResponses[K];
      } catch (cause) {
        throw new HydraError('HYDRA_ERR_BAD_RESPONSE', `${name} reply has a malformed binary field`, {
          cause,
        });
      }
    }
    throw replyError(name, reply);
  }

  hello(request: HelloRequest = {}, options?: RequestOptions): Promise<HelloResponse> {
    return this.call('HELLO', request, options);
  }

  status(options?: RequestOptions): Promise<StatusResponse> {
    return this.call('STATUS', {}, options);
  }

  configure(delta: ConfigureRequest, options?: RequestOptions): Promise<ConfigureResponse> {
    return this.call('CONFIGURE', delta, options);
  }

  plan(delta: PlanRequest, options?: RequestOptions): Promise<PlanResponse> {
    return this.call('PLAN', delta, options);
  }

  stateGet(request: StateGetRequest = {}, options?: RequestOptions): Promise<StateGetResponse> {
    return this.call('STATE_GET', request, options);
  }

  statePut(request: StatePutRequest, options?: RequestOptions): Promise<StatePutResponse> {
    return this.call('STATE_PUT', request, options);
  }

  setExpertMode(mode: 'solo' | 'combined', options?: RequestOptions): Promise<SetExpertModeResponse> {
    return this.call('SET_EXPERT_MODE', { mode }, options);
  }

  swapQuant(model: string, options?: RequestOptions): Promise<SwapQuantResponse> {
    return this.call('SWAP_QUANT', { model }, options);
  }

  /** Retired: always rejects with HYDRA_ERR_RETIRED from a conforming server. */
  pipelineAttach(
    request: Record<string, unknown> = {},
    options?: RequestOptions,
  ): Promise<Record<string, never>> {
    return this.call('PIPELINE_ATTACH', request, options);
  }

  /** Closes the connection; pending requests reject with HYDRA_ERR_CONNECTION_CLOSED. */
  close(): Promise<void> {
    if (this.#socket.destroyed) return Promise.resolve();
    return new Promise((resolve) => {
      this.#socket.once('close', () => resolve());
      this.#socket.destroy();
    });
  }

  #send(opcode: number, payload: Uint8Array, timeoutMs = this.#timeoutMs): Promise<Payload> {
    if (this.closed) {
      return Promise.reject(
        this.#closedError ?? new HydraError('HYDRA_ERR_CONNECTION_CLOSED', 'connection closed'),
      );
    }
    return new Promise((resolve, reject) => {
      const entry: Pending = { opcode, resolve, reject, timer: undefined, settled: false };
      // A timed-out request keeps its place: its late reply still arrives in order and is dropped.
      entry.timer = setTimeout(() => {
        entry.settled = true;
        reject(
          new HydraError(
            'HYDRA_ERR_TIMEOUT',
            `no reply to opcode 0x${opcode.toString(16)} in ${timeoutMs} ms`,
          ),
        );
      }, timeoutMs);
      this.#pending.push(entry);
      this.#socket.write(encodeFrame(opcode, payload));
    });
  }

  #onData(chunk: Buffer): void {
    this.#reader.push(chunk);
    for (;;) {
      const result = this.#reader.next();
      if (result.kind === 'need-more') return;
      if (result.kind !== 'frame') {
        this.#broken('reply frame is over the client limit');
        return;
      }
      const entry = this.#pending.shift();
      if (entry === undefined || entry.opcode !== result.frame.opcode) {
        this.#broken(`unexpected reply opcode 0x${result.frame.opcode.toString(16)}`);
        return;
      }
      clearTimeout(entry.timer);
      if (entry.settled) continue;
      entry.settled = true;
      try {
        const { value } = decodePayload(result.frame.payload);
        entry.resolve(value);
      } catch (cause) {
        entry.reject(new HydraError('HYDRA_ERR_BAD_RESPONSE', 'reply payload is not an object', { cause }));
      }
    }
  }

  #broken(message: string): void {
    this.#failAll(new HydraError('HYDRA_ERR_BAD_RESPONSE', message));
    this.#socket.destroy();
  }

  #failAll(err: HydraError): void {
    this.#closedError ??= err;
    for (const entry of this.#pending.splice(0)) {
      clearTimeout(entry.timer);
      if (!entry.settled) {
        entry.settled = true;
        entry.reject(err);
      }
    }
  }
}

function replyError(name: string, reply: Payload): HydraError {
  const error = reply.error as
    | { code?: unknown; message?: unknown; keys?: unknown; details?: unknown }
    | undefined;
  const message = typeof error?.message === 'string' ? error.message : `${name} failed`;
  const keys = Array.isArray(error?.keys) ? error.keys.map(String) : undefined;
  const details =
    typeof error?.details === 'object' && error.details !== null
      ? (error.details as Record<string, unknown>)
      : undefined;
  if (typeof error?.code === 'string' && /^HYDRA_ERR_[A-Z0-9_]+$/.test(error.code)) {
    return new HydraError(error.code, message, { ...(keys && { keys }), ...(details && { details }) });
  }
  return new HydraError('HYDRA_ERR_BAD_RESPONSE', `${name} failed without a valid error code`, {
    details: { reply },
  });
}
