import { connect, createServer, type Socket } from 'node:net';
import { Worker } from 'node:worker_threads';
import { detachFd, initBackend, peekFirstByte, rpcWorkerPath } from '@hydra-engine/native-ggml';

/**
 * A minimal ggml-RPC client of the pinned upstream wire format (ggml/src/ggml-rpc/ggml-rpc.cpp,
 * protocol 6.0.0), written from the packed structs so the suite can send what a real client never
 * would.
 */
export const CMD = {
  ALLOC_BUFFER: 0,
  GET_ALIGNMENT: 1,
  GET_MAX_SIZE: 2,
  BUFFER_GET_BASE: 3,
  FREE_BUFFER: 4,
  BUFFER_CLEAR: 5,
  SET_TENSOR: 6,
  SET_TENSOR_HASH: 7,
  GET_TENSOR: 8,
  COPY_TENSOR: 9,
  GRAPH_COMPUTE: 10,
  GET_DEVICE_MEMORY: 11,
  INIT_TENSOR: 12,
  GET_ALLOC_SIZE: 13,
  HELLO: 14,
  DEVICE_COUNT: 15,
  GRAPH_RECOMPUTE: 16,
  MEMSET_TENSOR: 17,
  NONE: 18,
  COUNT: 19,
} as const;

const CONN_CAPS = 24;
/** sizeof(rpc_tensor): GGML_MAX_DIMS 4, GGML_MAX_OP_PARAMS 64, GGML_MAX_SRC 10, GGML_MAX_NAME 64. */
export const RPC_TENSOR_BYTES = 296;
export const GGML_TYPE_F32 = 0;
export const GGML_TYPE_F16 = 1;
export const GGML_TYPE_I32 = 26;
export const GGML_TYPE_I64 = 27;
/** enum ggml_op of the pinned ggml.h. */
export const GGML_TENSOR_FLAG_COMPUTE = 16;
export const GGML_OP_NONE = 0;
export const GGML_OP_ADD = 2;
export const GGML_OP_ADD_ID = 3;
export const GGML_OP_RMS_NORM = 25;
export const GGML_OP_MUL_MAT = 29;
export const GGML_OP_SCALE = 32;
export const GGML_OP_SET_ROWS = 42;
export const GGML_OP_SSM_CONV = 76;
export const GGML_OP_CUSTOM = 95;
export const GGML_OP_COUNT = 101;

export interface RpcTensor {
  id: bigint;
  type: number;
  buffer: bigint;
  ne: [number, number, number, number];
  nb: [number, number, number, number];
  op: number;
  /** op_params as 16 int32 (the rest zero). */
  opParams?: number[];
  /** GGML_TENSOR_FLAG_*: a graph node runs only with GGML_TENSOR_FLAG_COMPUTE (16). */
  flags?: number;
  src: bigint[];
  viewSrc: bigint;
  viewOffs: bigint;
  data: bigint;
  name: string;
  useCount: number;
}

/** A contiguous f32 tensor of `n` elements at `data` in `buffer`. */
export function f32Tensor(id: bigint, buffer: bigint, data: bigint, n: number): RpcTensor {
  return {
    id,
    type: GGML_TYPE_F32,
    buffer,
    ne: [n, 1, 1, 1],
    nb: [4, 4 * n, 4 * n, 4 * n],
    op: GGML_OP_NONE,
    src: [],
    viewSrc: 0n,
    viewOffs: 0n,
    data,
    name: `t${id}`,
    useCount: 0,
  };
}

export function encodeTensor(t: RpcTensor): Buffer {
  const b = Buffer.alloc(RPC_TENSOR_BYTES);
  b.writeBigUInt64LE(t.id, 0);
  b.writeUInt32LE(t.type >>> 0, 8);
  b.writeBigUInt64LE(t.buffer, 12);
  for (let i = 0; i < 4; i++) {
    b.writeUInt32LE(t.ne[i]! >>> 0, 20 + 4 * i);
    b.writeUInt32LE(t.nb[i]! >>> 0, 36 + 4 * i);
  }
  b.writeUInt32LE(t.op >>> 0, 52);
  b.writeInt32LE(t.flags ?? 0, 120);
  // op_params at 56..119, flags at 120
  for (const [i, v] of (t.opParams ?? []).slice(0, 16).entries()) b.writeInt32LE(v | 0, 56 + 4 * i);
  for (const [i, v] of t.src.slice(0, 10).entries()) b.writeBigUInt64LE(v, 124 + 8 * i);
  b.writeBigUInt64LE(t.viewSrc, 204);
  b.writeBigUInt64LE(t.viewOffs, 212);
  b.writeBigUInt64LE(t.data, 220);
  b.write(t.name.slice(0, 63), 228, 'latin1');
  b.writeInt32LE(t.useCount, 292);
  return b;
}

