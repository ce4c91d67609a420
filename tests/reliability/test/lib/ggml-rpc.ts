import { connect, type Socket } from 'node:net';

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
export const GGML_OP_NONE = 0;
export const GGML_OP_ADD = 2;

export interface RpcTensor {
  id: bigint;
  type: number;
  buffer: bigint;
  ne: [number, number, number, number];
  nb: [number, number, number, number];
  op: number;
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
  // op_params (56..119) and flags (120) stay zero
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
      const s = connect({ port, host: options.host ?? '127.0.0.1', localAddress: options.localAddress });
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
