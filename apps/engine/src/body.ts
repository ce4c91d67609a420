import type { IncomingMessage } from 'node:http';
import { Worker } from 'node:worker_threads';
import { type ErrorCode, HydraError } from './errors.js';

/**
 * Reads a request body with a size cap (HYDRA_ERR_BODY_TOO_LARGE, a declared content-length
 * included) and a deadline (HYDRA_ERR_REQUEST_TIMEOUT). A refused body is drained, not read.
 */
export function readBody(req: IncomingMessage, maxBytes: number, timeoutMs: number): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const declared = Number(req.headers['content-length']);
    if (Number.isFinite(declared) && declared > maxBytes) {
      reject(
        new HydraError('HYDRA_ERR_BODY_TOO_LARGE', `the body is ${declared} bytes; the limit is ${maxBytes}`),
      );
      return;
    }
    const chunks: Buffer[] = [];
    let size = 0;
    let done = false;
    const finish = (err: HydraError | undefined, value?: Buffer) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      if (err) {
        req.removeAllListeners('data');
        req.resume();
        reject(err);
      } else resolve(value as Buffer);
    };
    const timer = setTimeout(
      () =>
        finish(
          new HydraError(
            'HYDRA_ERR_REQUEST_TIMEOUT',
            `the request body did not arrive within ${timeoutMs} ms`,
          ),
        ),
      timeoutMs,
    );
    req.on('data', (chunk: Buffer) => {
      size += chunk.length;
      if (size > maxBytes) {
        finish(new HydraError('HYDRA_ERR_BODY_TOO_LARGE', `the body exceeds the limit of ${maxBytes} bytes`));
        return;
      }
      chunks.push(chunk);
    });
    req.on('end', () => finish(undefined, Buffer.concat(chunks)));
    req.on('error', (err) =>
      finish(new HydraError('HYDRA_ERR_BAD_REQUEST', `reading the body failed: ${err.message}`)),
    );
  });
}

/**
 * Reads a body that must be a JSON object (the control routes'); an empty body is `{}`.
 * Rejects as readBody does, and with HYDRA_ERR_BAD_JSON or HYDRA_ERR_BAD_REQUEST.
 */
export async function readJsonObject(
  req: IncomingMessage,
  maxBytes: number,
  timeoutMs: number,
): Promise<Record<string, unknown>> {
  const text = (await readBody(req, maxBytes, timeoutMs)).toString('utf8');
  if (text.trim() === '') return {};
  let body: unknown;
  try {
    body = JSON.parse(text);
  } catch (err) {
    throw new HydraError('HYDRA_ERR_BAD_JSON', `the body is not valid JSON: ${(err as Error).message}`);
  }
  if (typeof body !== 'object' || body === null || Array.isArray(body))
    throw new HydraError('HYDRA_ERR_BAD_REQUEST', 'the body must be a JSON object');
  return body as Record<string, unknown>;
}

/** A completion request body, parsed and checked, with its bulky parts in compact form. */
export interface PreparedBody {
  /** The JSON object, without `messages` (chat) and without a token-array `prompt`. */
  body: Record<string, unknown>;
  /**
   * Chat messages, packed as native-ggml's `packChatMessages` does, with their count and text
   * bytes; with Jinja templates also as sent, as JSON text (`messagesJson`: tool_calls,
   * tool_call_id and reasoning_content are theirs to render), made off the JS thread for big bodies.
   */
  chat?: { packed: Uint8Array; count: number; bytes: number; messagesJson?: Uint8Array };
  /** A `prompt` of token ids, and the largest id (checked against the vocabulary). */
  tokens?: { ids: Int32Array; max: number };
}

type Outcome =
  | ({ ok: true } & PreparedBody)
  | { ok: false; code: ErrorCode; message: string; keys?: string[] };

/**
 * Parses and checks a completion body. Self-contained (no outer names, no imports): the same
 * source also runs as the body of the parser worker thread.
 */
