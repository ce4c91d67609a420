// `/v1/models` and `/v1/models/{id}` (also without `/v1`): the loaded model under its names.
import { HydraError } from '../errors.js';
import type { RouteContext, RouteModule } from './plumbing.js';

function modelObject(ctx: RouteContext): Record<string, unknown> {
  const m = ctx.engine.model?.info;
  return {
    id: ctx.modelName(),
    object: 'model',
    created: 0,
    owned_by: 'hydra-engine',
    ...(ctx.aliases.length > 1 ? { aliases: ctx.aliases } : {}),
    // The native model facts, and llama-server's meta keys (`size` is one of both).
    meta: m
      ? { ...m, n_vocab: m.nVocab, n_ctx_train: m.nCtxTrain, n_embd: m.nEmbd, n_params: m.nParams }
      : null,
  };
}

export const modelRoutes: RouteModule = (ctx) => async (req, res, _url, path) => {
  const one = /^(?:\/v1)?\/models\/(.+)$/.exec(path);
  if (one) {
    if (req.method !== 'GET') {
      ctx.methodNotAllowed(req, res);
      return true;
    }
    const id = decodeURIComponent(one[1]!);
    const known = ctx.engine.modelPath !== undefined && (id === ctx.modelName() || ctx.aliases.includes(id));
    if (!known) throw new HydraError('HYDRA_ERR_NOT_FOUND', `no model ${JSON.stringify(id)}`);
    ctx.send(res, 200, modelObject(ctx));
    return true;
  }
  if (path !== '/v1/models' && path !== '/models') return false;
  if (req.method !== 'GET') ctx.methodNotAllowed(req, res);
  else ctx.send(res, 200, { object: 'list', data: ctx.engine.modelPath ? [modelObject(ctx)] : [] });
  return true;
};