/** `| cmd u8 | size u64 | payload |`; `size` may lie about the payload. */
export function command(cmd: number, payload: Uint8Array = Buffer.alloc(0), size?: bigint): Buffer {
  const b = Buffer.alloc(9 + payload.byteLength);
  b.writeUInt8(cmd, 0);
  b.writeBigUInt64LE(size ?? BigInt(payload.byteLength), 1);
  b.set(payload, 9);
  return b;
}

export function u32(v: number): Buffer {
  const b = Buffer.alloc(4);
  b.writeUInt32LE(v >>> 0);
  return b;
}

export function u64(v: bigint): Buffer {
  const b = Buffer.alloc(8);
  b.writeBigUInt64LE(BigInt.asUintN(64, v));
  return b;
}

/** A raw ggml-RPC connection with a byte queue for reading replies. */
export class RpcConn {
  readonly socket: Socket;
  #buf = Buffer.alloc(0);
  #waiters: (() => void)[] = [];
  #closed = false;

  private constructor(socket: Socket) {
    this.socket = socket;
    socket.on('data', (d: Buffer) => {
      this.#buf = Buffer.concat([this.#buf, d]);
      this.#wake();
    });
    socket.on('close', () => {
      this.#closed = true;
      this.#wake();
    });
    socket.on('error', () => {});
  }

  #wake() {
    for (const w of this.#waiters.splice(0)) w();
  }

  static open(port: number, options: { localAddress?: string; host?: string } = {}): Promise<RpcConn> {
    return new Promise((resolve, reject) => {
      const s = connect({
        port,
        host: options.host ?? '127.0.0.1',
        localAddress: options.localAddress,
        noDelay: true,
      });
      s.once('connect', () => resolve(new RpcConn(s)));
      s.once('error', reject);
    });
  }

  get closed(): boolean {
    return this.#closed;
  }

  write(b: Uint8Array): void {
    if (!this.socket.destroyed) this.socket.write(b);
  }

  /** Reads exactly `n` bytes; undefined when the peer closes first or `timeoutMs` passes. */
  async read(n: number, timeoutMs = 5_000): Promise<Buffer | undefined> {
    const end = Date.now() + timeoutMs;
    while (this.#buf.byteLength < n) {
      if (this.#closed || Date.now() > end) return undefined;
      await new Promise<void>((r) => {
        const t = setTimeout(r, Math.max(1, end - Date.now()));
        this.#waiters.push(() => {
          clearTimeout(t);
          r();
        });
      });
    }
    const out = this.#buf.subarray(0, n);
    this.#buf = this.#buf.subarray(n);
    return out;
  }

  /** Reads one `| size u64 | payload |` reply. */
  async reply(timeoutMs = 5_000): Promise<Buffer | undefined> {
    const head = await this.read(8, timeoutMs);
    if (!head) return undefined;
    return this.read(Number(head.readBigUInt64LE(0)), timeoutMs);
  }

  /** Resolves true when the peer closes within `timeoutMs`. */
  async waitClosed(timeoutMs = 5_000): Promise<boolean> {
    const end = Date.now() + timeoutMs;
    while (!this.#closed && Date.now() < end) {
      await new Promise<void>((r) => {
        const t = setTimeout(r, Math.max(1, end - Date.now()));
        this.#waiters.push(() => {
          clearTimeout(t);
          r();
        });
      });
    }
    return this.#closed;
  }

  async hello(): Promise<{ major: number; minor: number; patch: number }> {
    this.write(command(CMD.HELLO, Buffer.alloc(CONN_CAPS)));
    const r = await this.reply();
    if (!r) throw new Error('no HELLO reply');
    return { major: r[0]!, minor: r[1]!, patch: r[2]! };
  }

  /** ALLOC_BUFFER on device 0: the remote buffer id (a server pointer) and its size. */
  async alloc(size: bigint): Promise<{ ptr: bigint; size: bigint }> {
    this.write(command(CMD.ALLOC_BUFFER, Buffer.concat([u32(0), u64(size)])));
    const r = await this.reply();
    if (!r) throw new Error('no ALLOC_BUFFER reply');
    return { ptr: r.readBigUInt64LE(0), size: r.readBigUInt64LE(8) };
  }

  async base(ptr: bigint): Promise<bigint> {
    this.write(command(CMD.BUFFER_GET_BASE, u64(ptr)));
    const r = await this.reply();
    if (!r) throw new Error('no BUFFER_GET_BASE reply');
    return r.readBigUInt64LE(0);
  }

  async deviceCount(): Promise<number | undefined> {
    this.write(command(CMD.DEVICE_COUNT));
    const r = await this.reply();
    return r?.readUInt32LE(0);
  }

  destroy(): void {
    this.socket.destroy();
  }
}