function prepare(data: Uint8Array, chat: boolean, maxMessages: number, jinja = false): Outcome {
  const fail = (code: ErrorCode, message: string, key?: string): Outcome => ({
    ok: false,
    code,
    message,
    ...(key ? { keys: [key] } : {}),
  });
  const bad = (message: string, key?: string) => fail('HYDRA_ERR_BAD_REQUEST', message, key);
  let body: unknown;
  try {
    // ignoreBOM keeps a BOM in the text, where JSON.parse refuses it, as Buffer#toString does.
    body = JSON.parse(new TextDecoder('utf-8', { ignoreBOM: true }).decode(data));
  } catch (err) {
    return fail('HYDRA_ERR_BAD_JSON', `the body is not valid JSON: ${(err as Error).message}`);
  }
  if (typeof body !== 'object' || body === null || Array.isArray(body))
    return bad('the body must be a JSON object');
  const b = body as Record<string, unknown>;
  const out: { ok: true } & PreparedBody = { ok: true, body: b };
  if (chat) {
    const messages = b.messages;
    if (!Array.isArray(messages) || messages.length === 0)
      return bad('messages must be a non-empty array', 'messages');
    if (messages.length > maxMessages) {
      return fail(
        'HYDRA_ERR_TOO_MANY_MESSAGES',
        `${messages.length} messages; the limit is ${maxMessages}`,
        'messages',
      );
    }
    const enc = new TextEncoder();
    const parts: Uint8Array[] = [];
    let bytes = 0;
    for (let i = 0; i < messages.length; i++) {
      const m = messages[i];
      if (typeof m !== 'object' || m === null) return bad(`messages[${i}] must be an object`, 'messages');
      const { role, content, tool_calls, tool_call_id, reasoning_content } = m as Record<string, unknown>;
      if (typeof role !== 'string' || role.length === 0)
        return bad(`messages[${i}].role must be a string`, 'messages');
      // The legacy template renderer takes a role and a text: these would be dropped unseen.
      const lost = jinja
        ? undefined
        : Array.isArray(tool_calls) && tool_calls.length > 0
          ? 'tool_calls'
          : tool_call_id !== undefined && tool_call_id !== null
            ? 'tool_call_id'
            : typeof reasoning_content === 'string' && reasoning_content !== ''
              ? 'reasoning_content'
              : undefined;
      if (lost)
        return fail(
          'HYDRA_ERR_UNSUPPORTED_FIELD',
          `messages[${i}].${lost} is not supported yet (it needs Jinja chat templates)`,
          'messages',
        );
      let text = '';
      if (typeof content === 'string') text = content;
      else if (Array.isArray(content)) {
        for (let j = 0; j < content.length; j++) {
          const p = content[j] as Record<string, unknown> | null;
          if (p?.type !== 'text' || typeof p.text !== 'string')
            return bad(`messages[${i}].content[${j}]: only text parts are supported`, 'messages');
          text += p.text;
        }
      } else if (content !== null && content !== undefined)
        return bad(`messages[${i}].content must be a string or an array of text parts`, 'messages');
      const r = enc.encode(role);
      const c = enc.encode(text);
      parts.push(r, c);
      bytes += r.length + c.length;
    }
    const packed = new Uint8Array(4 + 4 * parts.length + bytes);
    const view = new DataView(packed.buffer);
    view.setUint32(0, messages.length, true);
    let at = 4;
    for (const p of parts) {
      view.setUint32(at, p.length, true);
      packed.set(p, at + 4);
      at += 4 + p.length;
    }
    delete b.messages;
    out.chat = {
      packed,
      count: messages.length,
      bytes,
      ...(jinja ? { messagesJson: enc.encode(JSON.stringify(messages)) } : {}),
    };
  } else if (Array.isArray(b.prompt) && b.prompt.length > 0 && b.prompt.every((t) => typeof t === 'number')) {
    // A token array (as OpenAI allows) lets a client continue a slot exactly where it stopped.
    // Other arrays (several prompts, strings mixed with ids) are the route's to read.
    const ids = new Int32Array(b.prompt.length);
    let max = 0;
    for (let i = 0; i < ids.length; i++) {
      const t = b.prompt[i];
      if (!Number.isSafeInteger(t) || (t as number) < 0)
        return bad('prompt must be a string or an array of token ids', 'prompt');
      ids[i] = t as number;
      if ((t as number) > max) max = t as number;
    }
    delete b.prompt;
    out.tokens = { ids, max };
  }
  return out;
}

