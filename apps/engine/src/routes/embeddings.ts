// llama-server's embedding and rerank routes, in its shapes (tools/server of the pinned tree:
// handle_embeddings_impl, post_rerank, format_embeddings_response_oaicompat,
// format_response_rerank): /embedding and /embeddings (its native answer), /v1/embeddings
// (OpenAI's), /rerank, /reranking, /v1/rerank, /v1/reranking (Jina's, or TEI's for `texts`). The
// inputs run through the scheduler (Engine.embed): each in a free slot, between decode steps.
import type { IncomingMessage } from 'node:http';
import type { EmbedInfo, Model } from '@hydra-engine/native-ggml';
import type { Engine } from '../engine.js';
import { HydraError } from '../errors.js';
import { badRequest, type RouteContext, type RouteModule } from './plumbing.js';

const EMBED_PATHS = new Set(['/embedding', '/embeddings', '/v1/embeddings']);
const RERANK_PATHS = new Set(['/rerank', '/reranking', '/v1/rerank', '/v1/reranking']);

async function jsonBody(ctx: RouteContext, req: IncomingMessage): Promise<Record<string, unknown>> {
  const data = await ctx.readBody(req);
  let body: unknown;
  try {
    body = JSON.parse(data.length === 0 ? '{}' : data.toString('utf8'));
  } catch (err) {
    throw new HydraError('HYDRA_ERR_BAD_JSON', `the body is not JSON: ${(err as Error).message}`);
  }
  if (typeof body !== 'object' || body === null || Array.isArray(body))
    throw new HydraError('HYDRA_ERR_BAD_JSON', 'the body must be a JSON object');
  return body as Record<string, unknown>;
}

/** The serving context's embedding facts; the engine must be ready. */
function info(engine: Engine): EmbedInfo {
  engine.assertReady();
  const i = engine.embedInfo;
  if (!i) throw new HydraError('HYDRA_ERR_NO_MODEL', 'no context is serving');
  return i;
}

type Part = string | number;
const isTokenId = (v: unknown): v is number => Number.isSafeInteger(v) && (v as number) >= 0;

/**
 * The inputs as llama-server's tokenize_input_prompts splits them: a string, token ids or a mix is
 * one input; an array of those (no bare numbers) is one each.
 */
function inputParts(input: unknown, key: string): Part[][] {
  const one = (p: unknown, at: string): Part[] => {
    if (typeof p === 'string') return [p];
    if (Array.isArray(p) && p.length > 0 && p.every((x) => typeof x === 'string' || isTokenId(x))) return p;
    throw badRequest(`${at} must be a string, a list of token ids, or a list of strings and token ids`, key);
  };
  if (Array.isArray(input) && !input.some((p) => typeof p === 'number')) {
    if (input.length === 0) throw badRequest(`"${key}" must not be empty`, key);
    return input.map((p, i) => one(p, `${key}[${i}]`));
  }
  return [one(input, key)];
}

/** tokenize_mixed with add_special and parse_special on (llama-server's embedding inputs). */
async function tokenizeParts(model: Model, parts: Part[], key: string): Promise<Int32Array> {
  const nVocab = model.info.nVocab;
  const pieces: Int32Array[] = [];
  for (let i = 0; i < parts.length; i++) {
    const p = parts[i]!;
    if (typeof p === 'number') {
      if (p >= nVocab) throw badRequest(`${key} token ids must be below ${nVocab}`, key);
      pieces.push(Int32Array.of(p));
    } else pieces.push(await model.tokenizeAsync(p, { addSpecial: i === 0, parseSpecial: true }));
  }
  return concat(pieces);
}

function concat(pieces: readonly (Int32Array | readonly number[])[]): Int32Array {
  const out = new Int32Array(pieces.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of pieces) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}

function normalizeOf(body: Record<string, unknown>, engine: Engine): number {
  const v = body.embd_normalize;
  if (v === undefined || v === null) return engine.layers.get('embd_normalize') as number;
  if (!Number.isSafeInteger(v) || (v as number) < -1)
    throw new HydraError('HYDRA_ERR_BAD_VALUE', 'embd_normalize must be an integer >= -1', {
      keys: ['embd_normalize'],
    });
  return v as number;
}

