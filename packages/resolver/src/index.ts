export {
  type CombineDelta,
  type CombineMode,
  type CombineRequest,
  EXPERT_TENSOR_REGEX,
  expertBlockRegex,
  MOE_HOST_OVERRIDES,
  resolveCombine,
} from './combine.js';
export { ERROR_CODES, type ErrorCode, HydraError } from './errors.js';
export {
  type FitDevice,
  type FitDeviceReport,
  type FitOptions,
  type FitReport,
  fitToWire,
  planFit,
} from './fit.js';
export { formatFitTable, formatPlanTable, planToJSON } from './format.js';
export {
  type GgmlTypeInfo,
  ggmlTypeById,
  ggmlTypeByName,
  ggmlTypes,
  KV_CACHE_TYPES,
  rowBytes,
} from './gguf/ggml-types.js';
export {
  type ByteReader,
  type ClosableGgufSource,
  type GgufFile,
  type GgufKv,
  type GgufScalar,
  type GgufSource,
  type GgufTensorInfo,
  GgufType,
  type GgufTypeId,
  type GgufValue,
  type ReadGgufOptions,
  readGguf,
  readGgufFrom,
} from './gguf/reader.js';
export { checkHparams, LLAMA_MAX_EXPERTS, LLAMA_MAX_LAYERS } from './model-checks.js';
export {
  type LayerFacts,
  type LayerKind,
  type ModelClass,
  type ModelFacts,
  modelClassOf,
  modelFactsFromGguf,
} from './model-facts.js';
export {
  type BindingConstraint,
  type ContextFitOptions,
  type ContextShortfall,
  contextFit,
  type DevicePlan,
  type KvPlacement,
  type MaxFraction,
  type PlanDevice,
  planSplit,
  rsRollbackArch,
  type SplitPlan,
  type SplitPlanOptions,
} from './planner.js';
export { isPeerAddress, type ModelDefaults, type ModelEntry, ModelRegistry } from './registry.js';