/** Bodies from this size up are parsed on the worker thread; smaller ones inline (cheaper). */
export const WORKER_MIN_BYTES = 128 * 1024;

const WORKER_SOURCE = `
const prepare = ${prepare.toString()};
const { parentPort } = require('node:worker_threads');
parentPort.on('message', ({ id, data, chat, maxMessages, jinja }) => {
  let out;
  try {
    out = prepare(data, chat, maxMessages, jinja);
  } catch (err) {
    out = { ok: false, code: 'HYDRA_ERR_INTERNAL', message: String(err && err.message || err) };
  }
  const transfer = [];
  if (out.ok && out.chat) transfer.push(out.chat.packed.buffer);
  if (out.ok && out.chat && out.chat.messagesJson) transfer.push(out.chat.messagesJson.buffer);
  if (out.ok && out.tokens) transfer.push(out.tokens.ids.buffer);
  parentPort.postMessage({ id, out }, transfer);
});
`;

function settle(out: Outcome): PreparedBody {
  if (!out.ok) throw new HydraError(out.code, out.message, out.keys ? { keys: out.keys } : {});
  const { ok: _, ...prepared } = out;
  return prepared;
}

/**
 * Parses completion bodies: JSON.parse of a multi-megabyte body (150k chat messages: 60-90 ms on
 * the 2-core CI machine) and the walk over its messages run on one worker thread, so the event
 * loop, and `/health`, never wait for them. Small bodies are parsed inline.
 */
export class BodyParser {
  #worker: Worker | undefined;
  #next = 0;
  readonly #pending = new Map<number, { resolve: (p: PreparedBody) => void; reject: (e: unknown) => void }>();

  /**
   * Throws (or rejects with) HYDRA_ERR_BAD_JSON, HYDRA_ERR_BAD_REQUEST, HYDRA_ERR_TOO_MANY_MESSAGES.
   * `jinja`: chat messages are also kept as sent, and their tool fields are not refused.
   */
  async parse(data: Buffer, chat: boolean, maxMessages: number, jinja = false): Promise<PreparedBody> {
    if (data.length < WORKER_MIN_BYTES) return settle(prepare(data, chat, maxMessages, jinja));
    const worker = this.#spawn();
    const id = this.#next++;
    // A large Buffer.concat result owns its ArrayBuffer: hand it over; a pooled slice is copied.
    const own = data.byteOffset === 0 && data.byteLength === data.buffer.byteLength;
    const bytes = own ? new Uint8Array(data.buffer) : Uint8Array.from(data);
    return new Promise((resolve, reject) => {
      this.#pending.set(id, { resolve, reject });
      if (this.#pending.size === 1) worker.ref();
      worker.postMessage({ id, data: bytes, chat, maxMessages, jinja }, [bytes.buffer as ArrayBuffer]);
    });
  }

  #spawn(): Worker {
    if (this.#worker) return this.#worker;
    const worker = new Worker(WORKER_SOURCE, { eval: true });
    worker.unref();
    worker.on('message', ({ id, out }: { id: number; out: Outcome }) => {
      const p = this.#pending.get(id);
      if (!p) return;
      this.#pending.delete(id);
      if (this.#pending.size === 0) worker.unref();
      try {
        p.resolve(settle(out));
      } catch (err) {
        p.reject(err);
      }
    });
    const fail = (err: unknown) => {
      if (this.#worker === worker) this.#worker = undefined;
      for (const p of this.#pending.values())
        p.reject(new HydraError('HYDRA_ERR_INTERNAL', `the body parser stopped: ${String(err)}`));
      this.#pending.clear();
    };
    worker.on('error', fail);
    worker.on('exit', (code) => fail(`exit ${code}`));
    this.#worker = worker;
    return worker;
  }

  /** Stops the worker thread; parses still pending reject. */
  async close(): Promise<void> {
    const w = this.#worker;
    this.#worker = undefined;
    await w?.terminate();
  }
}
