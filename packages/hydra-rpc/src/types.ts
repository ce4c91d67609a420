/* Request and response shapes of protocol.md, "Opcodes". Responses list the fields besides `success`. */

/** A device as HELLO and STATUS report it. */
export interface DeviceInfo {
  name: string;
  description: string;
  free: number;
  total: number;
  [extra: string]: unknown;
}

export interface HelloRequest {
  client?: string;
}
export interface HelloResponse {
  protocol: 1;
  engine: { name: string; version: string };
  ggml_rpc: { major: number; minor: number; patch: number };
  opcodes: number[];
  devices: DeviceInfo[];
}

export type StatusRequest = Record<string, never>;
export interface StatusResponse {
  state: 'empty' | 'loading' | 'ready' | 'draining' | 'error';
  model: ({ path: string; arch: string; n_layer: number } & Record<string, unknown>) | null;
  mode: 'solo' | 'combined';
  epoch: number;
  applied: Record<string, unknown>;
  deferred_keys: string[];
  slots: { total: number; busy: number };
  devices: DeviceInfo[];
}

/** A delta of llama.cpp `common_params`, nested or dotted (protocol.md, "CONFIGURE"). */
export type ConfigureRequest = Record<string, unknown>;
export type Tier = 'none' | 'T1' | 'T2' | 'T3';
export interface ConfigureResponse {
  tier: Tier;
  params_applied: Record<string, unknown>;
  deferred_keys: string[];
  epoch: number;
  state_chunk_size_applied?: number;
}

export type PlanRequest = ConfigureRequest;
export interface PlanResponse {
  tier: Tier;
  changes: { key: string; from: unknown; to: unknown; tier: Tier }[];
  rebuild: 'none' | 'sampler' | 'context' | 'model';
}

export interface StateGetRequest {
  slot?: number;
  offset?: number;
  chunk_size?: number;
}
export interface StateGetResponse {
  total: number;
  offset: number;
  data: Uint8Array;
}

export interface StatePutRequest {
  slot?: number;
  offset: number;
  total: number;
  data: Uint8Array;
}
export interface StatePutResponse {
  received: number;
  complete: boolean;
}

export interface SetExpertModeRequest {
  mode: 'solo' | 'combined';
}
export interface SetExpertModeResponse {
  mode: 'solo' | 'combined';
  previous: 'solo' | 'combined';
  switch_ms: number;
  reloaded: false;
}

export interface SwapQuantRequest {
  model: string;
}
export type SwapQuantResponse = ConfigureResponse;

export type PipelineAttachRequest = Record<string, unknown>;
/** PIPELINE_ATTACH is retired: it always fails with HYDRA_ERR_RETIRED. */
export type PipelineAttachResponse = Record<string, never>;

/** Request shape per opcode name, as a client sends it. */
export interface HydraRequests {
  HELLO: HelloRequest;
  STATUS: StatusRequest;
  CONFIGURE: ConfigureRequest;
  PLAN: PlanRequest;
  STATE_GET: StateGetRequest;
  STATE_PUT: StatePutRequest;
  SET_EXPERT_MODE: SetExpertModeRequest;
  SWAP_QUANT: SwapQuantRequest;
  PIPELINE_ATTACH: PipelineAttachRequest;
}

/** Response shape (besides `success`) per opcode name. */
export interface HydraResponses {
  HELLO: HelloResponse;
  STATUS: StatusResponse;
  CONFIGURE: ConfigureResponse;
  PLAN: PlanResponse;
  STATE_GET: StateGetResponse;
  STATE_PUT: StatePutResponse;
  SET_EXPERT_MODE: SetExpertModeResponse;
  SWAP_QUANT: SwapQuantResponse;
  PIPELINE_ATTACH: PipelineAttachResponse;
}

/** The error object of a failed response. */
export interface WireError {
  code: string;
  message: string;
  keys?: string[];
  details?: Record<string, unknown>;
}
