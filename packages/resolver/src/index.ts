export { ERROR_CODES, type ErrorCode, HydraError } from './errors.js';
export {
  type ByteReader,
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
} from './gguf/reader.js';
export { type GgmlTypeInfo, KV_CACHE_TYPES, ggmlTypeById, ggmlTypeByName, ggmlTypes, rowBytes } from './gguf/ggml-types.js';
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
  type DevicePlan,
  type KvPlacement,
  type MaxFraction,
  type PlanDevice,
  type SplitPlan,
  type SplitPlanOptions,
  planSplit,
} from './planner.js';
export { formatPlanTable, planToJSON } from './format.js';
export { type ModelDefaults, type ModelEntry, ModelRegistry, isPeerAddress } from './registry.js';
export {
  type CombineDelta,
  type CombineMode,
  type CombineRequest,
  EXPERT_TENSOR_REGEX,
  MOE_HOST_OVERRIDES,
  resolveCombine,
} from './combine.js';
