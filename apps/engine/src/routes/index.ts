// The route modules, in the order they are asked (after CORS and the API key check in http.ts).
// Each answers its own paths and returns false for the rest; a request none answers is a 404.
// Adding a module is one line here.
import { completionRoutes } from './completions.js';
import { controlRoutes } from './control.js';
import { embeddingRoutes } from './embeddings.js';
import { healthRoutes } from './health.js';
import { llamaRoutes } from './llama.js';
import { modelRoutes } from './models.js';
import type { RouteModule } from './plumbing.js';
import { responsesRoutes } from './responses.js';

export const ROUTE_MODULES: readonly RouteModule[] = [
  healthRoutes,
  controlRoutes,
  llamaRoutes,
  modelRoutes,
  completionRoutes,
  responsesRoutes,
  embeddingRoutes,
];
