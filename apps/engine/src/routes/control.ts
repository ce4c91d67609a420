// The `/control/*` routes (src/control), wired in by serve.ts as HttpOptions.control.
import type { RouteModule } from './plumbing.js';

export const controlRoutes: RouteModule = (ctx) => async (req, res, _url, path) =>
  ctx.opts.control ? ctx.opts.control(req, res, path) : false;