function notEmbedding(engine: Engine): boolean {
  return engine.layers.get('embedding') !== true;
}

async function embeddings(
  ctx: RouteContext,
  req: IncomingMessage,
  oai: boolean,
  signal: AbortSignal,
): Promise<unknown> {
  const { engine } = ctx;
  if (notEmbedding(engine)) {
    req.resume();
    throw new HydraError(
      'HYDRA_ERR_NOT_SUPPORTED',
      'This server does not support embeddings. Start it with `--embeddings`',
    );
  }
  const body = await jsonBody(ctx, req);
  const facts = info(engine);
  if (oai && facts.poolingType === 'none')
    throw badRequest(
      "Pooling type 'none' is not OAI compatible. Please use a different pooling type",
      'pooling_type',
    );
  let key = 'input';
  if (body.input === undefined) {
    if (body.content === undefined) throw badRequest('"input" or "content" must be provided', 'input');
    // "content" is not OpenAI's: the answer takes the native shape.
    key = 'content';
    oai = false;
  }
  let base64 = false;
  if (body.encoding_format !== undefined) {
    if (body.encoding_format === 'base64') base64 = true;
    else if (body.encoding_format !== 'float')
      throw badRequest(
        'The format to return the embeddings in. Can be either float or base64',
        'encoding_format',
      );
  }
  // OpenAI's `dimensions` shortens what the client gets back: not done here, so refused unless it
  // asks for what the model gives.
  if (body.dimensions !== undefined && body.dimensions !== facts.nEmbdOut)
    throw new HydraError(
      'HYDRA_ERR_UNSUPPORTED_FIELD',
      `dimensions: the model's embeddings have ${facts.nEmbdOut}; shortening them is not implemented`,
      { keys: ['dimensions'] },
    );
  const normalize = normalizeOf(body, engine);
  const model = engine.model!;
  const inputs: Int32Array[] = [];
  for (const parts of inputParts(body[key], key)) {
    const tokens = await tokenizeParts(model, parts, key);
    if (tokens.length === 0) throw badRequest('Input content cannot be empty', key);
    inputs.push(tokens);
  }
  const rows = await engine.embed(inputs, normalize, signal);
  const n = facts.nEmbdOut;
  if (!oai) {
    return rows.map((row, index) => {
      const embedding: number[][] = [];
      // Pooled: one row; pooling none: a row per token.
      for (let at = 0; at < row.length; at += n) embedding.push(Array.from(row.subarray(at, at + n)));
      return { index, embedding };
    });
  }
  const tokens = inputs.reduce((sum, t) => sum + t.length, 0);
  return {
    model: typeof body.model === 'string' ? body.model : ctx.modelName(),
    object: 'list',
    usage: { prompt_tokens: tokens, total_tokens: tokens },
    data: rows.map((row, index) =>
      base64
        ? {
            embedding: Buffer.from(row.buffer, row.byteOffset, row.byteLength).toString('base64'),
            index,
            object: 'embedding',
            encoding_format: 'base64',
          }
        : { embedding: Array.from(row), index, object: 'embedding' },
    ),
  };
}

/** format_prompt_rerank: the GGUF's rerank template, else BOS query [EOS] [SEP] document [EOS]. */
async function rerankPrompt(model: Model, facts: EmbedInfo, query: string, doc: string): Promise<Int32Array> {
  if (facts.rerankTemplate !== null) {
    const prompt = facts.rerankTemplate.replaceAll('{query}', query).replaceAll('{document}', doc);
    return model.tokenizeAsync(prompt, { addSpecial: false, parseSpecial: true });
  }
  const q = await model.tokenizeAsync(query, { addSpecial: false, parseSpecial: false });
  const d = await model.tokenizeAsync(doc, { addSpecial: false, parseSpecial: false });
  const eos = facts.eos >= 0 ? facts.eos : facts.sep;
  const pieces: (Int32Array | number[])[] = [];
  if (facts.addBos) pieces.push([facts.bos]);
  pieces.push(q);
  if (facts.addEos) pieces.push([eos]);
  if (facts.addSep) pieces.push([facts.sep]);
  pieces.push(d);
  if (facts.addEos) pieces.push([eos]);
  return concat(pieces);
}

