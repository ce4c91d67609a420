export { ERROR_CODES, type ErrorCode } from './errors.js';
export {
  gitCommit,
  machineInfo,
  machineSlug,
  newResult,
  readResults,
  repoRoot,
  resultFileName,
  resultsDir,
  writeResult,
} from './results.js';
export {
  type Anchor,
  type BenchResult,
  betterFor,
  type Figure,
  type Limit,
  type Machine,
  makeFigure,
  normalizeResult,
  SCHEMA_VERSION,
  type Skipped,
  type Sweep,
  summarize,
} from './schema.js';