/** The summary serveRpcFd returns for one session (the fields these tests read). */
export interface ServeSummary {
  ended: string;
  reason?: string;
  refusedCommand?: string;
  refusals: number;
  allocDenied: number;
  allocBytesPeak: number;
  commands: number;
}

/**
 * A loopback ggml-RPC server built from native-ggml's own pieces with chosen session limits: peek
 * the first byte, detach the fd, serve it with the rpc-worker module in a worker thread (the merged
 * port's path, minus the port). `summaries` resolve when each session ends.
 */
export async function startGuardedServer(limits: Record<string, unknown>): Promise<{
  port: number;
  summaries: Promise<ServeSummary>[];
  close(): Promise<void>;
}> {
  initBackend({ logLevel: 'error' });
  const summaries: Promise<ServeSummary>[] = [];
  const server = createServer({ pauseOnConnect: true }, (socket: Socket) => {
    const fd = (socket as unknown as { _handle: { fd: number } })._handle.fd;
    const summary = peekFirstByte(fd, 5000).then((byte) => {
      if (byte !== CMD.HELLO) {
        socket.destroy();
        throw new Error(`first byte ${byte}`);
      }
      const served = detachFd(fd);
      socket.destroy();
      const worker = new Worker(
        `const { parentPort, workerData } = require('node:worker_threads');
           import(workerData.path).then(
             (m) => { try { parentPort.postMessage({ ok: m.default(workerData.task) }); }
                      catch (e) { parentPort.postMessage({ code: e.code, message: String(e.message) }); } });`,
        {
          eval: true,
          workerData: { path: rpcWorkerPath, task: { fd: served, devices: ['CPU'], threads: 1, limits } },
        },
      );
      return new Promise<ServeSummary>((resolve, reject) => {
        worker.once('message', (m: { ok?: ServeSummary; code?: string; message?: string }) => {
          void worker.terminate();
          if (m.ok) resolve(m.ok);
          else reject(Object.assign(new Error(m.message), { code: m.code }));
        });
        worker.once('error', reject);
      });
    });
    // a refusal is the tests' to assert, whenever they get to it
    summary.catch(() => undefined);
    summaries.push(summary);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const address = server.address();
  if (address === null || typeof address === 'string') throw new Error('no port');
  return {
    port: address.port,
    summaries,
    close: async () => {
      await new Promise<void>((resolve) => server.close(() => resolve()));
      // A worker is never terminated inside serveRpcFd (its summary would be built in a dying
      // env): each session ends when its client leaves, and the workers end with their sessions.
      await Promise.race([Promise.allSettled(summaries), new Promise((r) => setTimeout(r, 5_000))]);
    },
  };
}

/** GRAPH_COMPUTE: | device u32 | n_nodes u32 | node ids u64[] | n_tensors u32 | rpc_tensor[] |. */
export function graphCompute(
  device: number,
  nodes: bigint[],
  tensors: RpcTensor[],
  nNodes = nodes.length,
): Buffer {
  return command(
    CMD.GRAPH_COMPUTE,
    Buffer.concat([
      u32(device),
      u32(nNodes),
      ...nodes.map(u64),
      u32(tensors.length),
      ...tensors.map(encodeTensor),
    ]),
  );
}

export function setTensorCmd(tensor: RpcTensor, offset: bigint, data: Buffer): Buffer {
  return command(CMD.SET_TENSOR, Buffer.concat([encodeTensor(tensor), u64(offset), data]));
}

export function getTensorCmd(tensor: RpcTensor, offset: bigint, size: bigint): Buffer {
  return command(CMD.GET_TENSOR, Buffer.concat([encodeTensor(tensor), u64(offset), u64(size)]));
}
