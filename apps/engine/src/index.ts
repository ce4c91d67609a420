export { parseServeArgs, readConfigFile, type ServeArgs, type ServeSettings, usage } from './args.js';
export {
  contextParamsFrom,
  Engine,
  type EngineCounters,
  type EngineOptions,
  type EngineState,
  type FinishReason,
  type GenerationParams,
  type GenerationResult,
  modelParamsFrom,
  type SubmitOptions,
  samplerParamsFrom,
} from './engine.js';
export { ERROR_CODES, type ErrorCode, HydraError } from './errors.js';
export { generationParams, HttpApi, type HttpOptions } from './http.js';
export { renderMetrics } from './metrics.js';
export { computePlacement, formatPlacement, type Placement } from './placement.js';
export { ENGINE_VERSION, type RunningEngine, type StartOptions, startEngine, statusOf } from './serve.js';
export { type BenchResult, runBenchClient, runPlan } from './tools.js';
