export {
  DEFAULT_DRAIN_TIMEOUT_MS,
  type Decision,
  DeferralPolicy,
  type DeferralPolicyOptions,
  DRAIN_TIMEOUT_ENV,
  parseDrainTimeout,
} from './deferral.js';
export { ERROR_CODES, type ErrorCode, HydraError } from './errors.js';
export { ConfigLayers, type ExplainRow, type Source } from './layers.js';
export {
  type Change,
  type NormalizeOptions,
  normalize,
  type Params,
  type PlanOptions,
  type PlanResult,
  type PlanTier,
  plan,
  type Rebuild,
  sameValue,
} from './plan.js';
export {
  defaults,
  FIELDS,
  type FieldSpec,
  type FieldType,
  fieldFor,
  isRuntimeField,
  T4_PREFIXES,
  type Tier,
  type Via,
} from './registry.js';
