export { Allowlist, DEFAULT_ALLOW_FROM } from './allowlist.js';
export { HydraClient, type HydraClientOptions, type RequestOptions } from './client.js';
export {
  decodePayload,
  type Encoding,
  encodeFrame,
  encodePayload,
  type Frame,
  FrameReader,
  HEADER_BYTES,
  type Payload,
} from './codec.js';
export { ERROR_CODES, type ErrorCode, HydraError } from './errors.js';
export { socketFd } from './fd.js';
export type { Logger } from './logger.js';
export {
  BINARY_FIELDS,
  GGML_RPC_HELLO,
  HYDRA_OPCODE_MAX,
  HYDRA_OPCODE_MIN,
  isHydraOpcode,
  OPCODES,
  type OpcodeName,
  opcodeName,
} from './opcodes.js';
export type { RpcHostSpec, RpcPoolStats, RpcSessionStats } from './pool.js';
export { HydraPort, type HydraPortOptions, type HydraPortStats, type NativeFdOps } from './port.js';
export type { HandlerContext, HydraHandler, HydraSessionStats } from './session.js';
export type * from './types.js';