async function rerank(ctx: RouteContext, req: IncomingMessage, signal: AbortSignal): Promise<unknown> {
  const { engine } = ctx;
  const refuse = () =>
    new HydraError(
      'HYDRA_ERR_NOT_SUPPORTED',
      'This server does not support reranking. Start it with `--reranking`',
    );
  if (notEmbedding(engine)) {
    req.resume();
    throw refuse();
  }
  const body = await jsonBody(ctx, req);
  const facts = info(engine);
  if (facts.poolingType !== 'rank') throw refuse();
  // llama-server scores such a model with the first element of a hidden state: refused instead.
  if (!facts.hasRankHead)
    throw new HydraError(
      'HYDRA_ERR_NOT_SUPPORTED',
      '--reranking needs a model with a classification head (cls / cls_out tensors); this one has none',
    );
  // TEI's format (`texts`), else Jina's (`documents`).
  const tei = 'texts' in body;
  if (body.query === undefined) throw badRequest('"query" must be provided', 'query');
  if (typeof body.query !== 'string') throw badRequest('"query" must be a string', 'query');
  const docKey = body.documents !== undefined ? 'documents' : 'texts';
  const docs = body[docKey] ?? [];
  if (!Array.isArray(docs) || docs.length === 0 || !docs.every((d) => typeof d === 'string'))
    throw badRequest('"documents" must be a non-empty string array', docKey);
  const topN = body.top_n ?? docs.length;
  if (!Number.isSafeInteger(topN) || (topN as number) < 0)
    throw new HydraError('HYDRA_ERR_BAD_VALUE', 'top_n must be a non-negative integer', { keys: ['top_n'] });
  const returnText = body.return_text ?? false;
  if (typeof returnText !== 'boolean') throw badRequest('return_text must be a boolean', 'return_text');
  if (returnText && !tei)
    throw new HydraError(
      'HYDRA_ERR_UNSUPPORTED_FIELD',
      'return_text is part of the TEI format (send `texts`, not `documents`)',
      { keys: ['return_text'] },
    );
  const model = engine.model!;
  const inputs: Int32Array[] = [];
  for (const doc of docs as string[]) inputs.push(await rerankPrompt(model, facts, body.query, doc));
  const rows = await engine.embed(inputs, -1, signal);
  const label = tei ? 'score' : 'relevance_score';
  // The score is the first of the head's outputs (llama-server's send_rerank).
  const results = rows
    .map((row, index) => ({ index, score: row[0]! }))
    .sort((a, b) => b.score - a.score)
    .slice(0, topN as number)
    .map(({ index, score }) => ({
      index,
      [label]: score,
      ...(returnText ? { text: (docs as string[])[index] } : {}),
    }));
  if (tei) return results;
  const tokens = inputs.reduce((sum, t) => sum + t.length, 0);
  return {
    model: typeof body.model === 'string' ? body.model : ctx.modelName(),
    object: 'list',
    usage: { prompt_tokens: tokens, total_tokens: tokens },
    results,
  };
}

export const embeddingRoutes: RouteModule = (ctx) => async (req, res, _url, path) => {
  const embed = EMBED_PATHS.has(path);
  if (!embed && !RERANK_PATHS.has(path)) return false;
  if (req.method !== 'POST') {
    ctx.methodNotAllowed(req, res);
    return true;
  }
  // A client that leaves takes its queued inputs with it.
  const gone = new AbortController();
  res.once('close', () => {
    if (!res.writableFinished) gone.abort();
  });
  const answer = embed
    ? await embeddings(ctx, req, path === '/v1/embeddings', gone.signal)
    : await rerank(ctx, req, gone.signal);
  ctx.send(res, 200, answer);
  return true;
};
