export { parseServeArgs, readConfigFile, type ServeArgs, type ServeSettings, usage } from './args.js';
export {
  type ConfigureReply,
  Controller,
  type ControllerOptions,
  DEFAULT_STATE_CHUNK,
  shapeOf,
} from './control/controller.js';
export { type ControlRoutesOptions, controlRoutes, controlStatus, registerControl } from './control/wire.js';
export {
  contextParamsFrom,
  Engine,
  type EngineCounters,
  type EngineOptions,
  type EngineState,
  type ExpertMode,
  type FinishReason,
  type GenerationParams,
  type GenerationResult,
  modelParamsFrom,
  type SubmitOptions,
  samplerParamsFrom,
} from './engine.js';
export { ERROR_CODES, type ErrorCode, HydraError } from './errors.js';
export { generationParams, HttpApi, type HttpOptions } from './http.js';
export { EngineMetrics, type RequestRecord } from './metrics.js';
export { computePlacement, formatPlacement, type Placement } from './placement.js';
export { freeLoopbackPort } from './ports.js';
export { ENGINE_VERSION, type RunningEngine, type StartOptions, startEngine } from './serve.js';
export { type BenchResult, runBenchClient, runPlan } from './tools.js';
