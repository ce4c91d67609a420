/**
 * What every test suite of the repository shares: free loopback ports, waiting, the engine CLI as
 * a process, SSE and Prometheus parsing, the tiny synthetic model.
 */
export { freeLoopbackPort as freePort } from '@hydra-engine/native-ggml/ports';
export { errorCode } from './codes.js';
export {
  CLI,
  type EngineExit,
  type EngineGroup,
  type EngineProcess,
  engineGroup,
  REPO,
  runCli,
  type SpawnEngineOptions,
  spawnEngine,
} from './engine.js';
export { type Health, health, healthUntil, metrics, openFds, parseMetrics, rssBytes } from './metrics.js';
export { tinyModel } from './model.js';
export { RPC_SERVER, type StockRpcServer, stockRpcServer } from './rpc-server.js';
export { SseCompletion } from './sse.js';
export { sleep, waitFor } from './wait.js';
